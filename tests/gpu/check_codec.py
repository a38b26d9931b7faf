"""The CUDA codec kernels against the CPU kernels and the numpy twin, then their throughput.

Run on a machine with a CUDA GPU and jaxcc built with CUDA (tests/gpu/run.sh):

  python tests/gpu/check_codec.py [--quick]

1. Bit-exactness: for bf16/f16/f32 x fixed/entropy x adversarial data (normal,
   weights, random bits, NaN/inf/-0.0/subnormals, 97% zeros, all zeros) x sizes
   that cross every block edge, the GPU encoding equals the CPU encoding byte
   for byte (and the numpy twin's on the smaller sizes), the GPU decodes both
   to the exact input, and corrupted bytes fail on the GPU with the message the
   CPU gives.
2. Throughput: GB/s of input for encode and decode of 256M elements (bf16) and
   128M (f32) on the GPU, the median of 10 runs; targets on an H200: fixed
   >= 1000 GB/s, entropy >= 300 GB/s.

Exits 1 if any comparison fails; throughput below target is reported, not fatal.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # tests/: shared data
from bitwise import float_data  # noqa: E402

from jaxcc import codec  # noqa: E402
from jaxcc._src import ffi  # noqa: E402
from jaxcc.codec import reference  # noqa: E402

FLOATS = ("bfloat16", "float16", "float32")
CODECS = ("fixed", "entropy")
KINDS = ("normal", "weights", "bits", "special", "sparse", "zeros")
SIZES = (1, 255, 256, 257, 4099, 65536, 65536 * 3 + 1000)
TARGET_GBPS = {"fixed": 1000.0, "entropy": 300.0}


def same_bits(a, b) -> bool:
  a, b = np.asarray(a), np.asarray(b)
  return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def check_exact(gpu, cpu, quick: bool) -> int:
  failures = 0
  # Each call runs where its inputs are committed.
  enc = {d: jax.jit(codec.encode, static_argnums=1) for d in (gpu, cpu)}
  dec = {d: jax.jit(codec.decode) for d in (gpu, cpu)}
  rng = np.random.default_rng(0)
  sizes = SIZES[:5] if quick else SIZES
  for dtype in FLOATS:
    for name in CODECS:
      for kind in KINDS:
        for n in sizes:
          x = float_data(kind, n, dtype, rng)
          what = f"{dtype} {name} {kind} n={n}"
          g = enc[gpu](jax.device_put(x, gpu), name)
          c = enc[cpu](jax.device_put(x, cpu), name)
          gb = np.asarray(g.payload)[:int(g.nbytes)]
          cb = np.asarray(c.payload)[:int(c.nbytes)]
          ok = gb.tobytes() == cb.tobytes()
          if ok and n <= 70000:
            ok = gb.tobytes() == reference.encode(x, name).tobytes()
          ok = ok and same_bits(dec[gpu](g), x)
          ok = ok and same_bits(dec[gpu](jax.device_put(c, gpu)), x)
          if not ok:
            failures += 1
            print(f"MISMATCH {what}: gpu {int(g.nbytes)} B, cpu {int(c.nbytes)} B", flush=True)
      # Corruption must fail on the GPU too.
      x = float_data("weights", 70000, dtype, rng)
      g = enc[gpu](jax.device_put(x, gpu), name)
      payload = np.asarray(g.payload).copy()
      payload[int(g.nbytes) // 2] ^= 0x10
      bad = dataclasses.replace(g, payload=jax.device_put(payload, gpu))
      try:
        jax.block_until_ready(dec[gpu](bad))
        failures += 1
        print(f"NO ERROR on corrupted {dtype} {name}", flush=True)
      except Exception as e:  # noqa: BLE001  (INVALID_ARGUMENT arrives as ValueError)
        if "checksum mismatch" not in str(e):
          failures += 1
          print(f"WRONG ERROR on corrupted {dtype} {name}: {e}", flush=True)
  print(f"bit-exactness: {failures} failures", flush=True)
  return failures


def timed(fn, *args, reps: int = 10) -> float:
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return float(np.median(times))


def throughput(gpu, quick: bool) -> None:
  rng = np.random.default_rng(1)
  for dtype, n in (("bfloat16", 1 << 28), ("float32", 1 << 27)):
    n = n // 16 if quick else n
    x = jax.device_put(float_data("weights", n, dtype, rng), gpu)
    for name in CODECS:
      enc = jax.jit(lambda a, name=name: codec.encode(a, name))
      dec = jax.jit(codec.decode)
      e = enc(x)
      te, td = timed(enc, x), timed(dec, e)
      gb = x.nbytes / 1e9
      target = TARGET_GBPS[name]
      print(f"{dtype:8s} {name:7s} ratio {int(e.nbytes) / x.nbytes:.4f}  "
            f"encode {gb / te:8.1f} GB/s  decode {gb / td:8.1f} GB/s  "
            f"(target {target:.0f}: {'met' if min(gb / te, gb / td) >= target else 'NOT met'})",
            flush=True)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="fewer sizes, smaller arrays")
  args = parser.parse_args()
  if not ffi.HAS_CUDA:
    print("jaxcc was built without CUDA handlers", file=sys.stderr)
    return 1
  gpus = jax.devices("gpu")
  cpu = jax.devices("cpu")[0]
  print(f"GPU: {gpus[0].device_kind}", flush=True)
  failures = check_exact(gpus[0], cpu, args.quick)
  throughput(gpus[0], args.quick)
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())
