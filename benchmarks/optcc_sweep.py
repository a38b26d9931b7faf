"""OptCC's random sweep: its time over the lower bound in 240 cases, against the project's best.

Cases: 36 draws of ``numpy.random.default_rng(0)``, each ``p`` uniform in
4..64 and 1-3 stragglers at distinct ranks, each at a fraction of {0.3, 0.5,
0.75, 0.9}; and the set "distinct speeds": p = 20 with stragglers of several
speeds (owners at 0.9, 0.8, 0.7 and 0.6 without a leaf, and three mixes of
owners of distinct speeds and a leaf). Each at K = 4, 16 and 64 chunks and
latency 0 and 5 us: 216 + 24 cases, 25 GB/s ports, 64 MiB per rank (float32).
The ratio is ``simulate(plan(..., "optcc", chunks=K)).time / lower_bound``
(1.0 is optimal) in the alpha-beta model: where ``Topology.uniform`` takes a
``message_cost``, it is 0.

The baseline of a case is the best ratio of the runs recorded in
``--baseline`` (``optcc_sweep_history.json`` beside this file: commits
469ae6e, 87cfa8b, 5399ee7, c0fe2f6 and 065f9a4). A case is worse than the
best above a relative ``TOLERANCE``. A run writes ``optcc_sweep.json`` (per
case the ratio now, each commit's, the best and the commits that reach it) and
``optcc_sweep.png`` under ``--out``; with ``--record NAME`` it adds its ratios
to ``--baseline`` under NAME instead. 13 s on 2 cores with the native
simulator; about 2 minutes with the Python one (commits before c0fe2f6).

Run: ``.venv/bin/python benchmarks/optcc_sweep.py``. To record a commit:
``git worktree add /tmp/wt SHA``, then ``.venv/bin/python
benchmarks/optcc_sweep.py --checkout /tmp/wt --record SHA``, with the CPU
module built from that commit copied into ``/tmp/wt/jaxcc`` where its
simulator calls it.
"""

from __future__ import annotations

import argparse
import inspect
import json
import pathlib
import sys
import time

import numpy as np

HERE = pathlib.Path(__file__).parent
BANDWIDTH, NBYTES = 25e9, 64 << 20
CHUNKS, LATENCIES = (4, 16, 64), (0.0, 5e-6)
FRACTIONS = (0.3, 0.5, 0.75, 0.9)
DISTINCT = ({0: 0.9, 5: 0.8, 10: 0.7, 15: 0.6},
            {1: 0.9, 6: 0.75, 11: 0.6, 16: 0.3},
            {2: 0.8, 7: 0.6, 12: 0.3},
            {3: 0.9, 8: 0.7, 13: 0.5, 18: 0.3})
TOLERANCE = 1e-6


def draws(count: int = 36, seed: int = 0) -> list[tuple[int, dict[int, float]]]:
  """``count`` random ``(p, {rank: fraction})``."""
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(count):
    p = int(rng.integers(4, 65))
    ranks = rng.choice(p, int(rng.integers(1, 4)), replace=False)
    out.append((p, {int(r): float(rng.choice(FRACTIONS)) for r in sorted(ranks)}))
  return out


def cases() -> list[dict]:
  """Every case: set, p, stragglers, chunks, latency and its key."""
  sets = [("random", p, s) for p, s in draws()] + [("distinct speeds", 20, s) for s in DISTINCT]
  out = []
  for name, p, stragglers in sets:
    for k in CHUNKS:
      for latency in LATENCIES:
        slow = ",".join(f"{r}:{f:g}" for r, f in stragglers.items())
        out.append({"set": name, "p": p, "stragglers": stragglers, "chunks": k,
                    "latency": latency, "key": f"p{p} {slow} K{k} lat{latency * 1e6:g}us"})
  return out


def use_checkout(path: pathlib.Path) -> None:
  """Makes ``import jaxcc`` take the package under ``path``, ahead of an editable install's
  import hook (which PYTHONPATH does not pass)."""
  sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__]
  sys.path.insert(0, str(path))


def ratio(case: dict, fluid: dict) -> float:
  """OptCC's simulated time over the all_reduce lower bound."""
  from jaxcc import Topology, plan
  from jaxcc.sim import lower_bound, simulate
  topo = Topology.uniform(case["p"], BANDWIDTH, case["latency"], **fluid)
  for rank, fraction in case["stragglers"].items():
    topo = topo.with_straggler(rank, fraction)
  sched = plan("all_reduce", NBYTES, topo, "optcc", chunks=case["chunks"])
  return simulate(sched, topo).time / lower_bound("all_reduce", NBYTES, topo)


def compare(rows: list[dict], runs: dict[str, dict[str, float]]) -> None:
  """Adds to each row its commits' ratios, the best, the commits reaching it and ``worse``."""
  for row in rows:
    row["history"] = {name: run[row["key"]] for name, run in runs.items() if row["key"] in run}
    if not row["history"]:
      continue
    row["best"] = min(row["history"].values())
    row["best_of"] = [n for n, r in row["history"].items() if r <= row["best"] * (1 + TOLERANCE)]
    row["worse"] = row["ratio"] > row["best"] * (1 + TOLERANCE)


