#!/usr/bin/env python3
"""Checks that the README's first program is examples/first_program/main.cpp, which the tests build and run.

The README shows the program from its first #include to its end (the file's leading comment is the example's own);
a README edited without the program, or the program without the README, fails here with the first line that differs.
Usage: readme_program_check.py README.md examples/first_program/main.cpp
"""
import re
import sys


def main(readme_path, program_path):
    readme = open(readme_path, encoding="utf-8").read()
    program = open(program_path, encoding="utf-8").read()
    body = program[program.index("#include"):].rstrip("\n")
    blocks = re.findall(r"```cpp\n(.*?)\n```", readme, re.S)
    shown = [b for b in blocks if "int main()" in b]
    if not shown:
        print(f"FAIL: {readme_path} shows no C++ block with int main() (expected {program_path})")
        return 1
    if shown[0] == body:
        return 0
    for number, (a, b) in enumerate(zip(shown[0].splitlines(), body.splitlines()), 1):
        if a != b:
            print(f"FAIL: line {number} of the README's program differs from {program_path}:\n  README: {a}\n  file:   {b}")
            return 1
    print(f"FAIL: the README's program and {program_path} differ in length")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
