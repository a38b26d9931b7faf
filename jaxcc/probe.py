"""Topology measured from the network: per-pair rates over jaxcc's TCP transport, then clusters.

``probe_topology`` measures the ranks of one mesh axis (one rank per process,
as on a cluster of hosts) with the native probe (``jaxcc.network.probe``):
every ordered pair of processes in ``p - 1`` rounds of host messages timed by
the transport itself, no JAX program per round. Then:

1. Clusters: ranks joined by a pair rate above the widest gap (a factor of
   at least ``cluster_gap``) in the sorted pair rates form a cluster, each
   rate taken over the fastest pair of its slower end, so that a straggler
   stays in its cluster; no such gap: one flat cluster.
2. Ports: a rank's send (receive) rate inside its cluster is the rate of
   its fastest pairs to (from) ranks of its cluster (``_port_rate``), and
   likewise across clusters (a pair runs at the slower of its sender's and
   receiver's ports).
3. Latency: a rank's latency inside its cluster (and across) is the shortest
   one-way time of its pairs there (a message from ``i`` to ``j`` arrives
   ``max(latency[i], latency[j])`` after its last byte left).
4. Message cost: a rank's is the smallest of its pairs' (a pair's is the work
   per message at its busier end).

Bytes sent per rank: ``jaxcc.network.probe``'s. On 8 testbed hosts at
200 Mbit/s inside two clusters and 20 Mbit/s across: see ``jaxcc bench probe``.
"""

from __future__ import annotations

import numpy as np
from jax.sharding import Mesh

from jaxcc.network import native_probe
from jaxcc.topology import MESSAGE_COST, Topology

_API = "jaxcc.probe_topology"
_NEAR_TOP = 0.8  # a port's rate: the median of its pairs within this of its second fastest


def probe_topology(mesh: Mesh, axis_name: str, *, nbytes: int = 128 << 10,
                   seconds: float = 0.08, cluster_gap: float = 2.0) -> Topology:
  """Measure the network between the ranks of ``axis_name`` and return it as a Topology.

  Every process must call it (it exchanges host messages). Call it again
  after the network changed (``jaxcc.network.MeasuredNetwork`` does, for a
  training loop): a new Topology passed to jaxcc's collectives re-plans them
  (one re-trace).

  Args:
    mesh: the mesh whose axis to probe; its other axes must have size 1, and
      every rank of the axis must live in its own process.
    axis_name: the axis.
    nbytes: timed bytes per pair in the first pass (sizes the second).
    seconds: the time a pair's timed messages should take; shorter ones are
      timed again, sized by their first rate.
    cluster_gap: the least ratio between the slowest rate inside clusters and
      the fastest across them for the ranks to count as clusters.

  Returns:
    A flat Topology (send and receive bandwidth per rank, bytes/s) or one of
    consecutive clusters, with the measured latencies.
  """
  _check(mesh, axis_name, nbytes, seconds, cluster_gap)
  m = native_probe.probe(first_bytes=nbytes, seconds=seconds)
  procs = np.ix_(*[process_of_ranks(mesh)] * 2)
  return topology_from_rates(m.rates[procs], cluster_gap, m.one_way[procs],
                             m.message_cost[procs])


def process_of_ranks(mesh: Mesh) -> np.ndarray:
  """The process of each device of ``mesh`` in mesh order (one rank per process on the axis)."""
  return np.array([d.process_index for d in mesh.devices.reshape(-1)], np.int64)


def topology_from_rates(rates: np.ndarray, cluster_gap: float = 2.0,
                        one_way: np.ndarray | None = None,
                        message_cost: np.ndarray | None = None) -> Topology:
  """The Topology of a measured ``[src, dst]`` rate matrix (bytes/s, diagonal ignored).

  Clusters: ranks joined by a pair above the widest gap (at least
  ``cluster_gap``) in the sorted pair rates, each over the fastest pair of
  its slower end (so that a straggler's slow port does not cut it off); each
  rank's ports: its fastest rate to and from its cluster, and across; its
  latency at each level: the shortest of ``one_way`` (``[src, dst]``
  seconds; None or NaN: 0) over its pairs there, either way; its message
  cost: the smallest of ``message_cost`` (``[src, dst]`` seconds) over all
  its pairs (None or none measured: ``topology.MESSAGE_COST``).

  Raises:
    ValueError: a cluster's ranks are not consecutive along the axis (the
      mesh puts the ranks of one fabric apart: order its devices by host).
  """
  rates = np.asarray(rates, float)
  p = rates.shape[0]
  off = ~np.eye(p, dtype=bool)
  if p == 1:
    return Topology.uniform(1, 1.0)
  one_way = np.full((p, p), np.nan) if one_way is None else np.asarray(one_way, float)
  one_way = np.fmin(one_way, one_way.T)
  cost = _message_cost(message_cost, off)
  pair = np.fmax(rates, rates.T)  # a pair belongs together if either direction is fast
  fastest = np.max(np.where(off, pair, -np.inf), axis=1)
  # Over the slower end's fastest pair: a straggler's own slow port leaves it in its cluster.
  relative = pair / np.minimum.outer(fastest, fastest)
  values = np.sort(relative[off])
  ratios = values[1:] / values[:-1]
  cut = int(np.argmax(ratios))
  cluster = _components(relative > values[cut], p)
  if ratios[cut] < cluster_gap or len(set(cluster)) == 1:
    return Topology(tuple(_port_rate(rates, off, 1)), tuple(_port_rate(rates, off, 0)),
                    _latency(one_way, off), message_cost=cost)
  if any(b < a for a, b in zip(cluster, cluster[1:])):
    raise ValueError(f"{_API}: the measured clusters {cluster} are not consecutive along the "
                     "axis; build the mesh with the devices of each cluster next to each other")
  same = np.equal.outer(cluster, cluster) & off
  cross = ~np.equal.outer(cluster, cluster)
  return Topology(tuple(_port_rate(rates, same, 1)), tuple(_port_rate(rates, same, 0)),
                  _latency(one_way, same), tuple(cluster), tuple(_port_rate(rates, cross, 1)),
                  tuple(_port_rate(rates, cross, 0)), _latency(one_way, cross), cost)


