#!/usr/bin/env python3
"""scripts/tidy_inputs.py: a file is tidied again exactly when one of its inputs changed.

A throwaway repository (git, .clang-tidy, two sources, a header one of them includes, a compile
database whose commands carry CMake's precompiled-header arguments) is planned, recorded and
changed one input at a time; each plan must list exactly the files whose inputs changed. Run by
ctest with the repository's scripts/tidy_inputs.py as argv[1].
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

SCRIPT = os.path.abspath(sys.argv[1])


def write(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def make_repo(root):
    os.makedirs(os.path.join(root, "build"))
    write(os.path.join(root, ".clang-tidy"), "Checks: '-*,readability-container-size-empty'\n")
    write(os.path.join(root, "a.h"), "// a header\n#define KVO_A 1\ninline int A() { return KVO_A; }\n")
    write(os.path.join(root, "a.cc"), '#include "a.h"\nint UseA() { return A(); }\n')
    write(os.path.join(root, "b.cc"), "int B() { return 2; }\n")
    subprocess.run(["git", "init", "-q", root], check=True)
    subprocess.run(["git", "-C", root, "add", "."], check=True)
    database(root, extra="")


def database(root, extra):
    entries = []
    for name in ("a.cc", "b.cc"):
        entries.append({
            "directory": os.path.join(root, "build"),
            "command": (f"/usr/bin/clang++ -I{root} -std=c++20{extra} -Xclang -include-pch -Xclang "
                        f"{root}/build/cmake_pch.hxx.pch -Xclang -include -Xclang {root}/build/cmake_pch.hxx "
                        f"-o {name}.o -c {root}/{name}"),
            "file": os.path.join(root, name),
        })
    write(os.path.join(root, "build", "compile_commands.json"), json.dumps(entries))


def plan(root, record=".clang-tidy-clean"):
    out = subprocess.run([sys.executable, SCRIPT, "plan", "build", "work", record, "a.cc", "b.cc"],
                         cwd=root, stdout=subprocess.PIPE, check=True, text=True).stdout
    return sorted(os.path.basename(line) for line in out.split())


def record(root):
    subprocess.run([sys.executable, SCRIPT, "record", "work", ".clang-tidy-clean"], cwd=root,
                   check=True)


def expect(what, got, want):
    if got != want:
        sys.exit(f"FAIL {what}: plan lists {got}, expected {want}")
    print(f"ok   {what}: {got}")


def main():
    tmp = tempfile.mkdtemp(prefix="tidy-inputs-")
    try:
        root = os.path.join(tmp, "repo")
        make_repo(root)
        expect("no record", plan(root), ["a.cc", "b.cc"])
        with open(os.path.join(root, "work", "compile_commands.json"), encoding="utf-8") as f:
            commands = json.dumps(json.load(f))
        if "include-pch" in commands or "cmake_pch" in commands:
            sys.exit("FAIL the planned compile commands keep the precompiled header")
        record(root)
        expect("recorded, nothing changed", plan(root), [])
        expect("'-' ignores the record", plan(root, "-"), ["a.cc", "b.cc"])

        # The same repository at another path: the same keys.
        moved = os.path.join(tmp, "elsewhere", "clone")
        shutil.copytree(root, moved)
        database(moved, extra="")
        expect("a clone at another path", plan(moved), [])

        # A comment (NOLINT lives in comments) in the header a.cc includes: a.cc only.
        with open(os.path.join(root, "a.h"), "a", encoding="utf-8") as f:
            f.write("// NOLINT(readability-container-size-empty)\n")
        expect("a comment in an included header", plan(root), ["a.cc"])
        record(root)
        expect("recorded again", plan(root), [])

        # A macro no file expands (a check may read its definition): a.cc only.
        with open(os.path.join(root, "a.h"), "a", encoding="utf-8") as f:
            f.write("#define KVO_UNUSED(x) x * 2\n")
        expect("an unexpanded macro in an included header", plan(root), ["a.cc"])
        record(root)

        # A flag: every file whose command has it.
        database(root, extra=" -Wshadow")
        expect("a compile flag", plan(root), ["a.cc", "b.cc"])
        database(root, extra="")
        expect("the flag gone again", plan(root), [])

        # The checks: every file.
        with open(os.path.join(root, ".clang-tidy"), "a", encoding="utf-8") as f:
            f.write("WarningsAsErrors: '*'\n")
        expect("the checks", plan(root), ["a.cc", "b.cc"])

        # A file that cannot be preprocessed (a missing header) is always listed (clang-tidy
        # reports the error) and never recorded.
        write(os.path.join(root, "b.cc"), '#include "missing.h"\nint B() { return 2; }\n')
        expect("a missing header, the checks changed", plan(root), ["a.cc", "b.cc"])
        record(root)
        expect("a missing header", plan(root), ["b.cc"])
        with open(os.path.join(root, ".clang-tidy-clean"), encoding="utf-8") as f:
            if "b.cc" in f.read():
                sys.exit("FAIL a file that cannot be preprocessed was recorded clean")
        print("ok   a file that cannot be preprocessed is not recorded")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
