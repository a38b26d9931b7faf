"""One collective's algorithms measured against the lower bound, the simulator and lax.

One configuration is a set of stragglers (rank -> fraction of the rate) on
the intra-cluster level and, on a testbed of clusters, on the cross-cluster
level. For each, ``run`` measures every algorithm of ``collective`` on
``ranks`` ranks, each with ``nbytes`` of float32 (all_reduce's buffer,
reduce_scatter's input, all_gather's output): on the testbed (one
``jax.distributed`` process per host of a ``jaxcc.testbed.Cluster``, shaped
to the configured rates) or on virtual CPU devices of one
process (no network: the rates only shape the plans, times are bound by
memory). A run's time is the slowest process' (on virtual devices the one
process'); a row reports the median. The lax twin (``BASELINES``) runs as
one more algorithm.

Every row also holds, for its configuration:

* ``lower_bound_s``: ``jaxcc.sim.lower_bound`` on the configured rates (the
  clustered bound on a testbed of clusters);
* ``simulated_s``: ``jaxcc.sim.simulate`` of the schedule the algorithm runs
  (planned on the configured rates), on the configured rates times the link
  efficiency, which ``jaxcc.bench.calibration.calibrate`` measures on the
  fault-free cluster before anything else (1 on virtual devices). The lax
  twin is modelled as a ring: XLA's CPU collectives over gloo are gloo's
  rings around the ranks;
* ``fault_free_psum_s``: the lax twin's median time measured in the same run
  on the same ranks without stragglers;
* ``t_ff_s`` and ``t_ff_over_b_s``: the fault-free ring's link-rate time
  (``2(p-1)/p N/B`` for all_reduce, half that for the others, ``B`` the intra
  rate) and that over the smallest straggler fraction ``b``;
* on a testbed of clusters, ``inter_cluster_bytes_measured`` (the bytes all
  ranks sent across clusters during the first timed run, frames as the
  kernel counted them, ACKs included) and ``inter_cluster_bytes_expected``
  (the payload the schedule sends across, ``SimResult.inter_bytes``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import tempfile
from collections.abc import Mapping, Sequence

import numpy as np

from jaxcc.bench import calibration
from jaxcc.bench.report import Progress, format_configuration
from jaxcc.launcher import launch
from jaxcc.planner import plan
from jaxcc.sim import lower_bound, simulate
from jaxcc.sim.bounds import fault_free_ring_time
from jaxcc.testbed import Cluster, parse_rate
from jaxcc.topology import Topology

BASELINES = {"all_reduce": "psum", "reduce_scatter": "psum_scatter", "all_gather": "all_gather"}
ALGORITHMS = {
    "all_reduce": ("psum", "ring", "direct", "optcc", "r2ccl", "hierarchical"),
    "reduce_scatter": ("psum_scatter", "ring", "direct", "hierarchical"),
    "all_gather": ("all_gather", "ring", "direct", "hierarchical"),
}
WORKER = os.path.join(os.path.dirname(__file__), "worker.py")

Configuration = Mapping[int, float] | tuple[Mapping[int, float], Mapping[int, float]]


def run(collective: str, ranks: int, nbytes: int, *, rate: str | float = "200mbit",
        configurations: Sequence[Configuration] = ({},),
        algorithms: Sequence[str] | None = None, repeats: int = 5, testbed: bool = False,
        clusters: Sequence[int] | None = None, inter_rate: str | float | None = None,
        link_efficiency: float | None = None, progress: bool = True) -> list[dict]:
  """Measure ``algorithms`` under each straggler configuration; one row per pair.

  Args:
    collective: "all_reduce", "reduce_scatter" or "all_gather".
    ranks: number of ranks (at least 2).
    nbytes: bytes of float32 per rank (see the module docstring), a multiple of
      4 and, but for all_reduce, of ``4 * ranks``.
    rate: each rank's link rate (inside its cluster), a ``tc`` rate or bit/s.
    configurations: straggler sets, each ``{rank: fraction}`` (the intra level)
      or a pair ``(intra, inter)`` of them; ``{}`` is fault-free.
    algorithms: names from ``ALGORITHMS[collective]``; by default all but
      "hierarchical" on a flat network, and the lax twin, ring and
      hierarchical on clusters. An all_reduce schedule may name its pipeline
      depth, ``"optcc@64"`` (``split_depth``); plain names run at the default.
    repeats: timed runs per algorithm and configuration, after one warm-up.
    testbed: run on an emulated cluster (jaxcc.testbed) instead of virtual devices.
    clusters: sizes of consecutive clusters along the ranks; None: flat.
    inter_rate: each rank's cross-cluster rate (with ``clusters``; default ``rate``).
    link_efficiency: measured goodput / configured rate for the simulation; by
      default calibrated on the testbed and 1 on virtual devices.
    progress: draw a progress bar on stderr.

  Returns:
    Rows in configuration order, then algorithm order, with the keys
    ``collective, algorithm, ranks, clusters, stragglers, inter_stragglers, nbytes,
    rate_bps, inter_rate_bps, testbed, repeats, measured_s, samples_s, lower_bound_s,
    simulated_s, fault_free_psum_s, t_ff_s, t_ff_over_b_s, link_efficiency``, and
    ``inter_cluster_bytes_measured, inter_cluster_bytes_expected`` on a testbed of
    clusters.
  """
  if collective not in ALGORITHMS:
    raise ValueError(f"bench: collective must be one of {', '.join(ALGORITHMS)}, "
                     f"got {collective!r}")
  algorithms = list(algorithms or default_algorithms(collective, clusters))
  configurations = [_levels(c) for c in configurations]
  shape = {"clusters": clusters, "inter_rate": inter_rate}
  _check(collective, ranks, nbytes, configurations, algorithms, repeats, rate, shape)
  baseline = BASELINES[collective]
  fault_free = ({}, {})
  with_baseline = list(dict.fromkeys([baseline, *algorithms]))
  launches = [(fault_free, with_baseline if fault_free in configurations else [baseline])]
  launches += [(c, algorithms) for c in configurations if c != fault_free]
  calibrating = testbed and link_efficiency is None
  bar = Progress(int(calibrating) + sum((repeats + 1) * len(algs) for _, algs in launches),
                 stream=None if progress else io.StringIO())
  medians, samples, crossed, topologies = {}, {}, {}, {}
  counting = testbed and clusters is not None
  try:
    for levels, algs in launches:
      key = format_configuration(*levels)
      cluster = Cluster(ranks, rate, levels[0], inter_stragglers=levels[1], **shape)
      topologies[key] = cluster.topology
      with cluster if testbed else contextlib.nullcontext() as c:
        if calibrating and levels == fault_free:
          bar.advance(0, "calibrating links")
          link_efficiency = calibration.calibrate(c)["efficiency"]
          bar.advance(1)
        results = measure(collective, topologies[key], nbytes, algs, repeats, cluster=c,
                          count_bytes=counting, progress=bar, label=f"stragglers {key}:")
      for alg in algs:
        slowest = np.max([r["samples"][alg] for r in results], axis=0)
        samples[key, alg] = slowest.tolist()
        medians[key, alg] = float(np.median(slowest))
        if counting:
          crossed[key, alg] = sum(r["inter_bytes"][alg] for r in results)
  finally:
    bar.close()
  efficiency = 1.0 if link_efficiency is None else link_efficiency
  rows = []
  for levels in configurations:
    key = format_configuration(*levels)
    for alg in algorithms:
      row = _row(collective, alg, topologies[key], levels, nbytes, efficiency, medians[key, alg],
                 samples[key, alg], medians[format_configuration(*fault_free), baseline])
      row |= {"clusters": None if clusters is None else list(clusters),
              "rate_bps": parse_rate(rate),
              "inter_rate_bps": None if clusters is None else parse_rate(inter_rate or rate),
              "testbed": testbed, "repeats": repeats}
      if counting:
        row["inter_cluster_bytes_measured"] = crossed[key, alg]
      rows.append(row)
  return rows


def default_algorithms(collective: str, clusters: Sequence[int] | None) -> tuple[str, ...]:
  """The lax twin and every algorithm on a flat network; lax, ring and hierarchical on clusters."""
  if clusters is not None and len(clusters) > 1:
    return BASELINES[collective], "ring", "hierarchical"
  return tuple(a for a in ALGORITHMS[collective] if a != "hierarchical")


def split_depth(name: str) -> tuple[str, int | None]:
  """``"optcc@64"`` -> ``("optcc", 64)``: an algorithm at an explicit pipeline depth (chunks);
  ``"optcc"`` -> ``("optcc", None)``: at the planner's default."""
  algorithm, at, chunks = name.partition("@")
  if at and not (chunks.isdigit() and int(chunks) > 0):
    raise ValueError(f"bench: {name!r}: the depth after '@' must be an integer >= 1, "
                     "e.g. 'optcc@64'")
  return algorithm, int(chunks) if at else None


