"""Lower bounds on collective time over per-rank send/receive ports (optcc.md §2).

Each bound is ``max(volume terms) + alpha_min``, and at least ``2 alpha_min``
for an all_reduce:

* each rank ``i`` must send at least ``out_i`` and receive at least ``in_i``
  bytes, through ports of ``S_i`` and ``R_i`` bytes/s;
* a collective needs at least ``V`` element transfers in total, and each one
  occupies one send port and one receive port: ``V / sum(S)`` and ``V / sum(R)``;
* the last byte any rank needs arrives one message latency after it left a
  port, and a message latency is at least ``alpha_min``, the smallest
  ``topology.message_latency(i, j)`` over ``i != j``;
* an all_reduce needs two hops: a rank cannot send and receive a range in one
  step, so some rank's result comes in a message sent after one was delivered.
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

A ppermute has its own bound: each pair ``(s, d)`` of its perm (``s != d``)
moves ``N`` bytes through s's send port and d's receive port, and no rank is
in two pairs on one side, so the bound is the slowest pair's
``N / min(S_s, R_d) + topology.message_latency(s, d)``.
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
  if collective == "ppermute":
    return float(max((n / min(send[s], recv[d]) + topology.message_latency(s, d)
                      for s, d in perm if s != d), default=0.0))
  if collective == "all_reduce":
    out, into, volume = np.full(p, n), np.full(p, n), 2 * (p - 1) * n
  elif collective == "reduce_scatter":
    out, into, volume = np.full(p, (p - 1) * n / p), np.full(p, n / p), (p - 1) * n
  elif collective == "all_gather":
    out, into, volume = np.full(p, n / p), np.full(p, (p - 1) * n / p), (p - 1) * n
  else:
    out = np.where(np.arange(p) == root, n, 0.0)
    into, volume = n - out, (p - 1) * n
  bandwidth_time = max((out / send).max(), (into / recv).max(),
                       volume / send.sum(), volume / recv.sum())
  alpha = np.sort(topology.latency)[1]  # min over i != j of max(lat_i, lat_j).
  if collective == "all_reduce":
    return float(max(bandwidth_time + alpha, 2 * alpha))
  return float(bandwidth_time + alpha)


def fault_free_ring_time(nbytes: float, p: int, bandwidth: float) -> float:
  """``T_ff = 2 (p - 1) / p * N / B``: a ring all_reduce on ``p`` equal ports of ``B`` bytes/s."""
  return 2 * (p - 1) / p * nbytes / bandwidth
