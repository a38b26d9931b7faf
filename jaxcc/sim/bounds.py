"""Lower bounds on collective time over per-rank send/receive ports (optcc.md §2).

Each bound is ``max(volume terms) + alpha_min``, and at least
``2 (alpha_min + 2 o_min)`` for an all_reduce:

* each rank ``i`` must send at least ``out_i`` and receive at least ``in_i``
  bytes, through ports of ``S_i`` and ``R_i`` bytes/s, in at least one message
  each way, which holds the port ``o_i = topology.message_cost[i]`` beside its
  bytes: ``out_i / S_i + o_i`` (where ``out_i > 0``), ``in_i / R_i + o_i``;
* a collective needs at least ``V`` element transfers in total, and each one
  occupies one send port and one receive port: ``V / sum(S)`` and ``V / sum(R)``;
* the last byte any rank needs arrives one message latency after it left a
  port, and a message latency is at least ``alpha_min``, the smallest
  ``topology.message_latency(i, j)`` over ``i != j``;
* an all_reduce needs two hops: a rank cannot send and receive a range in one
  step, so some rank's result comes in a message sent after one was delivered;
  each of the two holds a send and a receive port, ``2 o_min`` at least.
  With pipelining the second hop overlaps the transfers of the first, so it is
  not added to the volume terms (a direct all_reduce of 2 ranks in 64 chunks
  finishes before ``N / B + 2 alpha``).

Volumes, with ``N = nbytes`` and shards of ``N / p``:

| collective     | out_i                      | in_i                       | V           |
| -------------- | -------------------------- | -------------------------- | ----------- |
| all_reduce     | N                          | N                          | 2(p - 1) N  |
| reduce_scatter | (p - 1) N / p              | N / p                      | (p - 1) N   |
| all_gather     | N / p                      | (p - 1) N / p              | (p - 1) N   |
| broadcast      | N at the root, 0 elsewhere | 0 at the root, N elsewhere | (p - 1) N   |

In a topology of clusters (C clusters, cluster c of ``n_c`` ranks with
intra ports ``S_i``, ``R_i`` and cross-cluster ports ``s_i``, ``r_i``;
``sigma_c``, ``rho_c`` the sums of its cross-cluster ports) the bound is the
largest of:

* the cut around each cluster: all_reduce ``N / sigma_c`` and ``N / rho_c``
  (the rest of the sum must enter c, c's part leave it); reduce_scatter
  ``(p - n_c) N / p / sigma_c`` and ``n_c N / p / rho_c``; all_gather the
  reverse; broadcast ``N`` out of the root's cluster and into every other;
* the cross-cluster volume over all cross-cluster ports: ``2(C-1) N`` for
  all_reduce, ``(C-1) N`` for the others;
* inside each cluster, the volume over its intra ports: ``2(n_c - 1) N`` for
  all_reduce, ``(n_c - 1) N`` for reduce_scatter and all_gather;
* each rank's ``out_i`` and ``in_i`` through both its ports (its intra ports
  when there is one cluster).

It bounds the schedules that move no more than that minimum across clusters
(research/hetccl.md §6), every hierarchical one among them: each element
crosses into a cluster once, so a cluster's own contributions meet, and the
result spreads, on its intra ports. A schedule that sends more across (a flat
ring over the clusters) is not bounded by the intra term where cross-cluster
ports outrun intra ones.

A ppermute has its own bound: each pair ``(s, d)`` of its perm (``s != d``)
moves ``N`` bytes through s's send port and d's receive port, and no rank is
in two pairs on one side, so the bound is the slowest pair's
``N / min(S_s, R_d) + o_s + o_d + topology.message_latency(s, d)``.
"""

from __future__ import annotations

import numpy as np

from jaxcc.schedules.ir import COLLECTIVES, check_perm
from jaxcc.topology import Topology

API = "jaxcc.sim.lower_bound"


def lower_bound(collective: str, nbytes: float, topology: Topology, *, root: int = 0,
                perm=None) -> float:
  """The least time (seconds) any schedule of ``collective`` can take on ``topology``.

  Args:
    collective: one of ``"all_reduce"``, ``"reduce_scatter"``, ``"all_gather"``,
      ``"broadcast"``, ``"ppermute"``.
    nbytes: ``N``: the buffer of each rank (all_reduce), the full input of each
      rank (reduce_scatter), the full output (all_gather), the root's buffer
      (broadcast), the array each source sends (ppermute).
    topology: per-rank send and receive bandwidth (bytes/s) and latency (s).
    root: the root rank of a broadcast.
    perm: the ``(src, dst)`` pairs of a ppermute (required for it).

  Returns:
    The bound in seconds; 0.0 for a single rank, ``nbytes == 0`` or a perm
    that moves nothing.
  """
  if collective not in COLLECTIVES:
    raise ValueError(f"{API}: collective must be one of {COLLECTIVES}, got {collective!r}")
  if (isinstance(nbytes, bool) or not isinstance(nbytes, (int, float, np.number))
      or not 0 <= nbytes < float("inf")):
    raise ValueError(f"{API}: nbytes must be a finite number >= 0, got {nbytes!r}")
  p = topology.size
  if not isinstance(root, (int, np.integer)) or not 0 <= root < p:
    raise ValueError(f"{API}: root must be a rank in [0, {p}), got {root!r}")
  if collective == "ppermute":
    perm = check_perm(perm, p, API)
  elif perm is not None:
    raise ValueError(f"{API}: perm is for ppermute only, not {collective!r}")
  if p == 1 or nbytes == 0:
    return 0.0
  n = float(nbytes)
  send = np.asarray(topology.send_bandwidth)
  recv = np.asarray(topology.recv_bandwidth)
  cost = np.asarray(topology.message_cost)
  if collective == "ppermute":
    return float(max((n / _pair_bandwidth(topology, s, d) + cost[s] + cost[d]
                      + topology.message_latency(s, d) for s, d in perm if s != d), default=0.0))
  out, into, volume = _volumes(collective, n, p, root)
  if topology.cluster is None:
    bandwidth_time = max(_port_time(out, send, cost), _port_time(into, recv, cost),
                         volume / send.sum(), volume / recv.sum())
  else:
    bandwidth_time = _clustered_time(collective, n, topology, root, out, into)
  alpha = _min_latency(topology)
  if collective == "all_reduce":
    return float(max(bandwidth_time + alpha, 2 * (alpha + 2 * cost.min())))
  return float(bandwidth_time + alpha)


