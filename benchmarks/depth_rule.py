"""The pipeline depth rule against the simulator's best depth, and against the 64 KiB floor.

For all_reduce with one or two stragglers (rank 1 at 0.5, rank p/2 at 0.75)
on p in {4, 8, 16, 32, 64} ranks, ports of 25 GB/s (a 200 Gb/s NIC) and of
25 MB/s (the testbed's 200 Mbit/s), buffers of 8 and 256 MiB per rank, message
costs of 5 us and 30 us (jaxcc's TCP transport, ``topology.MESSAGE_COST``),
and OptCC, direct and ring: the depth ``planner.depth`` picks, the depth the
simulator times fastest among 1, 2, 4, ..., 256 chunks (``--max-depth``), and
the old rule's (the largest power of two with pieces of at least 64 KiB), each
as simulated time over the lower bound (which charges one message cost per
port: ``jaxcc.sim.lower_bound``). Prints the table and the worst and mean of
rule / best and rule / old; writes ``depth_rule.json`` next to this file (or
``--json``). Run: ``.venv/bin/python benchmarks/depth_rule.py`` (about 3
minutes on 2 cores; ``--ps 4 8`` for a quick run).

Measured: of 240 cases the rule's depth is the simulated best in 193; rule /
best mean 1.0009, worst 1.0476 (p = 64, 25 GB/s, 256 MiB, 5 us: OptCC's grid
form at 8 chunks where 16 are best, as ``sim.model.FILL_GRID`` is an average
over p); rule / 64 KiB floor mean 0.709, worst 1.011 (a ring at p = 64 on
25 MB/s ports, 8 MiB, 30 us: 8 chunks against 2), best 0.107.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import numpy as np

from jaxcc import Topology, plan, planner
from jaxcc.sim import lower_bound, simulate

MiB = 1 << 20
OLD_MIN_PIECE_BYTES = 64 << 10


def old_depth(nbytes: int, p: int) -> int:
  """The former default: the largest power of two up to 1024 with pieces of >= 64 KiB."""
  k = 1
  while 2 * k <= 1024 and nbytes / p / (2 * k) >= OLD_MIN_PIECE_BYTES:
    k *= 2
  return k


def case(p, bandwidth, nbytes, cost, stragglers, algorithm, max_depth):
  topo = Topology.uniform(p, bandwidth, message_cost=cost)
  for rank, fraction in ((1, 0.5), (p // 2, 0.75))[:stragglers]:
    topo = topo.with_straggler(rank, fraction)
  bound = lower_bound("all_reduce", nbytes, topo)
  rule = planner.depth("all_reduce", nbytes // 4, 4, topo, algorithm)
  old = old_depth(nbytes, p)
  depths = sorted({1 << i for i in range(max_depth.bit_length())} | {rule, old})
  times = {k: simulate(plan("all_reduce", nbytes, topo, algorithm, chunks=k), topo).time
           for k in depths}
  best = min(times, key=times.get)
  return dict(p=p, bandwidth=bandwidth, nbytes=nbytes, message_cost=cost,
              stragglers=stragglers, algorithm=algorithm, rule=rule, best=best, old=old,
              rule_over_bound=times[rule] / bound, best_over_bound=times[best] / bound,
              old_over_bound=times[old] / bound, rule_over_best=times[rule] / times[best],
              rule_over_old=times[rule] / times[old])


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--ps", type=int, nargs="+", default=[4, 8, 16, 32, 64])
  parser.add_argument("--max-depth", type=int, default=256)
  parser.add_argument("--json", type=pathlib.Path,
                      default=pathlib.Path(__file__).with_name("depth_rule.json"))
  args = parser.parse_args()
  start = time.time()
  rows = []
  print(f"{'p':>3} {'port':>8} {'MiB':>4} {'o us':>5} {'str':>3} {'algorithm':>9} | "
        f"{'K rule':>6} {'best':>5} {'old':>5} | {'rule/LB':>8} {'best/LB':>8} {'old/LB':>8} | "
        f"{'rule/best':>9} {'rule/old':>8}")
  for p in args.ps:
    for bandwidth in (25e9, 25e6):
      for nbytes in (8 * MiB, 256 * MiB):
        for cost in (5e-6, 30e-6):
          for stragglers in (1, 2):
            for algorithm in ("optcc", "direct", "ring"):
              r = case(p, bandwidth, nbytes, cost, stragglers, algorithm, args.max_depth)
              rows.append(r)
              print(f"{p:>3} {bandwidth / 1e9:>6g}GB {nbytes // MiB:>4} {cost * 1e6:>5g} "
                    f"{stragglers:>3} {algorithm:>9} | {r['rule']:>6} {r['best']:>5} "
                    f"{r['old']:>5} | {r['rule_over_bound']:>8.4f} "
                    f"{r['best_over_bound']:>8.4f} {r['old_over_bound']:>8.4f} | "
                    f"{r['rule_over_best']:>9.4f} {r['rule_over_old']:>8.4f}", flush=True)
  over_best = np.array([r["rule_over_best"] for r in rows])
  over_old = np.array([r["rule_over_old"] for r in rows])
  summary = dict(cases=len(rows), rule_is_best=int((over_best == 1).sum()),
                 rule_over_best_mean=float(over_best.mean()),
                 rule_over_best_worst=float(over_best.max()),
                 rule_over_old_mean=float(over_old.mean()),
                 rule_over_old_worst=float(over_old.max()),
                 rule_over_old_best=float(over_old.min()), seconds=time.time() - start)
  print(f"\n{summary['cases']} cases: the rule's depth is the simulated best in "
        f"{summary['rule_is_best']}; rule / best mean {summary['rule_over_best_mean']:.4f}, "
        f"worst {summary['rule_over_best_worst']:.4f}; rule / 64 KiB floor mean "
        f"{summary['rule_over_old_mean']:.4f}, worst {summary['rule_over_old_worst']:.4f}, "
        f"best {summary['rule_over_old_best']:.4f} ({summary['seconds']:.0f} s)")
  args.json.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
  print(f"wrote {args.json}")


if __name__ == "__main__":
  main()
