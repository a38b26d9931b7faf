"""The all_reduce benchmark: measured times against the lower bound, the simulator and psum.

One configuration is a set of stragglers (rank -> fraction of the rate). For
each, ``run`` measures every algorithm on ``ranks`` ranks, each holding
``nbytes`` of float32: on the testbed (one ``jax.distributed`` process per
host of a ``jaxcc.testbed.Cluster``, shaped to the configured rates; needs
root) or on virtual CPU devices of one process (no network: the rates only
shape the plans, times are bound by memory). A run's time is the slowest
process' (on virtual devices the one process'); a row reports the median.

Every row also holds, for its configuration:

* ``lower_bound_s``: ``jaxcc.sim.lower_bound`` on the configured rates;
* ``simulated_s``: ``jaxcc.sim.simulate`` of the schedule the algorithm runs
  (planned on the configured rates), on the configured rates times the link
  efficiency, which ``jaxcc.bench.calibration.calibrate`` measures on the
  fault-free cluster before anything else (1 on virtual devices). "psum" is
  modelled as a ring: XLA's CPU all-reduce over gloo is gloo's ring
  (a reduce-scatter then an all-gather around the ranks);
* ``fault_free_psum_s``: the median psum time measured in the same run on the
  same ranks without stragglers;
* ``t_ff_s`` and ``t_ff_over_b_s``: the fault-free ring's link-rate time
  ``2(p-1)/p N/B`` and that over the smallest straggler fraction ``b``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from collections.abc import Mapping, Sequence

import numpy as np

from jaxcc.bench import calibration
from jaxcc.bench.report import Progress, format_stragglers
from jaxcc.launcher import launch
from jaxcc.planner import plan
from jaxcc.sim import lower_bound, simulate
from jaxcc.sim.bounds import fault_free_ring_time
from jaxcc.testbed import Cluster, parse_rate
from jaxcc.topology import Topology

ALGORITHMS = ("psum", "ring", "direct", "optcc", "r2ccl")
WORKER = os.path.join(os.path.dirname(__file__), "worker.py")


def run(ranks: int, nbytes: int, *, rate: str | float = "200mbit",
        configurations: Sequence[Mapping[int, float]] = ({},),
        algorithms: Sequence[str] = ALGORITHMS, repeats: int = 5, testbed: bool = False,
        link_efficiency: float | None = None, progress: bool = True) -> list[dict]:
  """Measure ``algorithms`` under each straggler configuration; one row per pair.

  Args:
    ranks: number of ranks (at least 2).
    nbytes: bytes of float32 per rank, a multiple of 4.
    rate: each rank's link rate, a ``tc`` rate (``"200mbit"``) or bit/s.
    configurations: straggler sets, ``{rank: fraction}`` each; ``{}`` is fault-free.
    algorithms: names from ``ALGORITHMS``; "psum" is ``lax.psum``.
    repeats: timed runs per algorithm and configuration, after one warm-up.
    testbed: run on an emulated cluster (root) instead of virtual devices.
    link_efficiency: measured goodput / configured rate for the simulation; by
      default calibrated on the testbed and 1 on virtual devices.
    progress: draw a progress bar on stderr.

  Returns:
    Rows in configuration order, then algorithm order, with the keys
    ``algorithm, ranks, stragglers, nbytes, rate_bps, testbed, repeats, measured_s,
    samples_s, lower_bound_s, simulated_s, fault_free_psum_s, t_ff_s, t_ff_over_b_s,
    link_efficiency``.
  """
  rate_bps = parse_rate(rate)
  configurations = [dict(c) for c in configurations]
  _check(ranks, nbytes, configurations, algorithms, repeats)
  psum_too = list(dict.fromkeys(["psum", *algorithms]))
  launches = [({}, psum_too if {} in configurations else ["psum"])]
  launches += [(c, list(algorithms)) for c in configurations if c]
  calibrating = testbed and link_efficiency is None
  bar = Progress(int(calibrating) + sum((repeats + 1) * len(algs) for _, algs in launches),
                 stream=None if progress else io.StringIO())
  medians, samples = {}, {}
  try:
    for stragglers, algs in launches:
      key = format_stragglers(stragglers)
      topology = configured_topology(ranks, rate_bps, stragglers)
      with Cluster(ranks, rate_bps, stragglers) if testbed else contextlib.nullcontext() as c:
        if calibrating and not stragglers:
          bar.advance(0, "calibrating links")
          link_efficiency = calibration.calibrate(c)["efficiency"]
          bar.advance(1)
        results = measure(topology, nbytes, algs, repeats, cluster=c, progress=bar,
                          label=f"stragglers {key}:")
      for alg in algs:
        slowest = np.max([r["samples"][alg] for r in results], axis=0)
        samples[key, alg] = slowest.tolist()
        medians[key, alg] = float(np.median(slowest))
  finally:
    bar.close()
  efficiency = 1.0 if link_efficiency is None else link_efficiency
  rows = []
  for stragglers in configurations:
    key = format_stragglers(stragglers)
    for alg in algorithms:
      rows.append(_row(alg, ranks, stragglers, nbytes, rate_bps, efficiency,
                       medians[key, alg], samples[key, alg], medians["none", "psum"]) |
                  {"testbed": testbed, "repeats": repeats})
  return rows


def measure(topology: Topology, nbytes: int, algorithms: Sequence[str], repeats: int,
            cluster: Cluster | None = None, progress: Progress | None = None,
            label: str = "") -> list[dict]:
  """Run the worker once: on ``cluster`` if given, else on virtual devices of one process.

  Args:
    topology: the configured network, which jaxcc plans for.
    nbytes: bytes of float32 per rank.
    algorithms: names from ``ALGORITHMS``.
    repeats: timed runs per algorithm after one warm-up.
    cluster: an entered testbed ``Cluster`` of ``topology.size`` hosts.
    progress: advanced once per run (warm-ups included), labelled ``label``.
    label: what the progress bar says the runs are.

  Returns:
    Each process' ``{"process", "samples": {algorithm: [seconds, ...]}}``, by process.
  """
  slowest = fault_free_ring_time(nbytes, topology.size, min(topology.bandwidth))
  timeout_s = 120 + 10 * (repeats + 1) * len(algorithms) * slowest
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "progress")
    config = json.dumps({"bandwidths": list(topology.send_bandwidth), "nbytes": nbytes,
                         "algorithms": list(algorithms), "repeats": repeats,
                         "progress": path if progress else None})
    with progress.following(path, label) if progress else contextlib.nullcontext():
      if cluster is not None:
        processes = launch(WORKER, [config], cluster=cluster, timeout_s=timeout_s,
                           env={"JAXCC_TIMEOUT_S": str(int(timeout_s))})
      else:
        processes = launch(WORKER, [config], nproc=1, local_devices=topology.size,
                           timeout_s=timeout_s)
  return [p.json() for p in processes]


def configured_topology(ranks: int, rate_bps: float, stragglers: Mapping[int, float]) -> Topology:
  """``ranks`` ports of ``rate_bps / 8`` bytes/s, each straggler's scaled by its fraction."""
  topology = Topology.uniform(ranks, rate_bps / 8)
  for rank, fraction in sorted(stragglers.items()):
    topology = topology.with_straggler(rank, fraction)
  return topology


