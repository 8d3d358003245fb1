#!/usr/bin/env bash
# The main job: install what is missing, build (release), run the KV-event bus demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
# Warnings are not errors here: CI builds with clang (-Werror), and a user's gcc may warn about
# something new without the demo failing to build.
cmake --preset release -DKVO_WERROR=OFF >/dev/null
cmake --build --preset release --target kvo
exec ./build/release/tools/kvo demo "$@"
