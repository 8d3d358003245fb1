#!/usr/bin/env bash
# The module boundary check (CI, < 1 s): fails on an include of another module's internal header.
#
# The rule. Every header of a library is public (any module may include it) except the internal
# ones, marked by their path:
#   - a header named `*_internal.h` is internal to its directory (indexer/indexer_internal.h is
#     internal to indexer/, transfer/cuda/cuda_internal.h to transfer/cuda/);
#   - a header under a directory `internal/` is internal to the directory that holds `internal/`
#     (indexer/internal/memory_index.h is internal to indexer/).
# An internal header may be included by the files of the directory it is internal to (and of its
# subdirectories), and by the tests of that module: the files under tests/<top-level folder>/
# (tests/indexer/ may include indexer's internals; tests/faults/, tests/fuzz/ and the other
# modules may not). Everything else goes through the module's public headers.
#
# Nested libraries. A directory with its own CMakeLists.txt inside another module's directory is
# a library of its own that depends on the outer one (indexer/service/, kvo_indexer_service, on
# indexer/, kvo_indexer): it uses the outer library's public headers only (not its internals),
# and the outer library never includes the nested one's headers (the dependency goes one way).
#
# Usage: scripts/check_includes.sh   (from anywhere in the repository; exit 1 on a violation)
set -euo pipefail
cd "$(dirname "$0")/.."

# The library directories: every directory with a CMakeLists.txt but the root.
libs=$(git ls-files '*/CMakeLists.txt' | sed 's#/CMakeLists.txt$##' | tr '\n' ' ')

git ls-files -z '*.h' '*.cc' '*.cu' '*.cuh' |
  xargs -0 grep -HnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[^"]+"' 2>/dev/null |
  awk -v libs="$libs" '
    BEGIN { nlibs = split(libs, lib, " ") }
    # The library a path belongs to: the longest library directory holding it ("" for none).
    function libof(path,   i, best) {
      best = ""
      for (i = 1; i <= nlibs; i++) {
        if (index(path, lib[i] "/") == 1 && length(lib[i]) > length(best)) best = lib[i]
      }
      return best
    }
    {
      file = $0; sub(/:.*/, "", file)
      rest = substr($0, length(file) + 2)
      line = rest; sub(/:.*/, "", line)
      header = rest; sub(/^[^"]*"/, "", header); sub(/".*/, "", header)
      flib = libof(file); hlib = libof(header)
      if (flib != "" && index(hlib, flib "/") == 1) {
        printf "%s:%s: includes \"%s\" of %s/, a library nested in %s/ that depends on it (the dependency goes one way)\n", file, line, header, hlib, flib
        bad++
        next
      }
      owner = ""
      if (header ~ /\/internal\//) {
        owner = header; sub(/\/internal\/.*/, "", owner)
      } else if (header ~ /_internal\.h$/ && header ~ /\//) {
        owner = header; sub(/\/[^\/]*$/, "", owner)
      }
      if (owner == "") next
      if (index(file, owner "/") == 1) {
        if (flib == libof(owner "/")) next
        printf "%s:%s: includes \"%s\", internal to %s/ (%s/ is a library of its own: use the public headers)\n", file, line, header, owner, flib
        bad++
        next
      }
      top = owner; sub(/\/.*/, "", top)
      if (index(file, "tests/" top "/") == 1) next
      printf "%s:%s: includes \"%s\", internal to %s/ (use its public headers)\n", file, line, header, owner
      bad++
    }
    END {
      if (bad) {
        printf "check_includes: %d include(s) of another module'"'"'s internal header\n", bad
        exit 1
      }
    }'
echo "check_includes: no include of another module's internal header"