def effective(topology: Topology, efficiency: float) -> Topology:
  """``topology`` with every port's bandwidth times ``efficiency`` (the calibrated rates)."""
  return dataclasses.replace(topology, **{
      name: tuple(b * efficiency for b in getattr(topology, name))
      for name in ("send_bandwidth", "recv_bandwidth", "inter_send_bandwidth",
                   "inter_recv_bandwidth") if getattr(topology, name) is not None})


def measure(collective: str, topology: Topology, nbytes: int, algorithms: Sequence[str],
            repeats: int, cluster: Cluster | None = None, count_bytes: bool = False,
            progress: Progress | None = None, label: str = "",
            loopback: bool = False) -> list[dict]:
  """Run the worker once: on ``cluster`` if given, else with ``loopback`` as a process of one
  CPU device per rank on loopback, else on virtual devices of one process.

  Args:
    collective: "all_reduce", "reduce_scatter" or "all_gather".
    topology: the configured network, which jaxcc plans for.
    nbytes: bytes of float32 per rank.
    algorithms: names from ``ALGORITHMS[collective]``.
    repeats: timed runs per algorithm after one warm-up.
    cluster: an entered testbed ``Cluster`` of ``topology.size`` hosts.
    count_bytes: each process counts the bytes it sends across clusters during
      its first timed run of each algorithm (testbed clusters only).
    progress: advanced once per run (warm-ups included), labelled ``label``.
    label: what the progress bar says the runs are.
    loopback: without ``cluster``, one process per rank on this host (jaxcc's TCP transport
      between them) instead of one process of every rank.

  Returns:
    Each process' ``{"process", "samples": {algorithm: [seconds, ...]}}`` (and
    ``"inter_bytes": {algorithm: bytes}`` when counting), by process.
  """
  slowest = fault_free_ring_time(nbytes, topology.size, min(
      topology.bandwidth + (topology.inter_bandwidth or ())))
  timeout_s = 120 + 10 * (repeats + 1) * len(algorithms) * slowest
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "progress")
    config = json.dumps({"collective": collective, "topology": dataclasses.asdict(topology),
                         "nbytes": nbytes, "algorithms": list(algorithms), "repeats": repeats,
                         "count_bytes": count_bytes, "progress": path if progress else None})
    with progress.following(path, label) if progress else contextlib.nullcontext():
      if cluster is not None or loopback:
        processes = launch(WORKER, [config], cluster=cluster,
                           nproc=None if cluster else topology.size, timeout_s=timeout_s,
                           env={"JAXCC_TIMEOUT_S": str(int(timeout_s))})
      else:
        processes = launch(WORKER, [config], nproc=1, local_devices=topology.size,
                           timeout_s=timeout_s)
  return [p.json() for p in processes]


