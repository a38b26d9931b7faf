"""Hierarchical collectives on testbed clusters: two clusters across a slow link.

Runs ``jaxcc.bench.collective`` on the testbed for all_reduce, reduce_scatter
and all_gather on clusters 4+4 and 3+5 (200 Mbit/s inside a cluster,
20 Mbit/s per rank across, 8 MiB float32 per rank): the lax twin (XLA's,
over gloo), ring and hierarchical, median of 3, with the bytes every rank
sent across clusters counted by the kernel; then all_reduce on 4+4 with one
border rank's cross-cluster port at half rate. Prints the tables and the
issue's ratios (hierarchical vs lax and ring, vs the clustered bound,
measured vs expected cross-cluster bytes); writes ``testbed_clusters.json``
and ``testbed_clusters.png`` next to this file (or under ``--out``).

Run as root: ``.venv/bin/python benchmarks/testbed_clusters.py`` (about 9 minutes).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

from jaxcc.bench import collective, extras, report

RUNS = [(name, sizes, {}) for sizes in ((4, 4), (3, 5))
        for name in ("all_reduce", "reduce_scatter", "all_gather")]
RUNS.append(("all_reduce", (4, 4), {4: 0.5}))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rate", default="200mbit")
  parser.add_argument("--inter-rate", default="20mbit")
  parser.add_argument("--mib", type=int, default=8, help="MiB of float32 per rank (default 8)")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path(__file__).parent)
  args = parser.parse_args()
  extras.require("benchmarks/testbed_clusters.py", "matplotlib")
  start = time.time()
  rows = []
  for name, sizes, inter_stragglers in RUNS:
    got = collective.run(name, sum(sizes), args.mib << 20, rate=args.rate,
                         configurations=[({}, inter_stragglers)], repeats=args.repeats,
                         testbed=True, clusters=sizes, inter_rate=args.inter_rate)
    print(report.table(got), flush=True)
    rows += got
  print(checks(rows))
  args.out.mkdir(parents=True, exist_ok=True)
  report.write_json({"command": " ".join(["benchmarks/testbed_clusters.py", *sys.argv[1:]]),
                     "seconds": time.time() - start, "rows": rows},
                    args.out / "testbed_clusters.json")
  plot(rows, args.out / "testbed_clusters.png")
  print(f"wrote {args.out / 'testbed_clusters.json'} and testbed_clusters.png in "
        f"{time.time() - start:.0f} s")


def checks(rows: list[dict]) -> str:
  """Per run: lax / hierarchical, ring / hierarchical, hierarchical / bound, bytes ratio."""
  lines = ["| collective | clusters | inter stragglers | lax / hier | ring / hier "
           "| hier / bound | hier cross bytes measured / expected |", "| --- " * 7 + "|"]
  for name, sizes, inter in RUNS:
    run = {r["algorithm"]: r for r in rows if r["collective"] == name and
           tuple(r["clusters"]) == sizes and r["inter_stragglers"] == inter}
    hier, lax = run["hierarchical"], run[collective.BASELINES[name]]
    lines.append(
        f"| {name} | {'+'.join(map(str, sizes))} | {report.format_stragglers(inter)} "
        f"| {lax['measured_s'] / hier['measured_s']:.2f} "
        f"| {run['ring']['measured_s'] / hier['measured_s']:.2f} "
        f"| {hier['measured_s'] / hier['lower_bound_s']:.3f} "
        f"| {hier['inter_cluster_bytes_measured'] / hier['inter_cluster_bytes_expected']:.4f} |")
  return "\n".join(lines)


def plot(rows: list[dict], path: pathlib.Path) -> None:
  """Bars of measured time / clustered lower bound per run and algorithm."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  labels = [f"{n}\n{'+'.join(map(str, s))}{' inter ' + report.format_stragglers(i) if i else ''}"
            for n, s, i in RUNS]
  fig, ax = plt.subplots(figsize=(10, 4))
  for k, alg in enumerate(("lax", "ring", "hierarchical")):
    heights = []
    for name, sizes, inter in RUNS:
      want = collective.BASELINES[name] if alg == "lax" else alg
      r = next(r for r in rows if r["collective"] == name and tuple(r["clusters"]) == sizes
               and r["inter_stragglers"] == inter and r["algorithm"] == want)
      heights.append(r["measured_s"] / r["lower_bound_s"])
    ax.bar([i + (k - 1) * 0.27 for i in range(len(RUNS))], heights, 0.27, label=alg)
  ax.axhline(1.0, color="tab:red", ls="--", lw=1, label="clustered lower bound")
  ax.set_xticks(range(len(RUNS)), labels, fontsize=7)
  ax.set_ylabel("time / lower bound")
  ax.set_title("testbed clusters: 200 Mbit/s inside, 20 Mbit/s per rank across, 8 MiB/rank",
               fontsize=10)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


if __name__ == "__main__":
  main()
