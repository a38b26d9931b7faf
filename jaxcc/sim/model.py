"""Closed-form times of the regular algorithms on a flat topology, for pricing at scale.

``algorithm="auto"`` prices its candidates with ``simulate`` while their
tables are small; beyond ``planner.SIMULATED_TRANSFERS`` transfers it prices
them here, in seconds, without building a table; the pipeline depth
(``planner.depth``) starts from the depth of the least time here. For ``p`` ranks
with send ports ``S_i``, receive ports ``R_i``, message costs ``o_i``, ``N``
bytes and ``K`` chunks:

  time = ports + fill + hops * alpha

* ports: a ring runs at its slowest link ``min_i min(S_i, R_(i+1))``
  (every step waits for the previous one): ``2 (p-1) N / p`` over it for an
  all_reduce, ``(p-1) N / p`` for reduce_scatter and all_gather, and
  ``K`` times ``2 (p-1)`` (or ``p-1``) message costs of its costliest rank; a
  chain broadcast forwards ``K`` pieces store-and-forward over ``p - 1`` hops:
  the first through every hop's send and receive port, the other ``K - 1`` at
  its slowest hop; a ppermute's pairs alike, over one hop. The others run at
  their busiest port: its bytes at its rate plus ``K m_i o_i`` for its ``m_i``
  messages per chunk: direct ``2 (p-1) N / p`` (all_reduce) or ``(p-1) N / p``
  per rank each way in ``2 (p-1)`` or ``p-1`` messages; optcc ``N + (p-2) w_i``
  with the shares ``w_i`` it plans (``optcc.shares``) in
  ``optcc.messages_per_chunk``, in the form ``optcc_min_owners`` picks; a
  direct broadcast's k-th copy leaves the root after ``k (o + N / S_root)``
  and is in ``o + N / R`` later.
* fill: ``FILL[algorithm] / K`` of the ports term, the pipeline's start
  and drain. The constants are the median of ``(simulate / bandwidth - 1) K``
  over p in 3..32, 0 to 3 stragglers at 0.25..0.9 and K in 1..32 (19,026
  simulated schedules without message costs); ``tests/sim/test_model.py``
  checks that the algorithm priced cheapest here is the simulator's cheapest
  or within a few percent of it.
* alpha: the smallest message latency (``lower_bound``'s); hops: the messages
  one piece passes in turn (ring ``p - 1`` per phase, the others 1 per phase).

``pipeline_time`` extends it to the algorithms without a closed form
(hierarchical, r2ccl, topologies of clusters): the lower bound's bandwidth
term with the fill and message costs of a direct schedule.
"""

from __future__ import annotations

import functools

import numpy as np

from jaxcc.schedules.depth import depth_limit
from jaxcc.schedules.optcc import (GRID_FEWEST_OWNERS, GRID_MIN_OWNERS, grid_layout,
                                   messages_per_chunk, shares)
from jaxcc.sim.bounds import lower_bound
from jaxcc.topology import Topology

API = "jaxcc.sim.model_time"
FILL = {"ring": 0.125, "direct": 0.06, "optcc": 0.52}
# OptCC's grid form (optcc.grid_layout), measured as FILL at p = 64 to 256 with one or two
# stragglers and K in 1..16: 0.3-1.1, less on larger grids (0.6 on 15 x 17 at a straggler of
# 0.5); smaller grids fill for longer (1-2.9 on 2 x 3 to 3 x 5), where the grid is not priced.
FILL_GRID = 0.6
FILL_OTHER = 0.5  # pipeline_time's fill for the algorithms without a closed form
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
  cost = np.asarray(topology.message_cost)
  alpha = float(np.sort(latency)[1])
  piece = n / k
  if collective == "ppermute":
    return max((_chain([s], [d], piece, k, send, recv, cost) + max(latency[s], latency[d])
                for s, d in perm if s != d), default=0.0)
  if collective == "broadcast":
    if algorithm == "ring":
      order = (root + np.arange(p)) % p
      return _chain(order[:-1], order[1:], piece, k, send, recv, cost) + (p - 1) * alpha
    order = (root + np.arange(1, p)) % p
    leave = np.arange(1, p) * (cost[root] + n / send[root])
    return float((leave + cost[order] + n / recv[order]).max() + alpha)
  phases = 2 if collective == "all_reduce" else 1
  if algorithm == "ring":
    link = np.minimum(send, np.roll(recv, -1)).min()
    ports = phases * (p - 1) * (n / p / link + k * cost.max())
    hops = phases * (p - 1)
  else:
    if algorithm == "optcc":
      return _optcc_time(n, topology, k, optcc_min_owners(n, topology)) + phases * alpha
    volume = np.full(p, phases * (p - 1) * n / p)
    ports = _busiest_port(volume, k * cost * phases * (p - 1), send, recv)
    hops = phases
  return float(ports * (1 + FILL[algorithm] / k) + hops * alpha)


