#!/usr/bin/env python3
"""The shape of the source tree, as docs/ARCHITECTURE.md promises it: functions of at most 80 lines (the GEMM
micro-kernels excepted), no include loop between units (a header and its source count as one unit), and the
environment read in one place. Prints what breaks a rule and exits 1 when something does; --report prints the
counts whatever they are. Run by ctest (code_shape) and by hand: python3 scripts/code_shape.py [--report] [ROOT]

A function is counted from the line its signature starts on to the line of its closing brace. The parse is a
brace matcher over the text with comments, strings and preprocessor lines removed: good enough for this tree's
style (one definition per brace at namespace or class scope), not a C++ parser."""
import os
import re
import sys

MAX_LINES = 80
SOURCE_DIRS = ("src", "include", "tools")
EXTENSIONS = (".cpp", ".h", ".cu", ".cuh")
# The GEMM micro-kernels: unrolled register tiles whose length is their point (STYLE.md, habit 7's exception).
MICRO_KERNEL_FILES = re.compile(r"^src/kernels/cpu/gemm_[a-z0-9_]+\.(cpp|h)$")
# The one place that reads the process environment (include/mixtrain/core/environment.h lists every variable).
ENVIRONMENT_FILE = "src/core/environment.cpp"

CONTROL = re.compile(r"^(if|for|while|switch|catch|do|else|return|try)\b")
SCOPE_KEYWORDS = re.compile(r"\b(namespace|class|struct|union|enum)\b")


def strip_code(text):
    """Text with comments, string and character literals and preprocessor lines blanked, newlines kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == 'R' and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i)
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum() and i + 1 < n and text[i + 1].isalnum():
                out.append(" ")  # a digit separator: 1'000'000
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    lines = "".join(out).split("\n")
    cleaned, continued = [], False
    for line in lines:
        is_pp = continued or line.lstrip().startswith("#")
        continued = is_pp and line.rstrip().endswith("\\")
        cleaned.append("" if is_pp else line)
    return cleaned


def functions(path):
    """(name, first line, last line) of every function body at namespace or class scope."""
    lines = strip_code(open(path, encoding="utf-8", errors="replace").read())
    found = []
    stack = []  # one entry per open brace: ("scope" | "function" | "other", name, first line)
    header, header_line = "", None
    for number, line in enumerate(lines, 1):
        for c in line:
            if c == "{":
                in_function = any(kind == "function" for kind, _, _ in stack)
                text = " ".join(header.split())
                kind, name = "other", ""
                if not in_function:
                    if SCOPE_KEYWORDS.search(text) and "(" not in text.split("{")[0].split(":")[0]:
                        kind = "scope"
                    elif text.startswith("extern"):
                        kind = "scope"
                    elif ")" in text and not CONTROL.match(text) and not text.endswith("=") and "=" not in text.split("(")[0]:
                        kind = "function"
                        m = re.search(r"([~\w:]+(?:operator\s*\S+?)?)\s*\(", text)
                        name = m.group(1) if m else text[:40]
                    elif text == "" and stack and stack[-1][0] == "scope":
                        kind = "other"
                stack.append((kind, name, header_line or number))
                header, header_line = "", None
            elif c == "}":
                if stack:
                    kind, name, first = stack.pop()
                    if kind == "function":
                        found.append((name, first, number))
                header, header_line = "", None
            elif c == ";":
                if not any(kind == "function" for kind, _, _ in stack):
                    header, header_line = "", None
            else:
                if not c.isspace() and header_line is None:
                    header_line = number
                header += c
        header += " "
    return found


def source_files(root):
    for top in SOURCE_DIRS:
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for name in sorted(names):
                if name.endswith(EXTENSIONS):
                    yield os.path.relpath(os.path.join(dirpath, name), root)


def unit_of(path):
    """A header and its source are one unit: include/mixtrain/x/y.h and src/x/y.cpp are both x/y."""
    p = re.sub(r"^include/mixtrain/", "", path)
    p = re.sub(r"^src/", "", p)
    return os.path.splitext(p)[0]


def include_loops(root, files):
    include = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
    known = {unit_of(f) for f in files}
    edges = {}
    for f in files:
        u = unit_of(f)
        for target in include.findall(open(os.path.join(root, f), encoding="utf-8", errors="replace").read()):
            candidates = [re.sub(r"^mixtrain/", "", os.path.splitext(target)[0]),
                          os.path.normpath(os.path.join(os.path.dirname(u), os.path.splitext(target)[0]))]
            for v in candidates:
                if v in known and v != u:
                    edges.setdefault(u, set()).add(v)
                    break
    # Tarjan's strongly connected components; a component of more than one unit is a loop.
    index, low, on_stack, stack, loops, counter = {}, {}, set(), [], [], [0]

    def visit(u):
        index[u] = low[u] = counter[0]
        counter[0] += 1
        stack.append(u)
        on_stack.add(u)
        for v in sorted(edges.get(u, ())):
            if v not in index:
                visit(v)
                low[u] = min(low[u], low[v])
            elif v in on_stack:
                low[u] = min(low[u], index[v])
        if low[u] == index[u]:
            component = []
            while True:
                v = stack.pop()
                on_stack.discard(v)
                component.append(v)
                if v == u:
                    break
            if len(component) > 1:
                loops.append(sorted(component))

    sys.setrecursionlimit(10000)
    for u in sorted(known):
        if u not in index:
            visit(u)
    return loops


def main(argv):
    report = "--report" in argv
    args = [a for a in argv if not a.startswith("--")]
    root = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    files = list(source_files(root))
    long_functions = []
    for f in files:
        for name, first, last in functions(os.path.join(root, f)):
            length = last - first + 1
            if length > MAX_LINES and not MICRO_KERNEL_FILES.match(f):
                long_functions.append((length, f, first, name))
    loops = include_loops(root, files)
    getenv_sites = []
    for f in files:
        for number, line in enumerate(strip_code(open(os.path.join(root, f), encoding="utf-8", errors="replace").read()), 1):
            if re.search(r"\b(std::)?(secure_)?getenv\s*\(", line):
                getenv_sites.append((f, number))
    env_files = sorted({f for f, _ in getenv_sites})
    # Kernel tables or backend registrations outside ops: every road into compute goes through ops/.
    outside_ops = []
    for f in files:
        if f.startswith(("src/ops/", "include/mixtrain/ops/")):
            continue
        text = "\n".join(strip_code(open(os.path.join(root, f), encoding="utf-8", errors="replace").read()))
        if re.search(r"\bKernelTable\s*<|\bregister_\w+_kernels\s*\(|:\s*public\s+(ops::)?Backend\b", text):
            outside_ops.append(f)
    problems = 0
    for length, f, first, name in sorted(long_functions, reverse=True):
        print(f"{f}:{first}: {name} has {length} lines (at most {MAX_LINES} outside the GEMM micro-kernels)")
        problems += 1
    for loop in loops:
        print("include loop: " + " -> ".join(loop) + " -> " + loop[0])
        problems += 1
    for f in env_files:
        if f != ENVIRONMENT_FILE:
            lines = ", ".join(str(n) for g, n in getenv_sites if g == f)
            print(f"{f}:{lines}: reads the environment (only {ENVIRONMENT_FILE} may)")
            problems += 1
    for f in outside_ops:
        print(f"{f}: holds a kernel table or a backend (only src/ops may)")
        problems += 1
    if report or problems:
        print(f"functions over {MAX_LINES} lines outside the micro-kernels: {len(long_functions)}; include loops: "
              f"{len(loops)}; files that read the environment: {len(env_files)}; files outside ops with kernel tables "
              f"or backends: {len(outside_ops)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
