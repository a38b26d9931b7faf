#!/usr/bin/env bash
# The checks a lent GPU runs, in one go (minutes): build the CUDA module against
# the jaxlib installed there, then compare every CUDA kernel with its CPU twin on
# random data and time it. Run from the repository root on the GPU machine:
#   bash tests/gpu/run.sh            (writes its log to $OUT/gpu.log when OUT is set)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
log=${OUT:-/tmp}/gpu.log
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  "$PY" -c 'import jax, jaxlib; print("jax", jax.__version__, "jaxlib", jaxlib.__version__, jax.devices())'
  JAXCC_ENABLE_CUDA=ON "$PY" -m pip install -q --no-build-isolation --no-deps -e . \
    -C build-dir=/tmp/jaxcc-build
  "$PY" -c 'import jaxcc._src.ffi as f; assert f.HAS_CUDA, "the CUDA module was not built"'
  for check in tests/gpu/check_*.py; do
    echo "== $check"
    "$PY" "$check"
  done
} 2>&1 | tee "$log"
