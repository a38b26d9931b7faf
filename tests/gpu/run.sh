#!/usr/bin/env bash
# The checks a lent GPU runs, in one go (a few minutes): build the CUDA module
# against the jaxlib installed there, then run every tests/gpu/check_*.py (each
# compares CUDA code with its CPU twin or with lax and exits non-zero on a
# mismatch). A failed check does not stop the later ones; the last line names
# the checks that passed and failed, and the exit status is 1 if any failed.
# Run from the repository root on the GPU machine:
#   bash tests/gpu/run.sh            (writes its log to $OUT/gpu.log when OUT is set)
#
# Every CUDA entry point (xla_ffi/cuda/module.cc; tests/test_gpu_checks.py
# keeps this list whole) and the check that runs it:
#   jaxcc_reduce                 check_reduce.py: bits against the CPU twin, GB/s
#   jaxcc_codec_encode_fixed     check_codec.py: bytes against the CPU and the
#   jaxcc_codec_decode_fixed       numpy twin, round trips, corruption; GB/s
#   jaxcc_codec_encode_entropy     against 1 TB/s (fixed) and 300 GB/s (entropy)
#   jaxcc_codec_decode_entropy
#   jaxcc_piece_encode           check_piece.py: the Nccl transport's segmented
#   jaxcc_piece_hop                pieces against the CPU's bytes; the fused hop
#                                  against jaxcc_reduce and the CPU's encoding,
#                                  corruption; hop GB/s against 0.5x a copy
#   jaxcc_collective             check_collective.py: the Nccl transport, bad
#                                  calls, every collective against lax, and on
#                                  2+ GPUs with codec= against raw, bit for bit
# and, not a CUDA entry point: the gossip exchange's host path from GPU programs
# (host callbacks into the CPU module, TCP between 2 processes sharing the GPU):
#   check_exchange.py: bits against what the peer sent, start and done in two
#                        programs; start+done time on the GPU against the CPU
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
log=${OUT:-/tmp}/gpu.log
{
  start=$SECONDS
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  "$PY" -c 'import jax, jaxlib; print("jax", jax.__version__, "jaxlib", jaxlib.__version__, jax.devices())'
  JAXCC_ENABLE_CUDA=ON "$PY" -m pip install -q --no-build-isolation --no-deps -e . \
    -C build-dir=/tmp/jaxcc-build
  "$PY" -c 'import jaxcc._src.ffi as f; assert f.HAS_CUDA, "the CUDA module was not built"'
  echo "built in $((SECONDS - start)) s"
  passed="" failed=""
  for check in tests/gpu/check_*.py; do
    name=$(basename "$check" .py)
    echo "== $check"
    began=$SECONDS
    if timeout 600 "$PY" "$check"; then
      passed="$passed $name"
    else
      failed="$failed $name (exit $?)"
    fi
    echo "== $name: $((SECONDS - began)) s"
  done
  echo "GPU checks passed:${passed:- none}; failed:${failed:- none}; $((SECONDS - start)) s in all"
  [ -z "$failed" ]
} 2>&1 | tee "$log"
