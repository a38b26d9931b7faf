"""The per-message cost of jaxcc's native engines: TCP across processes and in-process.

Each engine runs the direct all_reduce of a fixed float32 buffer per rank
(``--kib``, default 256 KiB and 4 MiB) cut into K = 1, 2, 4, ..., 256 chunks:
the schedule ``jaxcc.plan("all_reduce", nbytes, topology, "direct",
chunks=K)`` run by ``native_executor.run_schedule`` (what
``jaxcc.all_reduce(..., algorithm="direct", executor="native")`` runs after
planning; the public call has no depth argument). The bytes stay the same as
K grows, the messages the busiest rank sends (``np.bincount(table[:, SRC])``)
grow as ``2 (p-1) K``; a least-squares line time = a + o * messages gives the
per-message cost o for each engine, process count and size.

* TCP: 2, 4 and 8 ``jax.distributed`` processes (``--nprocs``) of one CPU
  device each on loopback (``jaxcc.launcher``), the Tcp transport;
* in-process: one process of 8 virtual CPU devices, the InProcess transport.

The runs are the bench harness's (``jaxcc.bench.collective.measure``, one
launch per engine, process count and size, the depths named ``"direct@K"``):
each sample starts right after a tiny psum that lines the processes up; its
time is the slowest process'; the K's take turns each repeat; a point is the
median of ``--reps`` samples after a warm-up checked against numpy.

Writes ``message_cost.json`` and ``message_cost.png`` next to this file (or
under ``--out``). Run: ``nice -n 5 .venv/bin/python benchmarks/message_cost.py``
(about 2 minutes).

Measured on 2-core hosts (jax 0.10.2), o in us per message at 256 KiB / 4 MiB
per rank, R^2 >= 0.987 for every TCP fit. Runs 1 and 2 on one host (run 2
beside other benchmarks at a load of 5-9); runs 3 and 4 on another host of the
same kind, idle, run 3 by this harness (in the JSON), run 4 by the loop this
script had before it used the harness:

| engine | ranks | run 1 | run 2 | run 3 | run 4 |
| --- | --- | --- | --- | --- | --- |
| TCP | 2 | 28.1 / 36.4 | 33.0 / 29.9 | 10.4 / 13.8 | 11.8 / 12.9 |
| TCP | 4 | 39.2 / 35.9 | 44.2 / 54.2 | 15.2 / 18.1 | 16.0 / 20.2 |
| TCP | 8 | 55.1 / 67.4 | 89.5 / 90.6 | 32.3 / 34.5 | 33.5 / 38.5 |
| in-process | 8 devices | 54.0 / 41.4 | 45.7 / 46.8 | 65.8 / 65.1 | 63.7 / 64.4 |

Two processes, one core each, are the closest to one host per rank: 10-36 us
per message, depending on the host (``topology.MESSAGE_COST`` is 30 us; the
probe measures a job's own). With 4 and 8 processes on 2 cores the cost grows
with the contention for the cores. In-process the busiest rank sends 7
messages a step, so 300-450 us is each step's rendezvous of 8 threads on 2
cores.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import sys
import time

import numpy as np

KiB = 1 << 10
CHUNKS = tuple(2 ** i for i in range(9))


def measure(engine: str, nproc: int, kibs: list[int], reps: int) -> list[dict]:
  """The direct all_reduce at every depth of ``CHUNKS`` (``"direct@K"``) by the bench worker
  (``jaxcc.bench.collective.measure``): ``nproc`` processes on loopback (TCP) or one process of
  ``nproc`` devices (in-process); a row per size: the depths, messages, medians, and the fit."""
  import jaxcc
  from jaxcc.bench import collective
  topology = jaxcc.Topology.uniform(nproc, bandwidth=1e9)
  names = [f"direct@{k}" for k in CHUNKS]
  rows = []
  for kib in kibs:
    out = collective.measure("all_reduce", topology, kib * KiB, names, reps,
                             loopback=engine == "tcp")
    slowest = [np.max([o["samples"][name] for o in out], axis=0) for name in names]
    medians = [float(np.median(s)) for s in slowest]
    msgs = [int(np.bincount(jaxcc.plan("all_reduce", kib * KiB, topology, "direct",
                                       chunks=k).table[:, 1], minlength=nproc).max())
            for k in CHUNKS]
    rows.append({"engine": engine, "ranks": nproc, "kib": kib, "chunks": list(CHUNKS),
                 "messages": msgs, "median_s": medians,
                 "samples_s": [s.tolist() for s in slowest], **fit(msgs, medians)})
  return rows


def fit(messages: list[int], times: list[float]) -> dict:
  """Least squares time = a + o * messages: ``a_s``, ``o_us``, ``r2``; and ``last_us``, the
  slope between the two deepest points (a cost that grows with the depth shows there)."""
  m, t = np.asarray(messages, float), np.asarray(times)
  (o, a), res, *_ = np.polyfit(m, t, 1, full=True)
  r2 = 1 - (res[0] if len(res) else 0.0) / max(((t - t.mean()) ** 2).sum(), 1e-30)
  return {"a_s": float(a), "o_us": float(o * 1e6), "r2": float(r2),
          "last_us": float((t[-1] - t[-2]) / (m[-1] - m[-2]) * 1e6)}


def summary(rows: list[dict]) -> dict:
  """Per engine: the mean per-message cost over sizes and process counts, and its spread."""
  out = {}
  for engine in dict.fromkeys(r["engine"] for r in rows):
    o = [r["o_us"] for r in rows if r["engine"] == engine]
    out[engine] = {"o_us_mean": float(np.mean(o)), "o_us_min": min(o), "o_us_max": max(o)}
  return out


def table(rows: list[dict]) -> str:
  lines = ["| engine | ranks | size/rank | messages (K=1..256) | time K=1 | time K=256 "
           "| a | o (us/message) | R^2 | slope K=128..256 |", "| --- " * 10 + "|"]
  for r in rows:
    lines.append(f"| {r['engine']} | {r['ranks']} | {r['kib']} KiB | {r['messages'][0]}.."
                 f"{r['messages'][-1]} | {r['median_s'][0] * 1e3:.2f} ms "
                 f"| {r['median_s'][-1] * 1e3:.2f} ms | {r['a_s'] * 1e3:.2f} ms "
                 f"| {r['o_us']:.1f} | {r['r2']:.3f} | {r['last_us']:.1f} |")
  return "\n".join(lines)


def plot(rows: list[dict], path: pathlib.Path) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  engines = list(dict.fromkeys(r["engine"] for r in rows))
  fig, axes = plt.subplots(1, len(engines), figsize=(5.5 * len(engines), 4), squeeze=False)
  for ax, engine in zip(axes[0], engines):
    for k, r in enumerate(r for r in rows if r["engine"] == engine):
      m = np.asarray(r["messages"])
      ax.plot(m, np.asarray(r["median_s"]) * 1e3, "o", color=f"C{k}",
              label=f"{r['ranks']} ranks, {r['kib']} KiB: {r['o_us']:.1f} us/msg")
      ax.plot(m, (r["a_s"] + r["o_us"] * 1e-6 * m) * 1e3, "-", color=f"C{k}", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("messages the busiest rank sends (direct all_reduce, K = 1..256)")
    ax.set_ylabel("median time (ms)")
    ax.set_title(f"{engine}: time = a + o * messages", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--kib", type=int, nargs="+", default=[256, 4096])
  parser.add_argument("--nprocs", type=int, nargs="+", default=[2, 4, 8],
                      help="TCP process counts (default 2 4 8)")
  parser.add_argument("--devices", type=int, default=8, help="in-process devices (default 8)")
  parser.add_argument("--reps", type=int, default=20)
  parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path(__file__).parent)
  args = parser.parse_args()
  from jaxcc.bench import extras, report
  extras.require("benchmarks/message_cost.py", "matplotlib")
  start = time.time()
  rows = measure("in-process", args.devices, args.kib, args.reps)
  for nproc in args.nprocs:
    rows += measure("tcp", nproc, args.kib, args.reps)
    print(table(rows), flush=True)
  result = {"command": " ".join(["benchmarks/message_cost.py", *sys.argv[1:]]),
            "host": f"{platform.node()}: {os.cpu_count()} CPUs, Linux {platform.release()}",
            "reps": args.reps, "seconds": time.time() - start, "summary": summary(rows),
            "rows": rows}
  print(table(rows))
  for engine, s in result["summary"].items():
    print(f"{engine}: {s['o_us_mean']:.1f} us/message (spread {s['o_us_min']:.1f}-"
          f"{s['o_us_max']:.1f} over sizes and ranks)")
  args.out.mkdir(parents=True, exist_ok=True)
  report.write_json(result, args.out / "message_cost.json")
  plot(rows, args.out / "message_cost.png")
  print(f"wrote {args.out / 'message_cost.json'} and message_cost.png in "
        f"{time.time() - start:.0f} s")


if __name__ == "__main__":
  main()
