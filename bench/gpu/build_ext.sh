#!/bin/bash
# Builds kvo's Python extension (kvo._kvo, with the CUDA engine) for the interpreter $PY (default
# python3) from .device/carry (made by bench/gpu/make_carry.sh on the build machine): kvo's static
# libraries (-fPIC, CUDA engine included, cudart static), the shared libraries they need, and the
# source snapshot they were built from. Only python/src/kvo_module.cc is compiled here, with this
# interpreter's headers and pybind11. Output: $DEST/kvo/_kvo<EXT_SUFFIX> (default build/dev/python).
set -eu -o pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
C=$PWD/.device/carry
DEST=${DEST:-$PWD/build/dev/python}
EXT=$($PY -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
PYINC=$($PY -c "import sysconfig; print(sysconfig.get_paths()['include'])")
if [ ! -f "$PYINC/Python.h" ]; then  # no development headers: the carried ones (same minor)
  PYINC=$C/pyinc/python$($PY -c "import sys; print('%d.%d' % sys.version_info[:2])")
fi
PB=$($PY -c "import pybind11; print(pybind11.get_include())" 2>/dev/null || echo /usr/include)
CXX=${CXX:-g++}
# libcrypto: the one this interpreter's hashlib already uses, when it links one. A second
# libcrypto.so.3 (the carried Debian build), loaded first through our rpath by `import kvo`, would
# be the one every later library asking for that soname gets (Python's _ssl/_hashlib, torch's
# imports): two OpenSSL builds mixed in one process. Else the carried copy.
CRYPTO=-lcrypto
SYS=$($PY -c "import _hashlib; print(_hashlib.__file__)" 2>/dev/null | xargs -r ldd 2>/dev/null \
      | awk '/libcrypto\.so/ {print $3; exit}' || true)
if [ -n "$SYS" ] && [ -f "$SYS" ]; then CRYPTO=$SYS; fi
mkdir -p "$DEST/kvo"
MAP=$DEST/_kvo.map  # export PyInit__kvo alone (the module's std:: instantiations too)
echo "{ global: PyInit__kvo; local: *; };" > "$MAP"
echo "build_ext: $($PY --version) EXT=$EXT PYINC=$PYINC pybind11=$PB $($CXX --version | head -1)"
# --exclude-libs,ALL: export only PyInit__kvo, nothing of the static libraries (kvo's, the CUDA
# runtime's cudart_static) that torch's own libraries could meet.
$CXX -O2 -std=c++20 -fPIC -shared -fvisibility=hidden -DKVO_PY_WITH_CUDA=1 \
  -I"$C/src" -isystem "$PB" -isystem "$PYINC" "$C"/src/python/src/*.cc \
  -o "$DEST/kvo/_kvo$EXT" \
  -Wl,--start-group "$C"/lib/libkvo_manager.a "$C"/lib/libkvo_transfer.a "$C"/lib/libkvo_events.a \
  "$C"/lib/libkvo_common.a "$C"/lib/libkvo_transfer_cuda.a -Wl,--end-group \
  "$C"/lib/libcudart_static.a -L"$C/lib" -lxxhash "$CRYPTO" -lspdlog -lfmt -ldl -lrt -lpthread \
  -Wl,--exclude-libs,ALL -Wl,--version-script="$MAP" -Wl,-rpath,"$C/lib"
echo "build_ext: built $DEST/kvo/_kvo$EXT (libcrypto: $CRYPTO; exported:" \
  "$(nm -D --defined-only "$DEST/kvo/_kvo$EXT" | wc -l) symbols)"
