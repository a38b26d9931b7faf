"""One process of ``jaxcc bench sweep``: each collective at each size, jaxcc against its lax twin.

Usage: ``python sweep_worker.py CONFIG_JSON``, with CONFIG ``{"collectives": [...],
"sizes": [bytes, ...], "repeats": [per size], "algorithm", "executor", "codec",
"bandwidths": [bytes/s per rank] or null, "progress": path or null}``;
``jaxcc.bench.sweep.run`` starts it with ``jaxcc.launcher.launch`` (one process
of virtual CPU devices, or one process of one device per rank).

At each size S every rank holds float32 normal values (a whole number of
elements per rank): S bytes for all_reduce, reduce_scatter, broadcast (root
0) and ppermute (a shift to the next rank), S / p for all_gather (S is its
output). The jaxcc call (``algorithm`` where it takes one; a topology of
``bandwidths`` if given) and its twin (``TWINS``) run once each to compile and
connect, and every shard of the jaxcc result is checked against the twin's:
bit for bit for copies, ``allclose`` for sums. Then they take turns
``repeats`` times, each run timed (across processes, right after a one-element
psum that lines them up). Prints ``{"process": i, "results": [{"collective",
"nbytes", "jaxcc": [s, ...], "lax": [s, ...], "check", "max_abs_diff"}]}``;
process 0 appends a line to the progress file after each run.
"""

import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxcc
from jaxcc.launcher import join

# The lax twin of each collective. XLA has no broadcast: psum of the root's array
# (zeros elsewhere) sends 2(p-1)/p S per rank, all_gather(x)[root] (p-1) S.
TWINS = {
    "all_reduce": lambda b, n: lax.psum(b, "x"),
    "reduce_scatter": lambda b, n: lax.psum_scatter(b, "x", scatter_dimension=0, tiled=True),
    "all_gather": lambda b, n: lax.all_gather(b, "x", axis=0, tiled=True),
    "broadcast": lambda b, n: lax.psum(jnp.where(lax.axis_index("x") == 0, b, 0), "x"),
    "ppermute": lambda b, n: lax.ppermute(b, "x", _shift(n)),
}
SUMS = ("all_reduce", "reduce_scatter")


def main():
  config = json.loads(sys.argv[1])
  processes = join().num_processes
  n, me = jax.device_count(), jax.process_index()
  mesh = jax.make_mesh((n,), ("x",))
  topology = (jaxcc.Topology.from_bandwidths(config["bandwidths"]) if config["bandwidths"]
              else None)

  def smap(fn):
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                                 check_vma=False))

  def note(text):
    if me == 0 and config["progress"]:
      with open(config["progress"], "a") as f:
        f.write(text + "\n")

  line_up = smap(lambda b: lax.psum(b, "x"))
  token = _sharded(mesh, n, 1, np.ones(1, np.float32))
  results = []
  for nbytes, repeats in zip(config["sizes"], config["repeats"]):
    elements = max(n, nbytes // 4 // n * n)
    base = np.random.default_rng(nbytes).standard_normal(elements, dtype=np.float32)
    for collective in config["collectives"]:
      per_rank = elements // n if collective == "all_gather" else elements
      x = _sharded(mesh, n, per_rank, base)
      fns = {"jaxcc": smap(_jaxcc(collective, n, config, topology)),
             "lax": smap(lambda b, c=collective: TWINS[c](b, n))}
      label = f"{collective} {nbytes} B"
      want = fns["lax"](x)
      got = fns["jaxcc"](x)
      check, diff = _compare(collective, got, want, f"{label} on process {me}")
      del got, want
      note(f"{label} checked")
      samples = {name: [] for name in fns}
      for rep in range(repeats):
        order = list(fns.items())
        for name, f in order if rep % 2 else order[::-1]:  # each goes first every other time
          if processes > 1:
            line_up(token).block_until_ready()
          start = time.perf_counter()
          f(x).block_until_ready()
          samples[name].append(time.perf_counter() - start)
        note(f"{label} {rep + 1}/{repeats}")
      results.append({"collective": collective, "nbytes": 4 * elements, **samples,
                      "check": check, "max_abs_diff": diff})
      del x
  print(json.dumps({"process": me, "results": results}), flush=True)
  if processes > 1:
    jax.distributed.shutdown()


def _shift(n: int) -> list[tuple[int, int]]:
  return [(r, (r + 1) % n) for r in range(n)]


def _jaxcc(collective: str, n: int, config: dict, topology):
  """The jaxcc call of ``collective`` with the sweep's options, as a shard_map body."""
  options = {"executor": config["executor"], "codec": config["codec"]}
  if collective == "ppermute":
    return lambda b: jaxcc.ppermute(b, "x", _shift(n), **options)
  options.update(algorithm=config["algorithm"], topology=topology)
  if collective == "reduce_scatter":
    return lambda b: jaxcc.reduce_scatter(b, "x", scatter_dimension=0, tiled=True, **options)
  if collective == "all_gather":
    return lambda b: jaxcc.all_gather(b, "x", axis=0, tiled=True, **options)
  return lambda b: getattr(jaxcc, collective)(b, "x", **options)


def _sharded(mesh, n: int, per_rank: int, base: np.ndarray) -> jax.Array:
  """A (n * per_rank,) float32 array sharded over "x": rank r's block is ``base[:per_rank] + r``."""
  def block(index):
    return base[:per_rank] + np.float32(index[0].start // per_rank)
  return jax.make_array_from_callback((n * per_rank,), NamedSharding(mesh, P("x")), block)


def _compare(collective: str, got: jax.Array, want: jax.Array, what: str) -> tuple[str, float]:
  """Check every local shard: bit for bit, or allclose for sums; (the check, max |got - want|)."""
  diff = 0.0
  for g, w in zip(got.addressable_shards, want.addressable_shards):
    a, b = np.asarray(g.data), np.asarray(w.data)
    if collective in SUMS:
      diff = max(diff, float(np.max(np.abs(a - b), initial=0.0)))
      if not np.allclose(a, b, rtol=1e-5, atol=1e-5):
        raise AssertionError(f"sweep: jaxcc {what} is not close to lax's (max |diff| {diff})")
    elif not np.array_equal(a.view(np.uint32), b.view(np.uint32)):
      raise AssertionError(f"sweep: jaxcc {what} differs from lax's bits")
  return ("allclose" if collective in SUMS else "bit-exact"), diff


if __name__ == "__main__":
  main()
