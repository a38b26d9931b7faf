"""The cost of ``JAXCC_TCP_INTEGRITY=hmac`` (an HMAC-SHA256 per TCP frame), measured side by side.

Runs ``native_tcp.py``'s all_reduce (gloo psum beside the native ring, direct
and optcc over jaxcc's TCP transport) twice, with integrity off and with
hmac, on loopback and (as root, ``--testbed``) on the emulated cluster of
``jaxcc.testbed`` at each of ``--rates``, and prints each native algorithm's
time with hmac over its time without (the gloo psum in each run shows the
run's noise). Every process hashes all it sends and receives on its progress
thread, so where the processes share few cores the cost is CPU time.

Writes ``tcp_integrity.json`` next to this file (or under ``--out``). Run:
``.venv/bin/python benchmarks/tcp_integrity.py [--testbed --rates 1gbit,200mbit]``.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import native_tcp

MODES = ("off", "hmac")


def measure(where: str, nproc: int, mib: int, reps: int, rate: str | None) -> list[dict]:
  """One row per algorithm: the median times with integrity off and hmac, and their ratio."""
  runs = {}
  for mode in MODES:
    env = {"JAXCC_TCP_INTEGRITY": mode}
    if where == "testbed":
      from jaxcc.testbed import Cluster
      with Cluster(nproc, rate=rate) as cluster:
        runs[mode] = native_tcp.run(nproc, mib, reps, env=env, cluster=cluster)
    else:
      runs[mode] = native_tcp.run(nproc, mib, reps, env=env)
  rows = []
  for off, on in zip(runs["off"]["rows"], runs["hmac"]["rows"]):
    rows.append({"where": where, "rate": rate if where == "testbed" else None,
                 "algorithm": off["algorithm"], "off_s": off["median_s"], "hmac_s": on["median_s"],
                 "hmac_over_off": on["median_s"] / off["median_s"]})
  return rows


def table(rows: list[dict], mib: int, nproc: int) -> str:
  lines = [f"all_reduce of {mib} MiB float32 per rank, {nproc} processes x 1 CPU device; "
           "median time with JAXCC_TCP_INTEGRITY=off and =hmac",
           "| where | algorithm | off | hmac | hmac / off |", "| --- | --- | --- | --- | --- |"]
  for r in rows:
    where = f"testbed {r['rate']}" if r["rate"] else r["where"]
    lines.append(f"| {where} | {r['algorithm']} | {r['off_s'] * 1e3:.1f} ms | "
                 f"{r['hmac_s'] * 1e3:.1f} ms | {r['hmac_over_off']:.3f} |")
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--nproc", type=int, default=4)
  parser.add_argument("--mib", type=int, default=16)
  parser.add_argument("--reps", type=int, default=7)
  parser.add_argument("--testbed", action="store_true", help="also on the emulated cluster (root)")
  parser.add_argument("--rates", default="1gbit,200mbit", help="the testbed's link rates")
  parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path(__file__).parent)
  args = parser.parse_args()
  rows = measure("loopback", args.nproc, args.mib, args.reps, None)
  for rate in args.rates.split(",") if args.testbed else ():
    rows += measure("testbed", args.nproc, args.mib, args.reps, rate)
  print(table(rows, args.mib, args.nproc))
  args.out.mkdir(parents=True, exist_ok=True)
  path = args.out / "tcp_integrity.json"
  path.write_text(json.dumps({"nproc": args.nproc, "mib_per_rank": args.mib, "reps": args.reps,
                              "rows": rows}, indent=1) + "\n")
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