def _port_rate(rates: np.ndarray, mask: np.ndarray, axis: int) -> np.ndarray:
  """Per rank its port's rate from ``mask``'s pairs (sends: axis 1, receives: axis 0).

  A pair runs at its slower end, so a rank's port is its fastest pairs: the
  median of the pairs within ``_NEAR_TOP`` of its second-fastest (its
  fastest where it has fewer than three), so that neither one pair timed
  high nor the noise of the fastest of several sets it. Every rank has a
  pair in its cluster: its fastest pair is never cut off.
  """
  mask = mask & ~np.isnan(rates)  # a pair not measured does not count
  values = np.where(mask, rates, np.nan)
  values = values if axis == 1 else values.T
  ports = np.full(len(values), np.nan)
  for r, row in enumerate(values):
    got = np.sort(row[~np.isnan(row)])
    if len(got):
      top = got[-2] if len(got) >= 3 else got[-1]
      ports[r] = np.median(got[got >= _NEAR_TOP * top])
  known = np.isfinite(ports)  # a rank none of whose pairs was measured: the others' median
  fill = np.median(ports[known]) if known.any() else np.nanmax(np.where(np.isinf(rates), np.nan,
                                                                        rates))
  return np.where(known, ports, fill)


def _latency(one_way: np.ndarray, mask: np.ndarray) -> tuple[float, ...]:
  """Per rank the shortest one-way time of ``mask``'s pairs (0 where none was measured)."""
  shortest = np.min(np.where(mask & ~np.isnan(one_way), one_way, np.inf), axis=1)
  return tuple(float(t) if np.isfinite(t) else 0.0 for t in shortest)


def _message_cost(pairs: np.ndarray | None, off: np.ndarray) -> tuple[float, ...] | None:
  """Per rank the smallest message cost of its pairs, either way; None where none of the
  ranks has a measured pair (the Topology's default), ``MESSAGE_COST`` for a rank without."""
  if pairs is None or np.isnan(np.where(off, pairs, np.nan)).all():
    return None
  pairs = np.asarray(pairs, float)
  pairs = np.where(off, np.fmin(pairs, pairs.T), np.inf)
  smallest = np.min(np.where(np.isnan(pairs), np.inf, pairs), axis=1)
  return tuple(float(c) if np.isfinite(c) else MESSAGE_COST for c in smallest)


def _components(adjacent: np.ndarray, p: int) -> list[int]:
  """Cluster ids (numbered in rank order) of the connected components of ``adjacent``."""
  ids = [-1] * p
  count = 0
  for start in range(p):
    if ids[start] >= 0:
      continue
    stack, ids[start] = [start], count
    while stack:
      r = stack.pop()
      for q in np.flatnonzero(adjacent[r]):
        if ids[q] < 0:
          ids[q] = count
          stack.append(q)
    count += 1
  return ids


def _check(mesh, axis_name, nbytes, seconds, cluster_gap) -> None:
  check_mesh(_API, mesh, axis_name)
  if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 1:
    raise ValueError(f"{_API}: nbytes must be a positive int, got {nbytes!r}")
  if not seconds > 0 or not cluster_gap > 1:
    raise ValueError(f"{_API}: seconds must be > 0 and cluster_gap > 1, got {seconds!r} and "
                     f"{cluster_gap!r}")


def check_mesh(api: str, mesh, axis_name) -> None:
  """A mesh whose axis can be measured: its other axes of size 1, each rank in its own process.

  Raises:
    ValueError: naming ``api`` and what does not hold.
  """
  if not isinstance(mesh, Mesh) or axis_name not in mesh.axis_names:
    raise ValueError(f"{api}: axis_name must name an axis of the mesh; got {axis_name!r} for "
                     f"{getattr(mesh, 'axis_names', mesh)!r}")
  if any(size != 1 for name, size in mesh.shape.items() if name != axis_name):
    raise ValueError(f"{api}: the mesh's other axes must have size 1, got {dict(mesh.shape)}")
  procs = [d.process_index for d in mesh.devices.reshape(-1)]
  if len(set(procs)) != len(procs):
    raise ValueError(f"{api}: every rank of {axis_name!r} must live in its own process (the "
                     f"network between processes is what it measures); processes {procs}")
