#!/usr/bin/env python3
"""scripts/code_shape.py on small trees with known faults: each fault is named by file and line and fails the run;
a tree without them passes. Usage: code_shape_test.py SCRIPT"""
import os
import subprocess
import sys
import tempfile

script = sys.argv[1]


def run(tree):
    with tempfile.TemporaryDirectory() as root:
        for path, text in tree.items():
            os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
            with open(os.path.join(root, path), "w") as f:
                f.write(text)
        p = subprocess.run([sys.executable, script, root], capture_output=True, text=True)
        return p.returncode, p.stdout + p.stderr


def expect(cond, what, out):
    if not cond:
        print("FAIL:", what, "\n", out)
        sys.exit(1)


body = "".join(f"  x += {i};\n" for i in range(79))
body76 = "".join(f"  x += {i};\n" for i in range(76))  # with its signature, two statements and the brace: 80 lines
clean = {
    "src/a/a.cpp": '#include "mixtrain/a/a.h"\n// a comment with { and "\nint f(int x) {\n' + body76 +
                   '  const char* s = "}{";\n  return x + (s != nullptr);\n}\n',
    "include/mixtrain/a/a.h": "#pragma once\nint f(int x);\n",
    "src/core/environment.cpp": '#include <cstdlib>\nconst char* home() { return std::getenv("HOME"); }\n',
    "src/kernels/cpu/gemm_x.cpp": "void micro() {\n" + body * 2 + "}\n",
}
code, out = run(clean)
expect(code == 0, "a clean tree passes", out)

long_function = dict(clean)
long_function["src/b/b.cpp"] = "namespace n {\nstruct S {\n  int g(int x) const {\n" + body + "    return x;\n  }\n};\n}\n"
code, out = run(long_function)
expect(code == 1 and "src/b/b.cpp:3: g has 82 lines" in out, "a long method is named", out)

loop = dict(clean)
loop["src/c/c.cpp"] = '#include "mixtrain/c/d.h"\n'
loop["include/mixtrain/c/c.h"] = "#pragma once\n"
loop["src/c/d.cpp"] = '#include "mixtrain/c/c.h"\n'
loop["include/mixtrain/c/d.h"] = "#pragma once\n"
code, out = run(loop)
expect(code == 1 and "include loop: c/c -> c/d -> c/c" in out, "a loop between two units is named", out)

env = dict(clean)
env["src/d/d.cpp"] = '#include <cstdlib>\nint f() {\n  return std::getenv("X") != nullptr;\n}\n'
code, out = run(env)
expect(code == 1 and "src/d/d.cpp:3: reads the environment" in out, "a second reader of the environment is named", out)

table = dict(clean)
table["src/optim/t.cpp"] = "ops::KernelTable<Fn> t;\n"
code, out = run(table)
expect(code == 1 and "src/optim/t.cpp: holds a kernel table" in out, "a kernel table outside ops is named", out)
print("ok")
