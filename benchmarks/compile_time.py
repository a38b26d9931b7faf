"""Lower-and-compile time of a 200-leaf gradient pytree through jaxcc.all_reduce against lax.psum.

The pytree has 200 leaves of mixed shapes (1 to 2 dimensions of 1 to 63 per
rank) and dtypes (float32 and bfloat16), on 8 virtual CPU devices; each
variant is lowered and compiled three times from a cleared cache and the
fastest counts. Run: ``.venv/bin/python benchmarks/compile_time.py``.
"""

from __future__ import annotations

import time

from jaxcc._src.devices import use_virtual_cpu_devices


def main():
  use_virtual_cpu_devices(8)
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax import lax
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  import jaxcc

  mesh = jax.make_mesh((8,), ("x",))
  rng = np.random.default_rng(0)
  shapes = [tuple(int(s) for s in rng.integers(1, 64, size=rng.integers(1, 3)))
            for _ in range(200)]
  tree = {f"p{i}": jnp.zeros((8,) + s, jnp.float32 if i % 3 else jnp.bfloat16)
          for i, s in enumerate(shapes)}
  tree = jax.device_put(tree, NamedSharding(mesh, P("x")))

  def cost(sync, reps=3):
    times = []
    for _ in range(reps):
      f = jax.jit(jax.shard_map(sync, mesh=mesh, in_specs=P("x"), out_specs=P()))
      start = time.perf_counter()
      f.lower(tree).compile()
      times.append(time.perf_counter() - start)
      jax.clear_caches()
    return min(times)

  base = cost(lambda t: lax.psum(t, "x"))
  print(f"lax.psum                     {base * 1e3:7.0f} ms")
  for name, kw in (("auto", {}), ("executor='native'", {"executor": "native"})):
    t = cost(lambda v, kw=kw: jaxcc.all_reduce(v, "x", **kw))
    print(f"jaxcc.all_reduce {name:18} {t * 1e3:7.0f} ms  ({t / base:.2f}x lax.psum)")


if __name__ == "__main__":
  main()
