"""One process of a collective benchmark: time each algorithm; print one JSON line.

Usage: ``python worker.py CONFIG_JSON``, with CONFIG ``{"collective": name,
"topology": {Topology fields}, "nbytes": int, "algorithms": [...], "repeats": int,
"count_bytes": bool, "progress": path or null}``; ``jaxcc.bench.collective.measure``
starts it with ``jaxcc.launcher.launch``: on the testbed one ``jax.distributed``
process of one CPU device per host, elsewhere one process with one virtual
CPU device per rank.

Every rank holds float32 integers below 1000, so every summation order gives
the exact sum. Each algorithm (the lax twin by its lax name, the others
jaxcc's collective with that algorithm, planned for the topology; an
all_reduce ``"name@K"`` the schedule planned at depth K, run by the native
executor as jaxcc's all_reduce runs its plan) runs once
to compile, connect and check its result against numpy; then the algorithms
take turns ``repeats`` times, each run timed from right after a one-element
psum that lines the processes up to its result. With ``count_bytes`` each
process reads its testbed host's cross-cluster send counter
(``jaxcc.testbed.netns.band_bytes``) around its first timed run of each
algorithm. Prints ``{"process": i, "samples": {algorithm: [seconds, ...]}}``
(plus ``"inter_bytes": {algorithm: bytes}``); process 0 appends a line to the
progress file after each run.
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
from jaxcc._src import native_executor
from jaxcc.bench.collective import split_depth
from jaxcc.launcher import join
from jaxcc.testbed.netns import band_bytes

_LAX = {"psum": lambda b: lax.psum(b, "x"),
        "psum_scatter": lambda b: lax.psum_scatter(b, "x", tiled=True),
        "all_gather": lambda b: lax.all_gather(b, "x", tiled=True)}
_JAXCC = {"all_reduce": jaxcc.all_reduce, "reduce_scatter": jaxcc.reduce_scatter,
          "all_gather": jaxcc.all_gather}


def main():
  config = json.loads(sys.argv[1])
  processes = join().num_processes
  topology = jaxcc.Topology(**config["topology"])
  collective = config["collective"]
  n, size, me = topology.size, config["nbytes"] // 4, jax.process_index()
  if jax.device_count() != n:
    raise SystemExit(f"worker: {n} ranks but {jax.device_count()} devices")
  mesh = jax.make_mesh((n,), ("x",))
  inputs, expected = _data(collective, n, size)
  x = jax.make_array_from_callback(inputs.shape, NamedSharding(mesh, P("x")),
                                   lambda index: inputs[index])

  def smap(fn):
    return jax.jit(jax.shard_map(lambda b: fn(b[0])[None], mesh=mesh, in_specs=P("x"),
                                 out_specs=P("x")))

  line_up = smap(lambda b: lax.psum(b[:1], "x"))
  # Each rank's process, as the native executor takes it: none when one process holds them all.
  procs = (np.array([d.process_index for d in mesh.devices.flat], np.int64) if processes > 1
           else np.zeros(0, np.int64))
  fns = {name: smap(_collective(collective, name, topology, config["nbytes"], procs))
         for name in config["algorithms"]}

  def note(text):
    if me == 0 and config["progress"]:
      with open(config["progress"], "a") as f:
        f.write(text + "\n")

  for name, f in fns.items():
    for shard in f(x).addressable_shards:
      rank = shard.index[0].start
      np.testing.assert_array_equal(np.asarray(shard.data)[0], expected[rank],
                                    err_msg=f"{name} on process {me}, rank {rank}")
    note(f"{name} warm-up")
  samples = {name: [] for name in fns}
  crossed = {}
  for rep in range(config["repeats"]):
    for name, f in fns.items():
      line_up(x).block_until_ready()
      counting = config["count_bytes"] and rep == 0
      before = band_bytes()["inter"] if counting else 0
      start = time.perf_counter()
      f(x).block_until_ready()
      samples[name].append(time.perf_counter() - start)
      if counting:
        line_up(x).block_until_ready()  # the peers' ACKs of this rank's last bytes are in
        crossed[name] = band_bytes()["inter"] - before
      note(f"{name} {rep + 1}/{config['repeats']}")
  out = {"process": me, "samples": samples}
  if config["count_bytes"]:
    out["inter_bytes"] = crossed
  print(json.dumps(out), flush=True)
  if processes > 1:
    jax.distributed.shutdown()


def _data(collective: str, n: int, size: int) -> tuple[np.ndarray, np.ndarray]:
  """Every rank's input (one row each) and its expected result (one row each)."""
  rows = ((np.arange(size)[None] + 7919 * np.arange(n)[:, None]) % 1000).astype(np.float32)
  if collective == "all_reduce":
    return rows, np.broadcast_to(rows.sum(0), rows.shape)
  if collective == "reduce_scatter":
    return rows, rows.sum(0).reshape(n, size // n)
  blocks = rows[:, :size // n]
  return blocks, np.broadcast_to(blocks.reshape(-1), (n, size))


def _collective(collective: str, name: str, topology, nbytes: int, procs: np.ndarray):
  if name in _LAX:
    return _LAX[name]
  algorithm, chunks = split_depth(name)
  if chunks is None:
    return lambda b: _JAXCC[collective](b, "x", algorithm=name, topology=topology)
  sched = jaxcc.plan(collective, nbytes, topology, algorithm, chunks=chunks)
  return lambda b: native_executor.run_schedule(b, sched, "x", (), procs, topology)


if __name__ == "__main__":
  main()