def fault_free_ring_time(nbytes: float, p: int, bandwidth: float) -> float:
  """``T_ff = 2 (p - 1) / p * N / B``: a ring all_reduce on ``p`` equal ports of ``B`` bytes/s."""
  return 2 * (p - 1) / p * nbytes / bandwidth


def _port_time(nbytes: np.ndarray, rate: np.ndarray, cost: np.ndarray) -> float:
  """The busiest port's least time: its bytes at its rate and, where it moves any, one message
  cost."""
  return float((nbytes / rate + np.where(nbytes > 0, cost, 0.0)).max())


def _volumes(collective, n, p, root):
  """``out_i``, ``in_i`` (arrays) and ``V`` of the table in the module docstring."""
  if collective == "all_reduce":
    return np.full(p, n), np.full(p, n), 2 * (p - 1) * n
  if collective == "reduce_scatter":
    return np.full(p, (p - 1) * n / p), np.full(p, n / p), (p - 1) * n
  if collective == "all_gather":
    return np.full(p, n / p), np.full(p, (p - 1) * n / p), (p - 1) * n
  out = np.where(np.arange(p) == root, n, 0.0)
  return out, n - out, (p - 1) * n


def _clustered_time(collective, n, topology: Topology, root, out, into) -> float:
  """The bandwidth terms of a topology of clusters (module docstring)."""
  p, num = topology.size, topology.num_clusters
  send, recv = np.asarray(topology.send_bandwidth), np.asarray(topology.recv_bandwidth)
  isend = np.asarray(topology.inter_send_bandwidth)
  irecv = np.asarray(topology.inter_recv_bandwidth)
  cluster = np.asarray(topology.cluster)
  sizes = np.bincount(cluster, minlength=num).astype(np.float64)
  sigma = np.bincount(cluster, weights=isend, minlength=num)
  rho = np.bincount(cluster, weights=irecv, minlength=num)
  intra_send = np.bincount(cluster, weights=send, minlength=num)
  intra_recv = np.bincount(cluster, weights=recv, minlength=num)
  cost = np.asarray(topology.message_cost)
  crossing = num > 1  # one cluster: nothing crosses, the intra ports are the only ones
  terms = [_port_time(out, send + crossing * isend, cost),
           _port_time(into, recv + crossing * irecv, cost)]
  if num > 1:
    if collective == "all_reduce":
      cut_out, cut_in, cross = np.full(num, n), np.full(num, n), 2 * (num - 1) * n
    elif collective == "reduce_scatter":
      cut_out, cut_in, cross = (p - sizes) * n / p, sizes * n / p, (num - 1) * n
    elif collective == "all_gather":
      cut_out, cut_in, cross = sizes * n / p, (p - sizes) * n / p, (num - 1) * n
    else:
      home = np.arange(num) == cluster[root]
      cut_out, cut_in, cross = np.where(home, n, 0.0), np.where(home, 0.0, n), (num - 1) * n
    terms += [(cut_out / sigma).max(), (cut_in / rho).max(), cross / sigma.sum(),
              cross / rho.sum()]
  if collective in ("all_reduce", "reduce_scatter", "all_gather"):
    hops = 2 if collective == "all_reduce" else 1
    intra = hops * (sizes - 1) * n
    terms += [(intra / intra_send).max(), (intra / intra_recv).max()]
  return float(max(terms))


def _pair_bandwidth(topology: Topology, s: int, d: int) -> float:
  """The slowest port a message from s to d passes (through the relays across clusters)."""
  if topology.same_cluster(s, d):
    return min(topology.send_bandwidth[s], topology.recv_bandwidth[d])
  a, b = topology.relay(s), topology.relay(d)
  ports = [topology.inter_send_bandwidth[a], topology.inter_recv_bandwidth[b]]
  if a != s:
    ports += [topology.send_bandwidth[s], topology.recv_bandwidth[a]]
  if b != d:
    ports += [topology.send_bandwidth[b], topology.recv_bandwidth[d]]
  return min(ports)


def _min_latency(topology: Topology) -> float:
  """The smallest ``topology.message_latency(i, j)`` over ``i != j``."""
  if topology.cluster is None:
    return float(np.sort(topology.latency)[1])
  latency, inter = np.asarray(topology.latency), np.asarray(topology.inter_latency)
  cluster = np.asarray(topology.cluster)
  pairs = np.where(cluster[:, None] == cluster[None, :], np.maximum.outer(latency, latency),
                   np.maximum.outer(inter, inter))
  np.fill_diagonal(pairs, np.inf)
  return float(pairs.min())