def _check(ranks, nbytes, configurations, algorithms, repeats) -> None:
  if not isinstance(ranks, int) or ranks < 2:
    raise ValueError(f"bench: ranks must be an integer >= 2, got {ranks!r}")
  if not isinstance(nbytes, int) or nbytes <= 0 or nbytes % 4:
    raise ValueError(f"bench: the size must be a positive multiple of 4 bytes (float32), "
                     f"got {nbytes!r}")
  unknown = [a for a in algorithms if a not in ALGORITHMS]
  if unknown or not algorithms:
    raise ValueError(f"bench: algorithms must be some of {', '.join(ALGORITHMS)}; got "
                     f"{list(algorithms)}")
  if not isinstance(repeats, int) or repeats < 1:
    raise ValueError(f"bench: repeats must be an integer >= 1, got {repeats!r}")
  for stragglers in configurations:
    configured_topology(ranks, 1.0, stragglers)  # raises on a bad rank or fraction


def _row(alg, ranks, stragglers, nbytes, rate_bps, efficiency, measured, samples, psum) -> dict:
  topology = configured_topology(ranks, rate_bps, stragglers)
  effective = Topology.from_bandwidths([b * efficiency for b in topology.send_bandwidth])
  schedule = plan("all_reduce", nbytes, topology, algorithm="ring" if alg == "psum" else alg)
  t_ff = fault_free_ring_time(nbytes, ranks, rate_bps / 8)
  return {"algorithm": alg, "ranks": ranks, "stragglers": dict(sorted(stragglers.items())),
          "nbytes": nbytes, "rate_bps": rate_bps, "measured_s": measured, "samples_s": samples,
          "lower_bound_s": lower_bound("all_reduce", nbytes, topology),
          "simulated_s": simulate(schedule, effective).time, "fault_free_psum_s": psum,
          "t_ff_s": t_ff, "t_ff_over_b_s": t_ff / min(stragglers.values(), default=1.0),
          "link_efficiency": efficiency}
