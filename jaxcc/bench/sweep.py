"""The collective sweep in the nccl-tests tradition: every collective, every size, against lax.

``run`` measures jaxcc's all_reduce, reduce_scatter, all_gather, broadcast and
ppermute (a shift to the next rank) against their lax twins
(``sweep_worker.TWINS``; XLA has no broadcast, so its twin is the psum of the
root's array, which sends 2(p-1)/p S per rank where all_gather-and-index sends
(p-1) S) at sizes from 4 KiB to 256 MiB (x4 steps) of float32: on virtual CPU
devices of one process, across processes on loopback (gloo is lax's
transport) or on the testbed (one process per host). Every jaxcc
result is first checked against the twin's; then the two take turns, fewer
times at large sizes (``repeats_at``). A run's time is the slowest
process'. Per size and collective a row gives the median and the minimum of
each, and nccl-tests' bandwidths (its ``doc/PERFORMANCE.md``), with S the
size of the full buffer (all_gather's output, reduce_scatter's input):

* algbw = S / time;
* busbw = algbw x ``BUS_FACTORS``: 2(p-1)/p for all_reduce, (p-1)/p for
  reduce_scatter and all_gather, 1 for broadcast and ppermute (sendrecv),
  which makes busbw comparable with the link rate for every collective.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from collections.abc import Mapping, Sequence

import numpy as np

from jaxcc.bench.report import Progress
from jaxcc import Topology, plan
from jaxcc.launcher import launch
from jaxcc.testbed import Cluster, parse_rate

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "ppermute")
TWIN_NAMES = {"all_reduce": "lax.psum", "reduce_scatter": "lax.psum_scatter",
              "all_gather": "lax.all_gather", "broadcast": "lax.psum of the root's array",
              "ppermute": "lax.ppermute"}
BUS_FACTORS = {"all_reduce": lambda p: 2 * (p - 1) / p, "reduce_scatter": lambda p: (p - 1) / p,
               "all_gather": lambda p: (p - 1) / p, "broadcast": lambda p: 1.0,
               "ppermute": lambda p: 1.0}
WORKER = os.path.join(os.path.dirname(__file__), "sweep_worker.py")
_FULL_REPEATS_BYTES = 4 << 20
_ASSUMED_BANDWIDTH = 100e6  # bytes/s per rank for the time limit, off the testbed


def size_range(low: int = 4 << 10, high: int = 256 << 20, factor: int = 4) -> list[int]:
  """``low``, ``low * factor``, ... up to ``high`` (bytes)."""
  if low <= 0 or high < low or factor < 2:
    raise ValueError(f"sweep: sizes need 0 < low <= high and a factor >= 2, got {low}, {high}, "
                     f"{factor}")
  out = [low]
  while out[-1] * factor <= high:
    out.append(out[-1] * factor)
  return out


def repeats_at(nbytes: int, repeats: int) -> int:
  """Timed runs at ``nbytes``: ``repeats`` up to 4 MiB, fewer above (by 4 MiB / size), >= 3."""
  if nbytes <= _FULL_REPEATS_BYTES:
    return repeats
  return min(repeats, max(3, repeats * _FULL_REPEATS_BYTES // nbytes))


def run(*, collectives: Sequence[str] = COLLECTIVES, sizes: Sequence[int] = tuple(size_range()),
        repeats: int = 10, devices: int = 8, nproc: int | None = None, testbed: bool = False,
        rate: str | float = "200mbit", stragglers: Mapping[int, float] | None = None,
        algorithm: str = "auto", executor: str = "auto", codec: str | None = None,
        progress: bool = True) -> list[dict]:
  """Measure ``collectives`` at ``sizes``, jaxcc against lax; one row per collective and size.

  Args:
    collectives: names from ``COLLECTIVES``.
    sizes: bytes of the full buffer per rank, multiples of 4 (each rounded down to a
      whole number of float32 per rank).
    repeats: timed runs of each (fewer above 4 MiB: ``repeats_at``).
    devices: virtual CPU devices of the one process, without ``nproc`` and ``testbed``.
    nproc: processes of one CPU device each, on loopback (or testbed hosts; 4 by default).
    testbed: run on an emulated cluster at ``rate``, ``stragglers`` slowed;
      jaxcc then plans on the configured rates.
    rate: each testbed host's link rate, a ``tc`` rate or bit/s.
    stragglers: ``{rank: fraction}`` of the testbed's rate.
    algorithm: jaxcc's algorithm ("auto", "lax" or one the collectives take); ppermute
      has none.
    executor: jaxcc's executor: "auto", "native" or "xla".
    codec: jaxcc's codec: None, "fixed" or "entropy".
    progress: draw a progress bar on stderr.

  Returns:
    Rows by size, then collective, with the keys ``collective, twin, nbytes, ranks,
    processes, where, rate_bps, stragglers, algorithm, executor, codec, repeats, time_s,
    min_s, algbw_gbps, busbw_gbps, lax_time_s, lax_min_s, lax_algbw_gbps,
    lax_busbw_gbps, vs_lax`` (lax's median time / jaxcc's), ``check`` ("bit-exact" or
    "allclose": how every jaxcc result was verified against lax), ``max_abs_diff,
    samples_s, lax_samples_s``.
  """
  stragglers = dict(stragglers or {})
  if stragglers and not testbed:
    raise ValueError("sweep: stragglers slow testbed hosts; add --testbed (testbed=True)")
  if testbed and nproc is None:
    nproc = 4
  ranks = devices if nproc is None else nproc
  sizes = list(sizes)
  _check(collectives, sizes, repeats, ranks, nproc, algorithm, executor, codec)
  rate_bps = parse_rate(rate) if testbed else None
  cluster = Cluster(nproc, rate_bps, stragglers) if testbed else None
  counts = [repeats_at(s, repeats) for s in sizes]
  bar = Progress(sum(len(collectives) * (1 + r) for r in counts),
                 stream=None if progress else io.StringIO())
  bandwidth = rate_bps / 8 * min(stragglers.values(), default=1.0) if testbed else (
      _ASSUMED_BANDWIDTH)
  # Limits far above any run: 5x a call's time at 2 S / bandwidth, plus compilation.
  longest_call_s = 0.05 + 2 * max(sizes) / bandwidth
  timeout_s = 120 + sum(len(collectives) * (2 * (r + 1) * 5 * (0.05 + 2 * s / bandwidth) + 10)
                        for s, r in zip(sizes, counts))
  try:
    with tempfile.TemporaryDirectory() as tmp, cluster if testbed else contextlib.nullcontext():
      path = os.path.join(tmp, "progress")
      config = json.dumps({"collectives": list(collectives), "sizes": sizes, "repeats": counts,
                           "algorithm": algorithm, "executor": executor, "codec": codec,
                           "bandwidths": (list(cluster.topology.send_bandwidth) if testbed
                                          else None),
                           "progress": path})
      with bar.following(path):
        processes = launch(WORKER, [config], nproc=nproc or 1, cluster=cluster,
                           local_devices=devices if nproc is None else 1, timeout_s=timeout_s,
                           env={"JAXCC_TIMEOUT_S": str(int(60 + 10 * longest_call_s))})
  finally:
    bar.close()
  results = [p.json()["results"] for p in processes]
  where = "testbed" if testbed else "in-process" if nproc is None else "loopback"
  setup = {"ranks": ranks, "processes": nproc or 1, "where": where, "rate_bps": rate_bps,
           "stragglers": stragglers, "executor": executor, "codec": codec}
  return [_row(per_process, setup, algorithm) for per_process in zip(*results)]


def _row(per_process: Sequence[dict], setup: dict, algorithm: str) -> dict:
  """One collective at one size from every process' result: the slowest process per run."""
  first = per_process[0]
  collective, nbytes, p = first["collective"], first["nbytes"], setup["ranks"]
  row = {"collective": collective, "twin": TWIN_NAMES[collective], "nbytes": nbytes, **setup,
         "algorithm": None if collective == "ppermute" else algorithm,
         "repeats": len(first["jaxcc"])}
  for prefix, key in (("", "jaxcc"), ("lax_", "lax")):
    slowest = np.max([r[key] for r in per_process], axis=0)
    median = float(np.median(slowest))
    algbw = nbytes / median / 1e9
    row.update({f"{prefix}time_s": median, f"{prefix}min_s": float(np.min(slowest)),
                f"{prefix}algbw_gbps": algbw,
                f"{prefix}busbw_gbps": algbw * BUS_FACTORS[collective](p),
                f"{prefix}samples_s": slowest.tolist()})
  row.update(vs_lax=row["lax_time_s"] / row["time_s"], check=first["check"],
             max_abs_diff=max(r["max_abs_diff"] for r in per_process))
  return row


