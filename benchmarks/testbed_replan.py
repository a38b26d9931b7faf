"""Re-plan after a fault: a loop that probes the network every K steps regains its speed.

Two clusters of 4 testbed hosts (200 Mbit/s inside, 20 Mbit/s per host
across; needs root) run a loop of ``jaxcc.all_reduce`` (hierarchical, 8 MiB
float32 per rank) whose topology comes from ``jaxcc.probe_topology``, probed
before step 0 and again every ``--every`` steps. When step ``--fault``
starts, the parent drops host 4's cross-cluster port to half its rate
(``Cluster.set_rate``, a tc change while the loop runs). Each step's time
(the slowest process') is set against the clustered lower bound of the
network as it is at that step. Until the next probe the plan still gives host
4 a full share; after it the water-fill gives it less.

Writes ``testbed_replan.json`` next to this file (or under ``--out``). Run as
root: ``.venv/bin/python benchmarks/testbed_replan.py`` (about 2 minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import tempfile
import threading
import time

import numpy as np

CLUSTERS = (4, 4)
BORDER = 4


def worker(config: dict) -> None:
  """One process: probe, run the loop, re-probe every K steps; print per-step seconds."""
  import jax
  from jax import lax
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  import jaxcc
  from jaxcc.launcher import join

  join()
  me, n = jax.process_index(), jax.process_count()
  mesh = jax.make_mesh((n,), ("x",))
  size = config["nbytes"] // 4
  x = jax.make_array_from_callback((n, size), NamedSharding(mesh, P("x")),
                                   lambda i: np.full((1, size), i[0].start, np.float32))
  line_up = jax.jit(jax.shard_map(lambda b: lax.psum(b[:, :1], "x"), mesh=mesh,
                                  in_specs=P("x"), out_specs=P("x")))
  steps, probes, plans = [], [], {}
  topology = None
  for step in range(config["steps"]):
    if step % config["every"] == 0:
      start = time.perf_counter()
      topology = jaxcc.probe_topology(mesh, "x")
      probes.append({"step": step, "seconds": time.perf_counter() - start,
                     "inter_bandwidth": list(topology.inter_bandwidth or ())})
    if topology not in plans:  # a changed topology: one re-trace
      plans[topology] = jax.jit(jax.shard_map(
          lambda b, t=topology: jaxcc.all_reduce(b, "x", algorithm="hierarchical", topology=t),
          mesh=mesh, in_specs=P("x"), out_specs=P("x")))
      got = np.asarray(plans[topology](x).addressable_shards[0].data)
      np.testing.assert_array_equal(got, np.full_like(got, n * (n - 1) / 2))
    if me == 0:
      with open(config["progress"], "a") as f:
        f.write(f"{step}\n")
    line_up(x).block_until_ready()
    if step == config["fault"]:
      time.sleep(1.0)  # the parent's tc change lands before the step starts
      line_up(x).block_until_ready()
    start = time.perf_counter()
    plans[topology](x).block_until_ready()
    steps.append(time.perf_counter() - start)
  print(json.dumps({"process": me, "steps": steps, "probes": probes}), flush=True)
  jax.distributed.shutdown()


def run(rate: str, inter_rate: str, nbytes: int, steps: int, every: int, fault: int) -> dict:
  """The loop on the clusters; per step the slowest process' time and the bound it runs against."""
  from jaxcc import sim, testbed
  from jaxcc.launcher import launch
  testbed.require_privileges()
  cluster = testbed.Cluster(sum(CLUSTERS), rate, clusters=CLUSTERS, inter_rate=inter_rate)
  healthy = cluster.topology
  with tempfile.TemporaryDirectory() as tmp:
    progress = os.path.join(tmp, "progress")
    open(progress, "w").close()
    config = {"nbytes": nbytes, "steps": steps, "every": every, "fault": fault,
              "progress": progress}
    with cluster:
      half = cluster.inter_rates[BORDER] / 2
      watcher = threading.Thread(target=_fault_at, args=(progress, fault, cluster, half),
                                 daemon=True)
      watcher.start()
      results = [p.json() for p in launch(
          os.path.abspath(__file__), ["--worker", json.dumps(config)], cluster=cluster,
          timeout_s=900, env={"JAXCC_TIMEOUT_S": "900"})]
      faulty = cluster.topology
  slowest = np.max([r["steps"] for r in results], axis=0)
  bounds = [sim.lower_bound("all_reduce", nbytes, healthy if s < fault else faulty)
            for s in range(steps)]
  rows = [{"step": s, "seconds": float(t), "lower_bound_s": b, "ratio": float(t) / b,
           "network": "healthy" if s < fault else "border 4 at half rate"}
          for s, (t, b) in enumerate(zip(slowest, bounds))]
  return {"clusters": list(CLUSTERS), "rate": rate, "inter_rate": inter_rate, "nbytes": nbytes,
          "every": every, "fault": fault, "rows": rows, "probes": results[0]["probes"]}


def _fault_at(progress: str, fault: int, cluster, rate: float) -> None:
  """Halve the border's cross-cluster port once the loop reports step ``fault``."""
  while True:
    with open(progress) as f:
      if str(fault) in f.read().split():
        break
    time.sleep(0.02)
  cluster.set_rate(BORDER, rate, level="inter")


def table(result: dict) -> str:
  lines = [f"clusters {'+'.join(map(str, result['clusters']))}, {result['rate']} inside, "
           f"{result['inter_rate']} across, all_reduce of {result['nbytes'] >> 20} MiB per "
           f"rank; probe every {result['every']} steps; host {BORDER}'s cross-cluster port "
           f"halved at step {result['fault']}",
           "| step | network | time | lower bound | time / bound |",
           "| --- | --- | --- | --- | --- |"]
  for r in result["rows"]:
    lines.append(f"| {r['step']} | {r['network']} | {r['seconds'] * 1e3:.0f} ms "
                 f"| {r['lower_bound_s'] * 1e3:.0f} ms | {r['ratio']:.3f} |")
  lines.append("probes: " + "; ".join(
      f"step {p['step']}: {p['seconds']:.1f} s, host {BORDER} across "
      f"{p['inter_bandwidth'][BORDER] * 8e-6:.1f} Mbit/s" for p in result["probes"]))
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rate", default="200mbit")
  parser.add_argument("--inter-rate", default="20mbit")
  parser.add_argument("--mib", type=int, default=8)
  parser.add_argument("--steps", type=int, default=15)
  parser.add_argument("--every", type=int, default=5)
  parser.add_argument("--fault", type=int, default=7)
  parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path(__file__).parent)
  parser.add_argument("--worker", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker is not None:
    worker(json.loads(args.worker))
    return
  result = run(args.rate, args.inter_rate, args.mib << 20, args.steps, args.every, args.fault)
  print(table(result))
  args.out.mkdir(parents=True, exist_ok=True)
  (args.out / "testbed_replan.json").write_text(json.dumps(result, indent=1) + "\n")
  print(f"wrote {args.out}/testbed_replan.json")


if __name__ == "__main__":
  main()