def _levels(configuration: Configuration) -> tuple[dict, dict]:
  if isinstance(configuration, tuple):
    intra, inter = configuration
    return dict(intra), dict(inter)
  return dict(configuration), {}


def _check(collective, ranks, nbytes, configurations, algorithms, repeats, rate, shape) -> None:
  if not isinstance(ranks, int) or ranks < 2:
    raise ValueError(f"bench: ranks must be an integer >= 2, got {ranks!r}")
  quantum = 4 if collective == "all_reduce" else 4 * ranks
  if not isinstance(nbytes, int) or nbytes <= 0 or nbytes % quantum:
    raise ValueError(f"bench: the size of {collective} on {ranks} ranks must be a positive "
                     f"multiple of {quantum} bytes (float32), got {nbytes!r}")
  unknown = [a for a in algorithms if split_depth(a)[0] not in ALGORITHMS[collective]]
  if unknown or not algorithms:
    raise ValueError(f"bench: algorithms of {collective} must be some of "
                     f"{', '.join(ALGORITHMS[collective])}; got {list(algorithms)}")
  for a in algorithms:
    name, chunks = split_depth(a)
    if chunks is not None and (collective != "all_reduce" or name == BASELINES[collective]):
      raise ValueError(f"bench: {a!r}: only all_reduce's schedules take a depth 'name@K'")
  if not isinstance(repeats, int) or repeats < 1:
    raise ValueError(f"bench: repeats must be an integer >= 1, got {repeats!r}")
  for intra, inter in configurations:  # raises on bad sizes, ranks or fractions
    Cluster(ranks, rate, intra, inter_stragglers=inter, **shape)


def _row(collective, alg, topology, levels, nbytes, efficiency, measured, samples, psum) -> dict:
  name, chunks = split_depth(alg)
  schedule = plan(collective, nbytes, topology,
                  algorithm="ring" if name == BASELINES[collective] else name, chunks=chunks)
  simulated = simulate(schedule, effective(topology, efficiency))
  intra, inter = levels
  t_ff = fault_free_ring_time(nbytes, topology.size, max(topology.bandwidth))
  t_ff /= 1 if collective == "all_reduce" else 2
  row = {"collective": collective, "algorithm": alg, "ranks": topology.size,
         "stragglers": dict(sorted(intra.items())), "inter_stragglers": dict(sorted(inter.items())),
         "nbytes": nbytes, "measured_s": measured, "samples_s": samples,
         "lower_bound_s": lower_bound(collective, nbytes, topology),
         "simulated_s": simulated.time, "fault_free_psum_s": psum, "t_ff_s": t_ff,
         "t_ff_over_b_s": t_ff / min([*intra.values(), *inter.values()], default=1.0),
         "link_efficiency": efficiency}
  if topology.num_clusters > 1:
    row["inter_cluster_bytes_expected"] = simulated.inter_bytes
  return row