def _check(collectives, sizes, repeats, ranks, nproc, algorithm, executor, codec) -> None:
  """Every argument error before any work, each naming the argument."""
  unknown = [c for c in collectives if c not in COLLECTIVES]
  if unknown or not collectives:
    raise ValueError(f"sweep: collectives must be some of {', '.join(COLLECTIVES)}; got "
                     f"{list(collectives)}")
  if not sizes or any(not isinstance(s, int) or s <= 0 or s % 4 for s in sizes):
    raise ValueError(f"sweep: sizes must be positive multiples of 4 bytes (float32), got {sizes}")
  if not isinstance(repeats, int) or repeats < 1:
    raise ValueError(f"sweep: repeats must be an integer >= 1, got {repeats!r}")
  if nproc is not None and (not isinstance(nproc, int) or nproc < 2):
    raise ValueError(f"sweep: nproc must be an integer >= 2, got {nproc!r}")
  if not isinstance(ranks, int) or ranks < 2:
    raise ValueError(f"sweep: needs at least 2 ranks (devices or processes), got {ranks!r}")
  if executor not in ("auto", "native", "xla"):
    raise ValueError(f"sweep: executor must be auto, native or xla, got {executor!r}")
  if codec not in (None, "fixed", "entropy"):
    raise ValueError(f"sweep: codec must be None, fixed or entropy, got {codec!r}")
  if algorithm == "lax" and codec is not None:
    raise ValueError("sweep: algorithm 'lax' is XLA's own collective, which takes no codec")
  if algorithm not in ("auto", "lax"):
    for c in collectives:
      if c != "ppermute":
        try:
          plan(c, 4 * ranks, Topology.uniform(ranks, 1e9), algorithm)
        except ValueError as e:
          raise ValueError(f"sweep: --algorithm {algorithm}: {e}") from None
