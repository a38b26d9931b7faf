"""The topology probe on the testbed: what ``jaxcc.probe_topology`` measured against the truth.

``run`` builds a ``jaxcc.testbed.Cluster`` (flat or in clusters, with
stragglers on either level), runs ``jaxcc.probe_topology`` in every host's
process and compares the probed Topology with the configured one: every
port's rate over its configured rate, the clusters and the stragglers found,
and how well it plans: the all_reduce schedule ``auto`` plans on the probed
topology, simulated on the configured network, over the one it plans on the
configured topology.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence

from jaxcc.launcher import launch
from jaxcc.network import snap
from jaxcc.planner import plan
from jaxcc.sim import simulate
from jaxcc.testbed import Cluster
from jaxcc.topology import Topology

WORKER = os.path.join(os.path.dirname(__file__), "probe_worker.py")
_PORTS = ("send_bandwidth", "recv_bandwidth", "inter_send_bandwidth", "inter_recv_bandwidth")


def run(ranks: int, *, rate: str | float = "200mbit",
        stragglers: Mapping[int, float] | None = None, clusters: Sequence[int] | None = None,
        inter_rate: str | float | None = None, inter_stragglers: Mapping[int, float] | None = None,
        nbytes: int = 128 << 10, seconds: float = 0.08, plan_bytes: int = 8 << 20,
        timeout_s: float = 300) -> dict:
  """Probe a testbed cluster and compare; returns the comparison (see ``compare``).

  Args:
    ranks: hosts.
    rate, stragglers, clusters, inter_rate, inter_stragglers: the cluster, as
      for ``jaxcc.testbed.Cluster``.
    nbytes, seconds: ``jaxcc.probe_topology``'s.
    plan_bytes: the all_reduce size planned for the planning comparison.
    timeout_s: limit for the probe.
  """
  cluster = Cluster(ranks, rate, stragglers, clusters=clusters, inter_rate=inter_rate,
                    inter_stragglers=inter_stragglers)
  config = json.dumps({"nbytes": nbytes, "seconds": seconds})
  with cluster:
    results = [p.json() for p in launch(WORKER, [config], cluster=cluster, timeout_s=timeout_s)]
  probed = [Topology(**r["topology"]) for r in results]
  if any(t != probed[0] for t in probed):
    raise RuntimeError("probe: the processes returned different topologies")
  return compare(probed[0], cluster.topology, plan_bytes) | {
      "probe_s": max(r["seconds"] for r in results), "nbytes": nbytes, "seconds": seconds}


def compare(probed: Topology, configured: Topology, plan_bytes: int) -> dict:
  """``{"configured", "probed"}`` (Topology fields), per-port ``ratios`` (probed / configured),
  ``worst_ratio`` (farthest from 1), whether the clusters and the stragglers match, and
  ``plan_ratio``: the simulated time on ``configured`` of the all_reduce planned on ``probed``
  over that of the one planned on ``configured``."""
  ratios = {}
  for name in _PORTS:
    got, want = getattr(probed, name), getattr(configured, name)
    if want is not None and got is not None:
      ratios[name] = [g / w for g, w in zip(got, want)]
  flat = [r for values in ratios.values() for r in values]
  # Planned as a measured network plans (jaxcc.network.snap: ports within 12.5% of each other
  # at their median; raw, 1% apart, they move OptCC's shares) with the configuration's latency
  # (0): the probe's latencies, timed through Python's wake-ups, have nothing to compare with.
  zero = (0.0,) * probed.size
  rates_only = dataclasses.replace(snap(probed, None, 0.125), latency=zero,
                                   inter_latency=None if probed.cluster is None else zero)
  times = [simulate(plan("all_reduce", plan_bytes, t), configured).time
           for t in (rates_only, configured)]
  return {"configured": _fields(configured), "probed": _fields(probed), "ratios": ratios,
          "worst_ratio": max(flat, key=lambda r: abs(r - 1)),
          "clusters_found": probed.cluster == configured.cluster,
          "stragglers_found": set(_slow(probed)) == set(_slow(configured)),
          "plan_ratio": times[0] / times[1]}


def _slow(topology: Topology) -> list[tuple[str, int]]:
  """The ports at most 0.9 of the fastest port of their level."""
  slow = []
  for name in _PORTS:
    values = getattr(topology, name)
    if values is not None:
      slow += [(name, i) for i, v in enumerate(values) if v < 0.9 * max(values)]
  return slow


def _fields(topology: Topology) -> dict:
  return {name: getattr(topology, name) for name in ("cluster", *_PORTS)}


def table(result: dict) -> str:
  """A markdown table: each port's configured and probed rate (Mbit/s) and their ratio."""
  conf, got = result["configured"], result["probed"]
  found = {True: "found", False: "MISSED"}
  lines = [f"probe: {result['probe_s']:.1f} s; clusters {found[result['clusters_found']]} "
           f"(probed {got['cluster']}); stragglers {found[result['stragglers_found']]}; "
           f"worst port ratio {result['worst_ratio']:.3f}; all_reduce planned on the probe / on "
           f"the configuration (simulated): {result['plan_ratio']:.3f}",
           "| rank | port | configured | probed | probed / configured |",
           "| --- | --- | --- | --- | --- |"]
  for name, ratios in result["ratios"].items():
    for rank, ratio in enumerate(ratios):
      lines.append(f"| {rank} | {name} | {conf[name][rank] * 8 / 1e6:.1f} Mbit/s "
                   f"| {got[name][rank] * 8 / 1e6:.1f} Mbit/s | {ratio:.3f} |")
  return "\n".join(lines)
