#!/usr/bin/env python3
"""What clang-tidy must look at, for scripts/clang_tidy.sh.

clang-tidy's verdict on a file is a function of its inputs: the clang-tidy binary, the .clang-tidy
configuration, the compile flags, and the file with every header it includes. This script names
those inputs by one SHA-256 per file (the key): the binary's --version (less its "Host CPU" line),
.clang-tidy, the compile command without its output path, and the preprocessed translation unit
with comments and macro definitions kept (`-E -C -dD`, so a NOLINT comment, a macro no file
expands or a header change all change it), the repository's absolute path replaced so a clone
elsewhere gets the same keys. A file whose key is in the record (.clang-tidy-clean, written only
after a run without a finding) was found clean with exactly these inputs, and clang-tidy would
say the same again.

  tidy_inputs.py plan BUILD_DIR OUT_DIR RECORD FILE...
      writes OUT_DIR/compile_commands.json (FILE's commands, without the precompiled header, which
      would hide a missing #include from clang-tidy) and OUT_DIR/keys, and prints the files whose
      key is not in RECORD (all of them when RECORD is '-').
  tidy_inputs.py record OUT_DIR RECORD
      writes the plan's keys into RECORD (run after a clean run): one line per file, key and path;
      lines of files outside the plan are kept while the file exists.
"""
import concurrent.futures
import hashlib
import json
import os
import shlex
import subprocess
import sys


def drop(args, width):
    """args without the runs width(args, i) > 0 says start at i (and are that long)."""
    out = []
    i = 0
    while i < len(args):
        n = width(args, i)
        if n:
            i += n
        else:
            out.append(args[i])
            i += 1
    return out


def strip_pch(args):
    """The command without CMake's precompiled-header arguments (clang: -Xclang -include-pch
    -Xclang PCH -Xclang -include -Xclang HEADER)."""
    return drop(args, lambda a, i: 4 if (a[i] == "-Xclang" and i + 3 < len(a) and a[i + 2] == "-Xclang"
                                         and a[i + 1] in ("-include-pch", "-include")) else 0)


def without_output(args):
    return drop(args, lambda a, i: 2 if a[i] == "-o" and i + 1 < len(a) else 0)


def key_of(root, prefix, entry):
    args = without_output(entry["arguments"])
    pre = subprocess.run(args[:1] + ["-E", "-C", "-dD", "-o", "-"] + args[1:], cwd=entry["directory"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)
    if pre.returncode != 0:
        return None  # clang-tidy will report the error itself
    h = hashlib.sha256(prefix)
    rel = os.path.relpath(entry["file"], root)
    for part in (rel, " ".join(args).replace(root, "<root>")):
        h.update(part.encode() + b"\0")
    h.update(pre.stdout.replace(root.encode(), b"<root>"))
    return h.hexdigest()


def plan(build, out_dir, record, files):
    root = os.path.realpath(os.getcwd())
    with open(os.path.join(build, "compile_commands.json"), encoding="utf-8") as f:
        db = {os.path.realpath(e["file"]): e for e in json.load(f)}
    entries = []
    for path in files:
        e = dict(db[os.path.realpath(path)])
        args = e.pop("arguments", None) or shlex.split(e.pop("command"))
        if os.path.basename(args[0]) in ("ccache", "sccache"):  # a launcher changes nothing here
            args = args[1:]
        e["arguments"] = strip_pch(args)
        entries.append(e)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "compile_commands.json"), "w", encoding="utf-8") as f:
        json.dump(entries, f, indent=1)
    # The version without its "Host CPU" line (the machine's, not the program's).
    version = b"".join(line for line in subprocess.run(
        ["clang-tidy", "--version"], stdout=subprocess.PIPE, check=True).stdout.splitlines(True)
                       if b"Host CPU" not in line)
    config = b""
    for name in sorted(subprocess.run(["git", "ls-files", "*.clang-tidy", ".clang-tidy"],
                                      stdout=subprocess.PIPE, check=True).stdout.split()):
        with open(name, "rb") as f:
            config += name + b"\0" + f.read() + b"\0"
    prefix = version + b"\0" + config
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        keys = list(pool.map(lambda e: key_of(root, prefix, e), entries))
    known = set()
    if record != "-" and os.path.exists(record):
        with open(record, encoding="utf-8") as f:
            known = {line.split()[0] for line in f if line.strip() and not line.startswith("#")}
    with open(os.path.join(out_dir, "keys"), "w", encoding="utf-8") as f:
        for e, k in zip(entries, keys):
            f.write(f"{k or '-'} {os.path.relpath(e['file'], root)}\n")
    for e, k in zip(entries, keys):
        if k is None or k not in known:
            print(e["file"])


def write_record(out_dir, record):
    """RECORD with this plan's keys: its files' lines replaced, other files' lines kept while
    those files exist."""
    rows = {}
    if os.path.exists(record):
        with open(record, encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2 and not line.startswith("#") and os.path.exists(parts[1]):
                    rows[parts[1]] = parts[0]
    with open(os.path.join(out_dir, "keys"), encoding="utf-8") as f:
        for line in f:
            key, path = line.split()
            if key == "-":
                rows.pop(path, None)
            else:
                rows[path] = key
    with open(record, "w", encoding="utf-8") as f:
        f.write("# Written by scripts/clang_tidy.sh after a run without a finding: the SHA-256 of each\n"
                "# file's clang-tidy inputs (scripts/tidy_inputs.py). A file whose inputs are listed\n"
                "# here is not tidied again; `scripts/clang_tidy.sh --all` ignores this file.\n")
        for path in sorted(rows):
            f.write(f"{rows[path]} {path}\n")


def main():
    if len(sys.argv) >= 5 and sys.argv[1] == "plan":
        plan(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:])
    elif len(sys.argv) == 4 and sys.argv[1] == "record":
        write_record(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
