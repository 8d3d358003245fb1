#!/bin/bash
# Issue 15 on the GPU machine, one call: build kvo's extension for the machine's Python, then
# the worker bench (step 1), the transformer end to end (step 2) and compute-sanitizer (step 3).
# Needs .device/carry (bench/gpu/make_carry.sh) carried. Logs and JSON under $OUT.
#   STEPS=info,build,worker,model,sanitize (default all)   WORKER_ARGS / MODEL_ARGS: extra flags
#   STEPS=...,enginetest: the CUDA engine's gtest binary (make_carry.sh with ENGINE_TEST=1)
set -u -o pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/kvo-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export KVO_PY_BUILD=$PWD/build/dev/python KVO_PY_SRC=$PWD/.device/carry/src/python
STEPS=${STEPS:-info,build,worker,model,sanitize}
step() { case ",$STEPS," in *",$1,"*) return 0 ;; esac; return 1; }
status=0
T0=$(date +%s)
el() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }

if step info; then
  {
    el info; date -u; uname -r; nproc; free -g | head -2; df -h /dev/shm /tmp | cat
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,pcie.link.gen.current,pcie.link.width.current --format=csv
    command -v g++ nvcc compute-sanitizer python3
    python3 -c "import sys, torch, pybind11, transformers, numpy; print(sys.version); print('torch', torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0)); print('pybind11', pybind11.__version__, 'transformers', transformers.__version__, 'numpy', numpy.__version__)"
  } 2>&1 | tee "$OUT/setup.log"
fi

if step build; then
  { el build; bash bench/gpu/build_ext.sh && python3 -c "
import sys; sys.path.insert(0, 'bench/gpu'); import kvo_gpu, kvo
print('kvo', kvo.__file__, kvo._kvo.__file__, 'engines', kvo.transfer_engines())
assert 'cuda' in kvo.transfer_engines()"; } 2>&1 | tee -a "$OUT/setup.log"
  if [ $? -ne 0 ]; then el "BUILD FAILED"; exit 1; fi
fi

if step enginetest; then
  el enginetest
  { LD_LIBRARY_PATH=$PWD/.device/carry/lib timeout ${ENGINETEST_TIMEOUT:-120} \
      .device/carry/bin/transfer_cuda_cuda_engine_test; echo "ENGINE_TEST rc=$?"; } 2>&1 \
    | tee "$OUT/enginetest.log" | grep -E "^\[  (PASSED|FAILED|SKIPPED) |ENGINE_TEST rc"
  grep -q "ENGINE_TEST rc=0" "$OUT/enginetest.log" || status=1
fi

if step worker; then
  el worker
  timeout ${WORKER_TIMEOUT:-200} python3 bench/gpu/worker_bench.py --json "$OUT/worker_bench.json" ${WORKER_ARGS:-} \
    2>&1 | tee "$OUT/worker.log"
  r=$?; [ $r -ne 0 ] && { el "worker rc=$r"; status=1; }
fi

if step model; then
  el model
  timeout ${MODEL_TIMEOUT:-150} python3 bench/gpu/model_e2e.py --json "$OUT/model_e2e.json" ${MODEL_ARGS:-} \
    2>&1 | tee "$OUT/model.log"
  r=$?; [ $r -ne 0 ] && { el "model rc=$r"; status=1; }
fi

if step sanitize; then
  SMALL="--pages 16,64 --layers 4 --job-mib 4 --reps 1 --fs-blocks 8"
  # (the help captured first: grep -q closing the pipe early would fail it under pipefail)
  SANITIZER_HELP=$(compute-sanitizer --help 2>&1 || true)
  if grep -q -- "--kernel-name" <<<"$SANITIZER_HELP"; then KF="--kernel-name kns=CopyPieces"
  else KF="--filter kns=CopyPieces"; fi
  {
    compute-sanitizer --version | tail -1
    el "memcheck (every API call; kvo's copy kernel instrumented)"
    timeout ${MEMCHECK_TIMEOUT:-150} compute-sanitizer --tool memcheck --error-exitcode 9 $KF \
      python3 bench/gpu/worker_bench.py $SMALL
    echo "MEMCHECK rc=$?"
    el "racecheck (kvo's copy kernel)"
    timeout ${RACECHECK_TIMEOUT:-80} compute-sanitizer --tool racecheck --error-exitcode 9 $KF \
      python3 bench/gpu/worker_bench.py $SMALL
    echo "RACECHECK rc=$?"
  } 2>&1 | tee "$OUT/sanitize.log"
  grep -E "ERROR SUMMARY|rc=" "$OUT/sanitize.log"
fi
el "done status=$status"
ls -la "$OUT"
exit $status
