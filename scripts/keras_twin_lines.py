#!/usr/bin/env python3
"""Counts the lines of each program in examples/keras_twins/ against its Keras twin, kept in the program's comment.

A line is one that holds code: blank lines and comment-only lines are not counted, in either language; the C++
program's includes and the Python program's imports are. Prints one row per program and fails when a program has
no twin, or when its ratio passes --limit (a program that grew past what a Keras user would accept).
Usage: keras_twin_lines.py [--limit 1.5] FILE.cpp ...
"""
import argparse
import sys

START, END = "// keras-twin:", "// end-keras-twin"


def counts(path):
    lines = open(path, encoding="utf-8").read().splitlines()
    if START not in lines or END not in lines:
        raise ValueError(f"{path}: no Keras twin between '{START}' and '{END}'")
    a, b = lines.index(START), lines.index(END)
    twin = [l[2:].strip() for l in lines[a + 1:b]]
    keras = sum(1 for l in twin if l and not l.startswith("#"))
    cpp = sum(1 for l in lines[b + 1:] if l.strip() and not l.strip().startswith("//"))
    return keras, cpp


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=float, default=1.5)
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    failed = False
    for path in args.files:
        try:
            keras, cpp = counts(path)
        except ValueError as e:
            print(f"FAIL: {e}")
            failed = True
            continue
        ratio = cpp / keras
        print(f"{path.split('/')[-1]}: Keras {keras} lines, C++ {cpp} lines, {ratio:.2f}x")
        if ratio > args.limit:
            print(f"FAIL: {path} is {ratio:.2f}x its Keras twin's lines, over the limit of {args.limit}x")
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
