"""One process of an all_reduce benchmark: time each algorithm; print one JSON line.

Usage: ``python worker.py CONFIG_JSON``, with CONFIG
``{"bandwidths": [bytes/s per rank], "nbytes": int, "algorithms": [...], "repeats": int,
"progress": path or null}``; ``jaxcc.bench.allreduce.measure`` starts it with
``jaxcc.launcher.launch``: on the testbed one ``jax.distributed`` process of one
CPU device per host, elsewhere one process with one virtual CPU device per rank.

Every rank holds ``nbytes`` of float32 integers below 1000, so every
summation order gives the exact sum. Each algorithm ("psum" is ``lax.psum``,
the others ``jaxcc.all_reduce`` with that algorithm, planned for the
bandwidths) runs once to compile, connect and check its result against the
exact sum; then the algorithms take turns ``repeats`` times, each run timed
from right after a one-element psum that lines the processes up to its
result. Prints ``{"process": i, "samples": {algorithm: [seconds, ...]}}``;
process 0 appends a line to the progress file after each run.
"""

import json
import sys
import time

import jax
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxcc
from jaxcc.launcher import join


def main():
  config = json.loads(sys.argv[1])
  processes = join().num_processes
  topology = jaxcc.Topology.from_bandwidths(config["bandwidths"])
  n, size, me = topology.size, config["nbytes"] // 4, jax.process_index()
  if jax.device_count() != n:
    raise SystemExit(f"worker: {n} ranks but {jax.device_count()} devices")
  mesh = jax.make_mesh((n,), ("x",))
  x = jax.make_array_from_callback((n, size), NamedSharding(mesh, P("x")),
                                   lambda index: _row(index[0].start, size)[None])
  expected = sum(_row(r, size) for r in range(n))

  def smap(fn):
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("x"), out_specs=P()))

  line_up = smap(lambda b: lax.psum(b[:, :1], "x"))
  fns = {name: smap(_collective(name, topology)) for name in config["algorithms"]}

  def note(text):
    if me == 0 and config["progress"]:
      with open(config["progress"], "a") as f:
        f.write(text + "\n")

  for name, f in fns.items():
    got = np.asarray(f(x).addressable_shards[0].data)[0]
    np.testing.assert_array_equal(got, expected, err_msg=f"{name} on process {me}")
    note(f"{name} warm-up")
  samples = {name: [] for name in fns}
  for rep in range(config["repeats"]):
    for name, f in fns.items():
      line_up(x).block_until_ready()
      start = time.perf_counter()
      f(x).block_until_ready()
      samples[name].append(time.perf_counter() - start)
      note(f"{name} {rep + 1}/{config['repeats']}")
  print(json.dumps({"process": me, "samples": samples}), flush=True)
  if processes > 1:
    jax.distributed.shutdown()


def _row(rank: int, size: int) -> np.ndarray:
  """Rank ``rank``'s buffer: ``size`` float32 integers in [0, 1000)."""
  return ((np.arange(size) + 7919 * rank) % 1000).astype(np.float32)


def _collective(name: str, topology):
  if name == "psum":
    return lambda b: lax.psum(b, "x")
  return lambda b: jaxcc.all_reduce(b, "x", algorithm=name, topology=topology)


if __name__ == "__main__":
  main()
