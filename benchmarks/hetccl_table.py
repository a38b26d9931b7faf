"""Hierarchical (HetCCL) vs flat ring, direct and psum-as-ring over clusters, in the simulator.

For 2, 3 and 4 clusters of unequal sizes (3+5, 2+4+6, 1+3+3+5, and 4+4) at
cross-cluster : intra-cluster port ratios 1:4, 1:10 and 1:100, and for
all_reduce, reduce_scatter and all_gather: each algorithm's simulated time
over the clustered lower bound (``jaxcc.sim.lower_bound``), the bytes it moves
between clusters against the hierarchical formula (``2(C-1) N`` for an
all_reduce, ``(C-1) N`` for the others), and hierarchical's speedup over the
flat ring. "psum" is the ring in one chunk, as XLA's all-reduce runs it.

Writes ``hetccl_table.json`` and ``hetccl_table.png`` next to this file (or
under ``--out``). Run: ``.venv/bin/python benchmarks/hetccl_table.py``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

from jaxcc import Topology, plan
from jaxcc.bench import extras
from jaxcc.schedules.hierarchical import cross_cluster_bytes
from jaxcc.sim import lower_bound, simulate

MiB = 1 << 20
LAYOUTS = ([4, 4], [3, 5], [2, 4, 6], [1, 3, 3, 5])
RATIOS = (4, 10, 100)
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")
ALGORITHMS = ("hierarchical", "ring", "direct", "psum")
INTRA = 25e9  # bytes/s of each rank's port inside its cluster


def measure(collective, nbytes, topo, algorithm):
  """Simulated seconds, bytes between clusters and the depth of one algorithm."""
  if algorithm == "psum":
    sched = plan(collective, nbytes, topo, "ring", chunks=1)
  else:
    sched = plan(collective, nbytes, topo, algorithm)
  res = simulate(sched, topo)
  return res.time, res.inter_bytes, sched.chunks


def table(nbytes_per_rank, latency):
  rows = []
  for sizes in LAYOUTS:
    p = sum(sizes)
    nbytes = nbytes_per_rank // (4 * p) * (4 * p)  # equal float32 tiles
    for ratio in RATIOS:
      topo = Topology.clusters(sizes, INTRA, INTRA / ratio, latency=latency, message_cost=0.0)
      for collective in COLLECTIVES:
        bound = lower_bound(collective, nbytes, topo)
        row = {"sizes": sizes, "ratio": ratio, "collective": collective, "nbytes": nbytes,
               "latency_s": latency, "lower_bound_s": bound,
               "cross_bytes_formula": cross_cluster_bytes(collective, nbytes, len(sizes))}
        for alg in ALGORITHMS:
          t, crossed, chunks = measure(collective, nbytes, topo, alg)
          row[f"{alg}_s"], row[f"{alg}_cross_bytes"], row[f"{alg}_chunks"] = t, crossed, chunks
          row[f"{alg}_over_bound"] = t / bound
        row["speedup_over_ring"] = row["ring_s"] / row["hierarchical_s"]
        row["speedup_over_psum"] = row["psum_s"] / row["hierarchical_s"]
        rows.append(row)
        print(f"  {'+'.join(map(str, sizes)):8s} 1:{ratio:<4d} {collective:15s}"
              + "".join(f"  {a} {row[f'{a}_over_bound']:7.3f}" for a in ALGORITHMS)
              + f"   cross {row['hierarchical_cross_bytes'] / row['cross_bytes_formula']:.4f}"
              f" of formula (ring {row['ring_cross_bytes'] / row['cross_bytes_formula']:.2f})"
              f"   vs ring {row['speedup_over_ring']:5.2f}x", flush=True)
  return rows


def plot(rows, path):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, len(RATIOS), figsize=(5 * len(RATIOS), 4), sharey=True)
  sub = [r for r in rows if r["collective"] == "all_reduce"]
  labels = ["+".join(map(str, s)) for s in LAYOUTS]
  for ax, ratio in zip(axes, RATIOS):
    for alg, style in zip(ALGORITHMS, ("^-", "o-", "s-", "x--")):
      ax.plot(labels, [r[f"{alg}_over_bound"] for r in sub if r["ratio"] == ratio], style,
              label=alg)
    ax.set_title(f"all_reduce, cross : intra = 1:{ratio}")
    ax.set_xlabel("cluster sizes")
    ax.set_yscale("log")
  axes[0].set_ylabel("simulated time / clustered lower bound")
  axes[0].legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path(__file__).parent)
  parser.add_argument("--nbytes", type=int, default=64 * MiB, help="bytes per rank")
  args = parser.parse_args()
  extras.require("benchmarks/hetccl_table.py", "matplotlib")
  start = time.time()
  print(f"1. Fluid model (latency 0), {args.nbytes / MiB:.0f} MiB per rank, intra ports "
        f"{INTRA / 1e9:.0f} GB/s: time / clustered lower bound")
  fluid = table(args.nbytes, 0.0)
  print("\n2. Latency 5 us")
  lat = table(args.nbytes, 5e-6)
  worst = max(r["hierarchical_over_bound"] for r in fluid if r["collective"] == "all_reduce")
  print(f"\nhierarchical all_reduce, fluid model: worst {worst:.4f}x the clustered bound")
  args.out.mkdir(parents=True, exist_ok=True)
  result = {"intra_bandwidth": INTRA, "fluid": fluid, "latency_5us": lat,
            "command": "benchmarks/hetccl_table.py", "seconds": time.time() - start}
  (args.out / "hetccl_table.json").write_text(json.dumps(result, indent=1))
  plot(fluid, args.out / "hetccl_table.png")
  print(f"wrote {args.out / 'hetccl_table.json'} and hetccl_table.png in "
        f"{time.time() - start:.0f} s")


if __name__ == "__main__":
  main()