@functools.lru_cache(maxsize=256)
def optcc_min_owners(nbytes: float, topology: Topology) -> int:
  """The ``min_owners`` of the OptCC schedule the planner builds (``optcc.grid_layout``):
  ``GRID_FEWEST_OWNERS`` where the grid form at its least modelled time is faster than the
  direct form at its, both over the depths the direct form allows, else
  ``GRID_MIN_OWNERS``. Without message costs the direct form is never slower at one depth;
  with them the grid's ``4 (a + b)`` messages per rank and chunk against ``4 (p-1)`` can be."""
  bw = topology.bandwidth
  if grid_layout(bw) is not None or grid_layout(bw, GRID_FEWEST_OWNERS) is None:
    return GRID_MIN_OWNERS
  limit = depth_limit("all_reduce", int(nbytes), topology.size,
                      2 * int(messages_per_chunk(bw).max()))
  depths = [1 << i for i in range(limit.bit_length())]
  least = {m: min(_optcc_time(float(nbytes), topology, k, m) for k in depths)
           for m in (GRID_MIN_OWNERS, GRID_FEWEST_OWNERS)}
  return GRID_FEWEST_OWNERS if least[GRID_FEWEST_OWNERS] < least[GRID_MIN_OWNERS] else (
      GRID_MIN_OWNERS)


def _optcc_time(n: float, topology: Topology, k: int, min_owners: int) -> float:
  """OptCC's modelled time without latency: its busiest port's ``N + (p-2) w_i`` bytes and
  ``K m_i`` messages, with its fill."""
  bw, p = topology.bandwidth, topology.size
  volume = n + (p - 2) * shares(bw, min_owners) * n
  messages = k * np.asarray(topology.message_cost) * messages_per_chunk(bw, min_owners)
  ports = _busiest_port(volume, messages, np.asarray(topology.send_bandwidth),
                        np.asarray(topology.recv_bandwidth))
  fill = FILL["optcc"] if grid_layout(bw, min_owners) is None else FILL_GRID
  return float(ports * (1 + fill / k))


def _busiest_port(volume, message_seconds, send, recv) -> float:
  """The longest any port is busy: its bytes at its rate plus its messages' costs."""
  return float(max((volume / send + message_seconds).max(),
                   (volume / recv + message_seconds).max()))


def pipeline_time(collective: str, algorithm: str, nbytes: float, topology: Topology,
                  chunks: int, *, root: int = 0, perm=()) -> float:
  """``model_time`` where it has a closed form; else the lower bound's bandwidth term ``T``
  as a direct schedule pipelines it: ``T (1 + FILL_OTHER / K) + K m o`` with ``m`` a direct
  schedule's messages per rank and chunk and ``o`` the costliest rank's message cost."""
  if algorithm in MODELLED.get(collective, ()) and topology.cluster is None:
    return model_time(collective, algorithm, nbytes, topology, chunks, root=root, perm=perm)
  p, k = topology.size, max(int(chunks), 1)
  messages = (2 if collective == "all_reduce" else 1) * max(p - 1, 1)
  bandwidth = lower_bound(collective, nbytes, topology, root=root, perm=perm or None)
  return bandwidth * (1 + FILL_OTHER / k) + k * messages * max(topology.message_cost)


def _chain(frm, to, piece: float, k: int, send, recv, cost) -> float:
  """``k`` pieces store-and-forward along the hops ``frm[h] -> to[h]``: the first through
  every hop's ports, the others at the slowest hop."""
  tx = cost[frm] + piece / send[frm]
  rx = cost[to] + piece / recv[to]
  return float((tx + rx).sum() + (k - 1) * np.maximum(tx, rx).max())
