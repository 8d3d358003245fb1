#!/usr/bin/env bash
# The main job: install what is missing, build (release), run the KV-event bus demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake --preset release >/dev/null
cmake --build --preset release --target kvo
exec ./build/release/tools/kvo demo "$@"
