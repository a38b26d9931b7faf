"""The mixing graphs of gossip DiLoCo, as shifts along the worker axis, and what they send.

Every graph but "complete" is circulant: in a mixing round worker ``i``
averages, with equal weights, its own vector and the vectors of the workers
``i - s`` for each shift ``s`` of that round. A circulant matrix with equal
weights is doubly stochastic, so every round keeps the average of the
workers. "complete" is the exact average, computed with one all-reduce.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

GRAPHS = ("complete", "ring", "exponential", "one_peer_exponential")


def check_graph(api: str, graph) -> str:
  if graph not in GRAPHS:
    raise ValueError(f"{api}: graph must be one of {GRAPHS}, got {graph!r}")
  return graph


def phases(graph: str, n: int) -> tuple[tuple[int, ...], ...]:
  """The shifts of each mixing round, cycling with the round index, for ``n`` workers.

  "ring" receives from ``i - 1`` and ``i + 1``; "exponential" from ``i - 2^k``
  for every ``2^k < n``; "one_peer_exponential" from ``i - 2^(r mod
  ceil(log2 n))`` in round ``r`` (for ``n`` a power of two, ``log2 n``
  consecutive rounds multiply to the exact average). "complete" has no shifts:
  it is mixed by an all-reduce.
  """
  if graph == "complete" or n == 1:
    return ((),)
  if graph == "ring":
    return (tuple(sorted({1, n - 1})),)
  hops = tuple(1 << k for k in range(math.ceil(math.log2(n))))
  if graph == "exponential":
    return (hops,)
  return tuple((h,) for h in hops)


def mixing_matrix(graph: str, n: int, mixing_round: int = 0) -> np.ndarray:
  """W with ``W[i, j]`` the weight of worker ``j``'s vector in worker ``i``'s mix.

  Args:
    graph: one of ``GRAPHS``.
    n: the number of workers.
    mixing_round: the index of the round (only "one_peer_exponential" changes with it).

  Returns:
    An ``(n, n)`` doubly stochastic float64 matrix (no messages lost).
  """
  check_graph("jaxcc.optim.mixing_matrix", graph)
  if graph == "complete":
    return np.full((n, n), 1.0 / n)
  shifts = phases(graph, n)[mixing_round % len(phases(graph, n))]
  w = np.eye(n) / (len(shifts) + 1)
  for s in shifts:
    w[np.arange(n), (np.arange(n) - s) % n] += 1.0 / (len(shifts) + 1)
  return w


class RoundCost(NamedTuple):
  """What one worker sends in one outer round (H inner steps).

  Attributes:
    overlapped_bytes: bytes sent during the inner steps, overlapping computation.
    blocking_bytes: bytes sent at the sync step, while computation waits.
    overlapped_messages: messages (point-to-point sends, or steps of a ring
      all-reduce) sent during the inner steps.
    blocking_messages: messages sent one after another at the sync step.
  """
  overlapped_bytes: float
  blocking_bytes: float
  overlapped_messages: int
  blocking_messages: int


def diloco_round_cost(params, axis_size: int) -> RoundCost:
  """DiLoCo's round: one blocking ring all-reduce of the pseudo-gradient.

  A ring all-reduce of N bytes sends ``2(n-1)/n N`` bytes per worker in
  ``2(n-1)`` steps.

  Args:
    params: the parameters (a pytree of arrays or shape-dtype structs).
    axis_size: the number of workers n.
  """
  nbytes = _flat_nbytes(params)
  return RoundCost(0.0, _all_reduce_bytes(nbytes, axis_size), 0, 2 * (axis_size - 1))


def fragments(sync_every: int) -> int:
  """The fragments of the anchor that a round of H = ``sync_every`` inner steps sends: ceil(H/2).

  Inner step f < F sends fragment f; the other H - F steps are the slack
  in which the last one arrives.
  """
  return -(-sync_every // 2)


def gossip_round_cost(params, axis_size: int, graph: str, blocking_rounds: int,
                      sync_every: int) -> RoundCost:
  """Gossip DiLoCo's round: the overlapped anchor mix and ``blocking_rounds`` mixes.

  The anchor (N bytes) is sent as F = ``fragments(sync_every)`` fragments of
  ``ceil(N / F)`` elements, one per inner step of the first F, to each peer of
  the round; each blocking mix sends the N-byte pseudo-gradient once to each peer.
  Peers per round: 1 for "one_peer_exponential", 2 for "ring" (1 if n = 2),
  ``ceil(log2 n)`` for "exponential". "complete" runs ring all-reduces instead
  (``2(n-1)/n`` of the bytes each, ``2(n-1)`` steps).

  Args:
    params: the parameters (a pytree of arrays or shape-dtype structs).
    axis_size: the number of workers n.
    graph: one of ``GRAPHS``.
    blocking_rounds: mixes at the sync step.
    sync_every: inner steps per round, H.
  """
  check_graph("jaxcc.optim.gossip_round_cost", graph)
  n, leaves = axis_size, jax.tree.leaves(params)
  size, itemsize = sum(math.prod(x.shape) for x in leaves), _itemsize(leaves)
  frags = fragments(sync_every)
  padded = -(-size // frags) * frags * itemsize
  if graph == "complete":
    steps = 2 * (n - 1)
    return RoundCost(_all_reduce_bytes(padded, n), blocking_rounds * _all_reduce_bytes(
        size * itemsize, n), frags * steps, blocking_rounds * steps)
  peers = len(phases(graph, n)[0])
  return RoundCost(float(peers * padded), float(blocking_rounds * peers * size * itemsize),
                   frags * peers, blocking_rounds * peers)


def _all_reduce_bytes(nbytes: int, n: int) -> float:
  return 2 * (n - 1) / n * nbytes


def _itemsize(leaves) -> int:
  """The item size of the flat vector ``ravel_pytree`` makes of these leaves."""
  return jnp.result_type(*[x.dtype for x in leaves]).itemsize


def _flat_nbytes(params) -> int:
  leaves = jax.tree.leaves(params)
  return sum(math.prod(x.shape) for x in leaves) * _itemsize(leaves)
