"""The GPU's segmented pieces (xla_ffi/cuda/piece_codec.cu) against the CPU's piece codec, then
the fused reduce hop's throughput against the device's copy bandwidth.

Run by tests/gpu/run.sh on a machine with a CUDA GPU:

  python tests/gpu/check_piece.py [--quick]

1. Bit-exactness, for bf16/f16/f32 x fixed/entropy x adversarial data x sizes
   that cross every block and segment edge:
   - jaxcc_piece_encode (the Nccl transport's encoder) gives the CPU's bytes
     (xla_ffi/cpu/piece_codec.h, segmented) and their segment sizes;
   - jaxcc_piece_hop decodes the CPU's bytes to the exact input (a copy hop);
   - jaxcc_piece_hop sums own and 1, 3 or 9 pieces: the same bits as
     jaxcc_reduce on the GPU over the decoded inputs in that order, and the
     encoded sum is the CPU's encoding of it, byte for byte;
   - a flipped byte, a wrong announced size and a piece of another codec fail
     with a message, never a wrong sum.
2. Throughput (median of 10): the fused hop on 256 MiB (own + k pieces ->
   own, encoded), as bytes of the result per second, against a device copy
   of the same bytes; target: at least 0.5x the copy.

Exits 1 if any comparison fails; throughput below target is reported, not fatal.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # tests/: shared data
from bitwise import float_data, segment_sizes  # noqa: E402
from check_codec import timed  # noqa: E402  (tests/gpu/, the script's folder)

from jaxcc import _jaxcc_cpu  # noqa: E402
from jaxcc._src import ffi  # noqa: E402
from jaxcc._src.reduce import reduce_sum  # noqa: E402
from jaxcc.codec import reference  # noqa: E402

SEGMENT = reference.ENTROPY_BLOCK
FLOATS = ("bfloat16", "float16", "float32")
CODECS = ("fixed", "entropy")
KINDS = ("normal", "weights", "bits", "special", "sparse", "zeros")
SIZES = (1, 255, 257, 4099, SEGMENT, 2 * SEGMENT + 1000, 5 * SEGMENT + 3)


def ids(codec, x):
  return reference.CODEC_IDS[codec], reference.DTYPE_IDS[np.dtype(x.dtype).name]


def segments(n):
  return -(-n // SEGMENT)


def cpu_encode(x, codec) -> bytes:
  return _jaxcc_cpu.piece_encode(*ids(codec, x), np.asarray(x).tobytes(), False)


def gpu_encode(x, codec):
  cid, did = ids(codec, x)
  cap = _jaxcc_cpu.piece_max_bytes(cid, did, x.size)
  fn = jax.ffi.ffi_call("jaxcc_piece_encode",
                        (jax.ShapeDtypeStruct((cap,), jnp.uint8),
                         jax.ShapeDtypeStruct((segments(x.size),), jnp.uint32)))
  payload, sizes = fn(x, codec=np.int64(cid))
  sizes = np.asarray(sizes)
  return np.asarray(payload)[:int(sizes.sum(dtype=np.int64))].tobytes(), sizes


def hop_call(own, codec):
  """jaxcc_piece_hop for a result like own: (y, payload, segment sizes)."""
  cid, did = ids(codec, own)
  return jax.ffi.ffi_call("jaxcc_piece_hop",
                          (jax.ShapeDtypeStruct(own.shape, own.dtype),
                           jax.ShapeDtypeStruct((_jaxcc_cpu.piece_max_bytes(cid, did, own.size),),
                                                jnp.uint8),
                           jax.ShapeDtypeStruct((segments(own.size),), jnp.uint32)))


def padded(pieces: list[bytes], width: int) -> np.ndarray:
  """The pieces as the rows of one (k, width) byte array (one shape per size: one compile)."""
  rows = np.zeros((len(pieces), width), np.uint8)
  for i, p in enumerate(pieces):
    rows[i, :len(p)] = np.frombuffer(p, np.uint8)
  return rows


def gpu_hop(own, pieces: list[bytes], codec, gpu, add=True, encode=True, sizes=None):
  """jaxcc_piece_hop: (own + pieces, or the one piece decoded; its encoding; segment sizes)."""
  cid, did = ids(codec, own)
  n = own.size
  rows = padded(pieces, max(_jaxcc_cpu.piece_max_bytes(cid, did, n), *(len(p) for p in pieces)))
  if sizes is None:
    sizes = np.array([segment_sizes(p) for p in pieces], np.uint32)
  y, payload, out_sizes = hop_call(own, codec)(jax.device_put(own, gpu), jax.device_put(rows, gpu),
                             jax.device_put(sizes, gpu), codec=np.int64(cid),
                             sum=np.int64(add), encode=np.int64(encode))
  out_sizes = np.asarray(out_sizes)
  return (np.asarray(y), np.asarray(payload)[:int(out_sizes.sum(dtype=np.int64))].tobytes(),
          out_sizes)


def check_exact(gpu, quick: bool) -> int:
  failures = []
  rng = np.random.default_rng(0)
  sizes = SIZES[:5] if quick else SIZES

  def fail(what):
    failures.append(what)
    print(f"MISMATCH {what}", flush=True)

  for dtype in FLOATS:
    for codec in CODECS:
      for kind in KINDS:
        for n in sizes:
          what = f"{dtype} {codec} {kind} n={n}"
          x = float_data(kind, n, dtype, rng)
          want = cpu_encode(x, codec)
          got, got_sizes = gpu_encode(jax.device_put(x, gpu), codec)
          if got != want or list(got_sizes) != segment_sizes(want):
            fail(f"encode {what}: gpu {len(got)} B, cpu {len(want)} B")
          y, _, _ = gpu_hop(x, [want], codec, gpu, add=False, encode=False)
          if y.tobytes() != x.tobytes():
            fail(f"decode {what}")
          for k in (1, 3) if n > SEGMENT else (1, 3, 9):
            terms = [float_data(kind if i % 2 else "normal", n, dtype, rng) for i in range(k)]
            own = float_data("weights", n, dtype, rng)
            y, enc, _ = gpu_hop(own, [cpu_encode(t, codec) for t in terms], codec, gpu)
            expect = np.asarray(reduce_sum([jax.device_put(a, gpu) for a in [own, *terms]]))
            if y.tobytes() != expect.tobytes():
              fail(f"hop k={k} {what}: the sum differs from jaxcc_reduce's")
            elif enc != cpu_encode(expect, codec):
              fail(f"hop k={k} {what}: the encoded sum differs from the CPU's")
      x = float_data("weights", 3 * SEGMENT, dtype, rng)
      data = bytearray(cpu_encode(x, codec))
      data[len(data) // 2] ^= 0x10
      bad_sizes = np.array([segment_sizes(cpu_encode(x, codec))], np.uint32)
      bad_sizes[0, 0] -= 4
      other = cpu_encode(x, "entropy" if codec == "fixed" else "fixed")
      for what, pieces, announced, message in (
          ("a flipped byte", [bytes(data)], None, "does not decode"),
          ("a wrong size", [cpu_encode(x, codec)], bad_sizes, "does not decode"),
          ("another codec", [other], None, "does not decode")):
        try:
          gpu_hop(x, pieces, codec, gpu, sizes=announced)
          fail(f"no error on {what} ({dtype} {codec})")
        except Exception as e:  # noqa: BLE001  (INVALID_ARGUMENT arrives as ValueError)
          if message not in str(e) and "announced" not in str(e):
            fail(f"wrong error on {what} ({dtype} {codec}): {e}")
  print(f"piece bit-exactness: {len(failures)} failures", flush=True)
  return len(failures)


def throughput(gpu, quick: bool) -> None:
  rng = np.random.default_rng(1)
  for dtype, n in (("bfloat16", 1 << 27), ("float32", 1 << 26)):
    n = n // 16 if quick else n
    own = float_data("weights", n, dtype, rng)
    x = jax.device_put(own, gpu)
    t_copy = timed(jax.jit(lambda a: -a), x)  # reads and writes the bytes once, like a copy
    copy = own.nbytes / t_copy / 1e9
    for codec in CODECS:
      for k in (1, 7):
        pieces = [cpu_encode(float_data("weights", n, dtype, rng), codec) for _ in range(k)]
        cid, _ = ids(codec, own)
        rows = jax.device_put(padded(pieces, max(len(p) for p in pieces)), gpu)
        sizes = jax.device_put(np.array([segment_sizes(p) for p in pieces], np.uint32), gpu)
        fn = hop_call(own, codec)
        t = timed(lambda: fn(x, rows, sizes, codec=np.int64(cid), sum=np.int64(1),
                             encode=np.int64(1)))
        rate = own.nbytes / t / 1e9
        print(f"{dtype:8s} {codec:7s} hop k={k}: {rate:7.1f} GB/s of result, copy "
              f"{copy:7.1f} GB/s: {rate / copy:.2f}x (target 0.5x: "
              f"{'met' if rate >= 0.5 * copy else 'NOT met'})", flush=True)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="fewer sizes, smaller arrays")
  args = parser.parse_args()
  if not ffi.HAS_CUDA:
    print("jaxcc was built without CUDA handlers", file=sys.stderr)
    return 1
  gpu = jax.devices("gpu")[0]
  print(f"GPU: {gpu.device_kind}", flush=True)
  failures = check_exact(gpu, args.quick)
  throughput(gpu, args.quick)
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())
