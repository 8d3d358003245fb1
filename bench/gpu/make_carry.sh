#!/bin/bash
# Run on the build machine (Debian, CUDA toolkit, kvo's build dependencies): makes .device/carry,
# what bench/gpu/build_ext.sh needs on the GPU machine, which has Python 3.12 + torch + pybind11 +
# g++ but none of kvo's Debian dependencies:
#   lib/      kvo's static libraries (-fPIC; the CUDA engine, sm_90 SASS + PTX) and libcudart_static.a,
#             the shared libraries the extension links (xxhash, crypto, spdlog, fmt)
#   src/      the snapshot (git HEAD) the libraries were built from: kvo's headers,
#             python/src/ (the module's sources), the Python package and the vLLM stand-in
#   pyinc/    Python 3.12 headers (used only when the GPU machine's interpreter has none)
# .device/ is git-ignored; name .device/carry in the device call's `carry`.
set -eu -o pipefail
cd "$(dirname "$0")/../.."
S=.device/snap
C=.device/carry
rm -rf "$S" "$C"
mkdir -p "$S" "$C/lib" "$C/src" "$C/pyinc"
git archive HEAD | tar -x -C "$S"
[ -f /work/ccache.env ] && . /work/ccache.env
# ENGINE_TEST=1 also builds the CUDA engine's gtest binary into bin/ (it needs only the four shared
# libraries below; run_on_device.sh STEPS=enginetest runs it on the GPU).
TESTS=OFF; TARGETS=_kvo
if [ "${ENGINE_TEST:-0}" = 1 ]; then TESTS=ON; TARGETS="_kvo transfer_cuda_cuda_engine_test"; fi
cmake -S "$S" -B "$S/build/gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVO_BUILD_TESTS=$TESTS \
  -DKVO_BUILD_BENCH=OFF -DPython3_EXECUTABLE=/usr/bin/python3 >/dev/null
cmake --build "$S/build/gpu" --target $TARGETS -j"${JOBS:-2}"
B=$S/build/gpu
cp $B/manager/libkvo_manager.a $B/transfer/libkvo_transfer.a $B/events/libkvo_events.a \
   $B/common/libkvo_common.a $B/transfer/cuda/libkvo_transfer_cuda.a "$C/lib/"
cp "$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")/lib/libcudart_static.a" \
   "$C/lib/" 2>/dev/null || cp /usr/local/cuda/lib64/libcudart_static.a "$C/lib/"
if [ "$TESTS" = ON ]; then
  mkdir -p "$C/bin" && cp "$S/build/gpu/tests/transfer_cuda_cuda_engine_test" "$C/bin/"
fi
for l in libxxhash.so.0 libcrypto.so.3 libspdlog.so.1.10 libfmt.so.9; do
  cp -L /lib/x86_64-linux-gnu/$l "$C/lib/"
  ln -sf $l "$C/lib/${l%%.so*}.so"
done
(cd "$S" && find common events transfer manager -name "*.h" -exec cp --parents {} "../carry/src/" \; \
  && cp -r --parents python/src python/kvo python/tests/standin ../carry/src/)
find "$C/src" -name __pycache__ -prune -exec rm -rf {} \;
PY312=$(ls -d /root/.pyenv/versions/3.12*/include/python3.12 2>/dev/null | head -1 || true)
[ -n "$PY312" ] && cp -r "$PY312" "$C/pyinc/"
du -sh "$C"
