"""Hierarchical all_reduce across processes on loopback: each level on its engine, measured.

One run starts 4 jax.distributed processes with 2 CPU devices each (each
process one cluster of 2 ranks) on 127.0.0.1 and times an all_reduce of
``--mib`` MiB float32 per rank:

* ``lax.psum`` over ("dcn", "ici") (XLA's CPU collectives, gloo across processes);
* hierarchical over ("dcn", "ici") with ``JAXCC_INTRA_ENGINE=xla``: the
  intra-cluster phases on XLA's all_to_all / all_gather, the cross-cluster
  phase on jaxcc's TCP transport (the border executor);
* hierarchical over one axis "x" with the same clusters given as a topology:
  the whole schedule natively over TCP, the in-process pairs included;
* the native ring over "x".

Loopback has no slow link: this measures what the engines cost, not what the
hierarchy saves across a slow one (the testbed does that). A sample's time is
the slowest process'; the table gives medians of ``--reps``.

Writes ``hierarchical_loopback.json`` next to this file (or under ``--out``).
Run: ``.venv/bin/python benchmarks/hierarchical_loopback.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import time

MiB = 1 << 20
VARIANTS = ("gloo psum", "hierarchical, intra on XLA", "hierarchical, all native",
            "native ring")


def worker(mib: int, reps: int) -> None:
  """One process: time every variant; print one JSON line of per-sample seconds."""
  import jax
  import numpy as np
  from jax import lax
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  import jaxcc
  from jaxcc.launcher import join

  os.environ["JAXCC_INTRA_ENGINE"] = "xla"  # the border executor where it applies
  nproc, local = join().num_processes, jax.local_device_count()
  p = nproc * local
  axes = ("dcn", "ici")
  mesh2 = jax.make_mesh((nproc, local), axes)
  mesh1 = jax.make_mesh((p,), ("x",))
  topo = jaxcc.Topology.clusters([local] * nproc, 25e9, 25e9)  # the tuple axes' default
  n = mib * MiB // 4
  host = np.random.default_rng(0).normal(size=(p * n,)).astype(np.float32)
  x2 = jax.make_array_from_callback(host.shape, NamedSharding(mesh2, P(axes)), lambda i: host[i])
  x1 = jax.make_array_from_callback(host.shape, NamedSharding(mesh1, P("x")), lambda i: host[i])

  def smap(fn, mesh, spec):
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P(spec), out_specs=P(spec),
                                 check_vma=False))

  fns = {
      "gloo psum": (smap(lambda b: lax.psum(b, axes), mesh2, axes), x2),
      "hierarchical, intra on XLA": (smap(lambda b: jaxcc.all_reduce(
          b, axes, algorithm="hierarchical"), mesh2, axes), x2),
      "hierarchical, all native": (smap(lambda b: jaxcc.all_reduce(
          b, "x", algorithm="hierarchical", topology=topo), mesh1, "x"), x1),
      "native ring": (smap(lambda b: jaxcc.all_reduce(b, "x", algorithm="ring"), mesh1, "x"),
                      x1),
  }
  line_up = jax.jit(jax.shard_map(lambda b: lax.psum(b[:1], "x"), mesh=mesh1, in_specs=P("x"),
                                  out_specs=P()))
  want = np.asarray(fns["gloo psum"][0](x2).addressable_shards[0].data)
  for name, (f, x) in fns.items():  # compile, connect, warm up, check
    got = np.asarray(f(x).addressable_shards[0].data)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3, err_msg=name)
    f(x).block_until_ready()
  samples = {name: [] for name in fns}
  for _ in range(reps):
    for name, (f, x) in fns.items():
      line_up(x1).block_until_ready()
      start = time.perf_counter()
      f(x).block_until_ready()
      samples[name].append(time.perf_counter() - start)
  print(json.dumps(samples), flush=True)
  jax.distributed.shutdown()


def run(nproc: int, mib: int, reps: int) -> dict:
  import numpy as np

  from jaxcc.launcher import launch
  per_process = [pr.json() for pr in launch(__file__, ["--worker", "--mib", str(mib),
                                                       "--reps", str(reps)],
                                            nproc=nproc, local_devices=2, timeout_s=900)]
  rows = []
  for name in VARIANTS:
    slowest = np.max([pp[name] for pp in per_process], axis=0)
    rows.append({"variant": name, "median_s": float(np.median(slowest)),
                 "samples_s": slowest.tolist()})
  for row in rows:
    row["vs_gloo_psum"] = rows[0]["median_s"] / row["median_s"]
  return {"nproc": nproc, "devices_per_process": 2, "mib_per_rank": mib, "reps": reps,
          "host": f"{platform.node()}: {os.cpu_count()} CPUs, Linux {platform.release()}",
          "rows": rows}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--nproc", type=int, default=4)
  parser.add_argument("--mib", type=int, default=16)
  parser.add_argument("--reps", type=int, default=7)
  parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path(__file__).parent)
  parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker:
    worker(args.mib, args.reps)
    return
  result = run(args.nproc, args.mib, args.reps)
  print(f"all_reduce of {args.mib} MiB float32 per rank, {args.nproc} processes x 2 CPU "
        f"devices on loopback, median of {args.reps}")
  print("| variant | median | speed vs gloo psum |\n| --- | --- | --- |")
  for row in result["rows"]:
    print(f"| {row['variant']} | {row['median_s'] * 1e3:.1f} ms | {row['vs_gloo_psum']:.2f}x |")
  args.out.mkdir(parents=True, exist_ok=True)
  (args.out / "hierarchical_loopback.json").write_text(json.dumps(result, indent=1) + "\n")
  print(f"wrote {args.out / 'hierarchical_loopback.json'}")


if __name__ == "__main__":
  main()
