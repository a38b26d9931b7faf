"""Closed-form times of the regular algorithms on a flat topology, for pricing at scale.

``algorithm="auto"`` prices its candidates with ``simulate`` while their
tables are small; beyond ``planner.SIMULATED_TRANSFERS`` transfers it prices
them here, in microseconds, without building a table. For ``p`` ranks with
send ports ``S_i``, receive ports ``R_i``, ``N`` bytes and ``K`` chunks:

  time = bandwidth + fill + hops * alpha

* bandwidth: a ring runs at its slowest link ``min_i min(S_i, R_(i+1))``
  (every step waits for the previous one): ``2 (p-1) N / p`` over it for an
  all_reduce, ``(p-1) N / p`` for reduce_scatter and all_gather; a chain
  broadcast forwards ``K`` pieces store-and-forward over ``p - 1`` hops: the
  first through every hop's send and receive port, the other ``K - 1`` at its
  slowest link; a ppermute's pairs alike, over one hop. The others run at their
  busiest port: direct ``2 (p-1) N / p`` (all_reduce) or ``(p-1) N / p`` per
  rank each way; optcc ``N + (p-2) w_i`` with the shares ``w_i`` it plans
  (``optcc.shares``); a direct broadcast's k-th copy leaves the root after
  ``k N / S_root`` and is in ``N / R`` later.
* fill: ``FILL[algorithm] / K`` of the bandwidth term, the pipeline's start
  and drain. The constants are the median of ``(simulate / bandwidth - 1) K``
  over p in 3..32, 0 to 3 stragglers at 0.25..0.9 and K in 1..32 (19,026
  simulated schedules); ``tests/sim/test_model.py`` checks that the algorithm
  priced cheapest here is the simulator's cheapest or within a few percent of
  it (over its 480 cases: 0.16% slower on average, 7% at worst).
* alpha: the smallest message latency (``lower_bound``'s); hops: the messages
  one piece passes in turn (ring ``p - 1`` per phase, the others 1 per phase).
"""

from __future__ import annotations

import numpy as np

from jaxcc.schedules.optcc import shares
from jaxcc.topology import Topology

API = "jaxcc.sim.model_time"
FILL = {"ring": 0.125, "direct": 0.06, "optcc": 0.52}
# The algorithms of each collective that have a closed form here.
MODELLED = {
    "all_reduce": ("ring", "direct", "optcc"),
    "reduce_scatter": ("ring", "direct"),
    "all_gather": ("ring", "direct"),
    "broadcast": ("ring", "direct"),
    "ppermute": ("direct",),
}


def model_time(collective: str, algorithm: str, nbytes: float, topology: Topology,
               chunks: int, *, root: int = 0, perm=()) -> float:
  """The modelled time (seconds) of ``algorithm``'s ``collective`` on ``nbytes`` per rank.

  Args:
    collective, algorithm: a pair of ``MODELLED``.
    nbytes: ``N``, as ``lower_bound`` takes it.
    topology: a flat topology (no clusters).
    chunks: the pipeline depth ``K``.
    root: the root of a broadcast.
    perm: the ``(src, dst)`` pairs of a ppermute.

  Raises:
    ValueError: naming the pair or the topology the model does not cover.
  """
  if algorithm not in MODELLED.get(collective, ()):
    raise ValueError(f"{API}: no model for {algorithm!r} {collective!r}")
  if topology.cluster is not None:
    raise ValueError(f"{API}: the model covers flat topologies only, not clusters")
  p, n, k = topology.size, float(nbytes), max(int(chunks), 1)
  if p == 1 or n == 0:
    return 0.0
  send = np.asarray(topology.send_bandwidth)
  recv = np.asarray(topology.recv_bandwidth)
  latency = np.asarray(topology.latency)
  alpha = float(np.sort(latency)[1])
  if collective == "ppermute":
    return max((n / k * (1 / send[s] + 1 / recv[d]) + (k - 1) * n / k / min(send[s], recv[d])
                + max(latency[s], latency[d]) for s, d in perm if s != d), default=0.0)
  if collective == "broadcast":
    if algorithm == "ring":
      order = (root + np.arange(p)) % p
      frm, to = order[:-1], order[1:]
      first = (n / k * (1 / send[frm] + 1 / recv[to])).sum()
      return first + (k - 1) * n / k / np.minimum(send[frm], recv[to]).min() + (p - 1) * alpha
    order = (root + np.arange(1, p)) % p
    return float((np.arange(1, p) * n / send[root] + n / recv[order]).max() + alpha)
  phases = 2 if collective == "all_reduce" else 1
  if algorithm == "ring":
    link = np.minimum(send, np.roll(recv, -1)).min()
    bandwidth = phases * (p - 1) * n / p / link
    hops = phases * (p - 1)
  else:
    if algorithm == "optcc":
      volume = n + (p - 2) * shares(topology.bandwidth) * n
    else:
      volume = np.full(p, phases * (p - 1) * n / p)
    bandwidth = max((volume / send).max(), (volume / recv).max())
    hops = phases
  return float(bandwidth * (1 + FILL[algorithm] / k) + hops * alpha)
