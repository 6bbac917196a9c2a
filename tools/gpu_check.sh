#!/usr/bin/env bash
# On a machine with a GPU: builds smddp's CUDA path against the machine's
# torch, runs the GPU tests and the GPU benchmarks, and writes everything to
# one log, ${OUT:-gpu-results}/gpu_check.log (plus kernels.json and
# collectives.json). Every step is capped; the caps add up to under 8
# minutes on one H200.
#
#   OUT=/some/dir tools/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
PY=${PYTHON:-python3}
exec > >(tee "$LOG") 2>&1
step() { echo; echo "=== $* ($(date +%T))"; }
status=0

step machine
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv || true
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"

step build
# One architecture is enough here and halves nvcc's work.
export SMDDP_CUDA_ARCHS=${SMDDP_CUDA_ARCHS:-90}
if ! SMDDP_WITH_CUDA=1 MAX_JOBS=$(nproc) timeout 200 $PY setup.py -q build_ext --inplace; then
  echo "BUILD FAILED"
  exit 1
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
$PY -c "import smddp; print('smddp with cuda:', smddp._C.with_cuda)"

step "GPU tests"
timeout 150 $PY -m pytest -q -m gpu tests/test_cuda.py -p no:cacheprovider || status=1

step "reduction kernel against device-to-device copy"
timeout 50 $PY bench/gpu_kernels.py --json "$OUT/kernels.json" || status=1

step "collectives, 2 ranks sharing the GPU"
timeout 70 $PY bench/gpu_collectives.py --nproc 2 --json "$OUT/collectives.json" || status=1

step "done (status $status)"
exit $status
