"""The native executor over TCP against XLA's own psum (gloo), across processes on loopback.

One run starts 4 jax.distributed processes with 1 CPU device each on
127.0.0.1 and times an all_reduce of a float32 array of ``--mib`` MiB per
rank (default 16): ``lax.psum`` (XLA's CPU collectives over gloo) and
``jaxcc.all_reduce(..., executor="native")`` with ring, direct and optcc
(the TCP transport). Each sample starts right after a tiny psum that lines the
processes up; a sample's time is the slowest process'; the table gives the
median of ``--reps`` samples (default 5) after a warm-up, as algorithm
bandwidth (bytes per rank / time) and as throughput relative to gloo.

Writes ``native_tcp.json`` and ``native_tcp.png`` next to this file (or under
``--out``). Run: ``.venv/bin/python benchmarks/native_tcp.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import time

MiB = 1 << 20
ALGORITHMS = ("gloo psum", "native ring", "native direct", "native optcc")


def worker(mib: int, reps: int) -> None:
  """One process: time every algorithm; print one JSON line of per-sample seconds."""
  import jax
  import numpy as np
  from jax import lax
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  import jaxcc
  from jaxcc.launcher import join

  nproc = join().num_processes
  mesh = jax.make_mesh((nproc,), ("x",))
  n = mib * MiB // 4
  host = np.random.default_rng(0).normal(size=(nproc * n,)).astype(np.float32)
  x = jax.make_array_from_callback(host.shape, NamedSharding(mesh, P("x")), lambda i: host[i])
  line_up = jax.jit(jax.shard_map(lambda b: lax.psum(b[:1], "x"), mesh=mesh, in_specs=P("x"),
                                  out_specs=P()))

  def smap(fn):
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("x"), out_specs=P()))

  fns = {"gloo psum": smap(lambda b: lax.psum(b, "x"))}
  for alg in ("ring", "direct", "optcc"):
    fns[f"native {alg}"] = smap(lambda b, a=alg: jaxcc.all_reduce(b, "x", algorithm=a,
                                                                 executor="native"))
  want = np.asarray(fns["gloo psum"](x).addressable_shards[0].data)
  for name, f in fns.items():  # compile, connect, warm up, check
    got = np.asarray(f(x).addressable_shards[0].data)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3, err_msg=name)
    f(x).block_until_ready()
  samples = {name: [] for name in fns}
  for _ in range(reps):
    for name, f in fns.items():
      line_up(x).block_until_ready()
      start = time.perf_counter()
      f(x).block_until_ready()
      samples[name].append(time.perf_counter() - start)
  print(json.dumps(samples), flush=True)
  jax.distributed.shutdown()


def run(nproc: int, mib: int, reps: int, env: dict | None = None, cluster=None) -> dict:
  """Start the processes; return the per-algorithm medians of the slowest process' times.

  ``env`` goes to every process; with ``cluster`` (an entered
  ``jaxcc.testbed.Cluster``) they run on its hosts instead of loopback.
  """
  import numpy as np

  from jaxcc.launcher import launch
  per_process = [p.json() for p in launch(__file__, ["--worker", "--mib", str(mib),
                                                     "--reps", str(reps)],
                                          nproc=None if cluster else nproc, cluster=cluster,
                                          env=env, timeout_s=900)]
  rows = []
  nbytes = mib * MiB
  for name in ALGORITHMS:
    slowest = np.max([pp[name] for pp in per_process], axis=0)
    rows.append({"algorithm": name, "median_s": float(np.median(slowest)),
                 "samples_s": slowest.tolist(), "algbw_gbps": nbytes / np.median(slowest) / 1e9})
  gloo = rows[0]["median_s"]
  for row in rows:
    row["throughput_vs_gloo"] = gloo / row["median_s"]
  return {"nproc": nproc, "devices_per_process": 1, "mib_per_rank": mib, "reps": reps,
          "host": f"{platform.node()}: {os.cpu_count()} CPUs, Linux {platform.release()}",
          "rows": rows}


def table(result: dict) -> str:
  lines = [f"all_reduce of {result['mib_per_rank']} MiB float32 per rank, {result['nproc']} "
           f"processes x 1 CPU device on loopback, median of {result['reps']}",
           "| algorithm | median | algbw | throughput vs gloo psum |", "| --- | --- | --- | --- |"]
  for row in result["rows"]:
    lines.append(f"| {row['algorithm']} | {row['median_s'] * 1e3:.1f} ms | "
                 f"{row['algbw_gbps']:.2f} GB/s | {row['throughput_vs_gloo']:.2f}x |")
  return "\n".join(lines)


def plot(result: dict, path: pathlib.Path) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  rows = result["rows"]
  fig, ax = plt.subplots(figsize=(6, 3.2))
  ax.bar([r["algorithm"] for r in rows], [r["throughput_vs_gloo"] for r in rows],
         color=["gray"] + ["tab:blue"] * (len(rows) - 1))
  ax.axhline(0.9, color="tab:red", ls="--", lw=1, label="0.9x gloo")
  ax.set_ylabel("throughput / gloo psum")
  ax.set_title(f"all_reduce {result['mib_per_rank']} MiB/rank, {result['nproc']} processes, "
               "loopback TCP")
  ax.legend(loc="lower right")
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--nproc", type=int, default=4)
  parser.add_argument("--mib", type=int, default=16)
  parser.add_argument("--reps", type=int, default=5)
  parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path(__file__).parent)
  parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker:
    worker(args.mib, args.reps)
    return
  from jaxcc.bench import extras
  extras.require("benchmarks/native_tcp.py", "matplotlib")
  result = run(args.nproc, args.mib, args.reps)
  print(table(result))
  args.out.mkdir(parents=True, exist_ok=True)
  (args.out / "native_tcp.json").write_text(json.dumps(result, indent=1) + "\n")
  plot(result, args.out / "native_tcp.png")
  print(f"wrote {args.out / 'native_tcp.json'} and {args.out / 'native_tcp.png'}")


if __name__ == "__main__":
  main()
