#!/usr/bin/env bash
# The checks a lent GPU runs, in one go (minutes): build the CUDA module against
# the jaxlib installed there, then run every tests/gpu/check_*.py (each compares
# CUDA code with its CPU twin or with lax and exits non-zero on a mismatch).
# A failed check does not stop the later ones; the last line names the checks
# that passed and failed, and the exit status is 1 if any failed. Run from the
# repository root on the GPU machine:
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
  passed="" failed=""
  for check in tests/gpu/check_*.py; do
    name=$(basename "$check" .py)
    echo "== $check"
    if "$PY" "$check"; then
      passed="$passed $name"
    else
      failed="$failed $name (exit $?)"
    fi
  done
  echo "GPU checks passed:${passed:- none}; failed:${failed:- none}"
  [ -z "$failed" ]
} 2>&1 | tee "$log"