def summary(rows: list[dict]) -> str:
  """Worst and mean ratio per K and latency and overall, now and at the best commit."""
  base = any("best" in r for r in rows)
  head = "| K | latency | cases | worst | mean |" + (" best worst | best mean | worse |"
                                                     if base else "")
  lines = [head, "|---" * (head.count("|") - 1) + "|"]
  groups = [(k, lat) for k in CHUNKS for lat in LATENCIES] + [(None, None)]
  for k, lat in groups:
    sub = [r for r in rows if k is None or (r["chunks"], r["latency"]) == (k, lat)]
    now = np.array([r["ratio"] for r in sub])
    line = (f"| {k or 'all'} | {'all' if lat is None else f'{lat * 1e6:g} us'} | {len(sub)} "
            f"| {now.max():.4f} | {now.mean():.4f} |")
    if base:
      best = np.array([r.get("best", r["ratio"]) for r in sub])
      line += f" {best.max():.4f} | {best.mean():.4f} | {sum(r.get('worse', 0) for r in sub)} |"
    lines.append(line)
  return "\n".join(lines)


def plot(rows: list[dict], path: pathlib.Path) -> None:
  """A PNG: per case the ratio now and at the best commit, and their quotient, against p."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
  for k, color in zip(CHUNKS, ("C0", "C1", "C2")):
    sub = [r for r in rows if r["chunks"] == k]
    p = [r["p"] + (0.3 if r["latency"] else 0) for r in sub]
    axes[0].scatter(p, [r["ratio"] for r in sub], s=14, color=color, label=f"K = {k}")
    axes[0].scatter(p, [r.get("best", np.nan) for r in sub], s=40, facecolors="none",
                    edgecolors=color, linewidths=0.8)
    axes[1].scatter(p, [r["ratio"] / r.get("best", np.nan) for r in sub], s=14, color=color,
                    label=f"K = {k}")
  axes[0].set_ylabel("optcc time / lower bound (dots: now, rings: best commit)")
  axes[1].axhline(1.0, color="k", linewidth=0.6)
  axes[1].set_ylabel("now / best commit")
  for ax in axes:
    ax.set_xlabel("ranks p (latency 5 us shifted right)")
    ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", type=pathlib.Path, default=HERE)
  parser.add_argument("--baseline", type=pathlib.Path, default=HERE / "optcc_sweep_history.json",
                      help="recorded runs: {name: {case key: ratio}}")
  parser.add_argument("--record", metavar="NAME",
                      help="add this run to --baseline under NAME (no JSON or PNG written)")
  parser.add_argument("--checkout", type=pathlib.Path,
                      help="measure the jaxcc of this checkout (a worktree of an older commit)")
  args = parser.parse_args()
  if args.checkout:
    use_checkout(args.checkout)
  import jaxcc
  if not args.record:
    from jaxcc.bench import extras
    extras.require("benchmarks/optcc_sweep.py", "matplotlib")
  start = time.time()
  # The alpha-beta model on versions with a per-message port cost; none before it.
  params = inspect.signature(jaxcc.Topology.uniform).parameters
  fluid = {"message_cost": 0.0} if "message_cost" in params else {}
  print(f"jaxcc from {pathlib.Path(jaxcc.__file__).parent}, message_cost "
        f"{'0' if fluid else 'absent'}", flush=True)
  rows = cases()
  for row in rows:
    row["ratio"] = ratio(row, fluid)
  runs = json.loads(args.baseline.read_text()) if args.baseline.exists() else {}
  if args.record:
    runs[args.record] = {r["key"]: r["ratio"] for r in rows}
    args.baseline.write_text(json.dumps(runs, indent=1) + "\n")
  compare(rows, {n: r for n, r in runs.items() if n != args.record})
  print(summary(rows))
  differ = [r for r in rows if "best" in r and abs(r["ratio"] / r["best"] - 1) > TOLERANCE]
  if any("best" in r for r in rows):
    print(f"\n{sum(r['worse'] for r in differ)} of {len(rows)} cases worse than the best commit, "
          f"{len(differ) - sum(r['worse'] for r in differ)} better, the rest equal:")
  for r in sorted(differ, key=lambda r: r["best"] / r["ratio"]):
    print(f"  {r['set']:15s} {r['key']:40s} now {r['ratio']:.4f}  best {r['best']:.4f} "
          f"({','.join(r['best_of'])})  {r['ratio'] / r['best'] - 1:+.3%}")
  if args.record:
    print(f"\nrecorded {args.record} in {args.baseline} in {time.time() - start:.0f} s")
    return
  args.out.mkdir(parents=True, exist_ok=True)
  result = {"bandwidth": BANDWIDTH, "nbytes": NBYTES, "message_cost": 0.0 if fluid else None,
            "tolerance": TOLERANCE, "commits": list(runs), "cases": rows,
            "command": "benchmarks/optcc_sweep.py", "seconds": time.time() - start}
  (args.out / "optcc_sweep.json").write_text(json.dumps(result, indent=1) + "\n")
  plot(rows, args.out / "optcc_sweep.png")
  print(f"\nwrote {args.out / 'optcc_sweep.json'} and optcc_sweep.png in "
        f"{time.time() - start:.0f} s")


if __name__ == "__main__":
  main()
