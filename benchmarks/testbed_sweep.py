"""all_reduce on the emulated cluster: one straggler at b in {1, 0.875, 0.75, 0.5}, then two.

Calibrates the links first (``jaxcc.bench.calibration``), then runs
``jaxcc.bench.collective`` (all_reduce) on the testbed for psum (XLA's, over gloo), ring,
direct, optcc and r2ccl: the fault-free cluster, rank 3 at each b, and ranks
1 and 3 both at 0.75 and both at 0.5. Defaults: 4 ranks at 200 Mbit/s and
8 MiB float32 per rank, which keep the 2 cores of a CI machine network-bound
(research/testbed.md). Prints the calibration, the full table, and the summary
and checks the README quotes; writes ``testbed_sweep.json`` and
``testbed_sweep.png`` next to this file (or under ``--out``).

Run as root: ``nice -n 5 .venv/bin/python benchmarks/testbed_sweep.py`` (about 4 minutes).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

from jaxcc.bench import calibration, collective, extras, report
from jaxcc.testbed import Cluster

CONFIGURATIONS = ({}, {3: 0.875}, {3: 0.75}, {3: 0.5}, {1: 0.75, 3: 0.75}, {1: 0.5, 3: 0.5})


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--ranks", type=int, default=4)
  parser.add_argument("--rate", default="200mbit")
  parser.add_argument("--mib", type=int, default=8, help="MiB of float32 per rank (default 8)")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path(__file__).parent)
  args = parser.parse_args()
  extras.require("benchmarks/testbed_sweep.py", "matplotlib")
  start = time.time()
  with Cluster(args.ranks, args.rate) as cluster:
    calib = calibration.calibrate(cluster)
  print(report.calibration_table(calib), flush=True)
  rows = collective.run("all_reduce", args.ranks, args.mib << 20, rate=args.rate,
                        configurations=CONFIGURATIONS, repeats=args.repeats, testbed=True,
                        link_efficiency=calib["efficiency"])
  print(report.table(rows))
  print(report.summary(rows))
  print(checks(rows))
  args.out.mkdir(parents=True, exist_ok=True)
  report.write_json({"command": " ".join(["benchmarks/testbed_sweep.py", *sys.argv[1:]]),
                     "seconds": time.time() - start, "calibration": calib, "rows": rows},
                    args.out / "testbed_sweep.json")
  report.plot(rows, args.out / "testbed_sweep.png")
  print(f"wrote {args.out / 'testbed_sweep.json'} and testbed_sweep.png in "
        f"{time.time() - start:.0f} s")


def checks(rows: list[dict]) -> str:
  """The issue's claims as measured: psum's efficiency, optcc / bound, ring / (T_ff/b), sim."""
  def spread(alg, ratio):
    values = [ratio(r) for r in rows if r["algorithm"] == alg]
    return f"{min(values):.2f}-{max(values):.2f}" if values else "n/a"

  psum = rows[0]["fault_free_psum_s"]
  sim = [r["simulated_s"] / r["measured_s"] for r in rows]
  return "\n".join([
      f"fault-free psum reaches {rows[0]['t_ff_s'] / psum:.1%} of the link-rate bound T_ff",
      f"optcc / lower bound: {spread('optcc', lambda r: r['measured_s'] / r['lower_bound_s'])}",
      f"psum / (T_ff/b): {spread('psum', lambda r: r['measured_s'] / r['t_ff_over_b_s'])}; "
      f"ring / (T_ff/b): {spread('ring', lambda r: r['measured_s'] / r['t_ff_over_b_s'])}",
      f"simulated / measured: {min(sim):.2f}-{max(sim):.2f} over every row"])


if __name__ == "__main__":
  main()
