#!/usr/bin/env bash
# Installs, with apt, whatever kvo needs that this Debian 12 machine lacks. Idempotent: when every
# package is already there it changes nothing and touches no network.
set -euo pipefail

PACKAGES=(
  # toolchain
  g++ cmake ninja-build pkg-config git clang clang-format clang-tidy libclang-rt-14-dev lld
  # libraries (see README "Dependencies")
  libzmq3-dev cppzmq-dev libmsgpack-cxx-dev libboost-dev libspdlog-dev libfmt-dev libcli11-dev
  nlohmann-json3-dev libssl-dev libsqlite3-dev libxxhash-dev libgtest-dev libgmock-dev
  libcpp-httplib-dev
  # Python references used by tests and benchmark baselines (Debian's /usr/bin/python3)
  python3 python3-msgpack python3-cbor2 python3-xxhash python3-zmq
  # the Python package (python/): extension build and its pytest tests
  python3-dev pybind11-dev python3-numpy python3-pytest
  # the indexer's operator page test (headless; the test skips when it is absent)
  chromium
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "kvo: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
