"""jaxcc_reduce on the GPU against its CPU twin: bit-exact on random data, then GB/s.

Run by tests/gpu/run.sh on a machine with a CUDA GPU.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxcc._src.reduce import reduce_sum, reduce_sum_reference

DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16, jnp.int32, jnp.uint8)


def main():
  gpu, cpu = jax.devices("gpu")[0], jax.devices("cpu")[0]
  rng = np.random.default_rng()
  failures = 0
  for dt in DTYPES:
    for k in (1, 2, 3, 8, 65):
      for n in (1, 1023, 4097, (1 << 20) + 3):
        if jnp.issubdtype(dt, jnp.floating):
          host = [rng.normal(size=n).astype(dt) for _ in range(k)]
        else:
          host = [rng.integers(0, 1 << 7, size=n).astype(dt) for _ in range(k)]
        on_gpu = jax.jit(reduce_sum, device=gpu)([jax.device_put(h, gpu) for h in host])
        on_cpu = jax.jit(reduce_sum_reference, device=cpu)([jax.device_put(h, cpu) for h in host])
        same = np.asarray(on_gpu).tobytes() == np.asarray(on_cpu).tobytes()
        failures += not same
        if not same:
          print(f"MISMATCH reduce {jnp.dtype(dt).name} k={k} n={n}")
  print(f"reduce: {'all bit-exact' if not failures else f'{failures} mismatches'}")
  for dt in (jnp.float32, jnp.bfloat16):
    for k in (2, 8):
      n = (256 << 20) // jnp.dtype(dt).itemsize
      xs = [jax.device_put(jnp.ones(n, dt), gpu) for _ in range(k)]
      f = jax.jit(reduce_sum)
      f(xs).block_until_ready()
      reps = 20
      start = time.perf_counter()
      for _ in range(reps):
        out = f(xs)
      out.block_until_ready()
      sec = (time.perf_counter() - start) / reps
      print(f"reduce {jnp.dtype(dt).name} k={k}: {k * n * jnp.dtype(dt).itemsize / sec / 1e9:.0f} "
            f"GB/s of input")
  raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
  main()
