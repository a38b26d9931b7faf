"""Direct (all-pairs) algorithms over shards of any sizes, pipelined over chunks.

Rank j owns shard j of ``w_j`` elements (``sum w = N``). Per chunk, one
reduce-scatter step (every rank sends its piece of shard j to j, which sums
all p contributions in one multi-input reduce) and one all-gather step (j
sends the reduced piece to every other rank). Rank i sends and receives
``N + (p-2) w_i`` elements in ``2 * chunks`` steps; a rank with ``w_i = 0``
only scatters its input and gathers the result (N each way).
"""

from __future__ import annotations

import numpy as np

from jaxcc.schedules.ir import COPY, REDUCE, RankSchedule, Schedule, TableBuilder
from jaxcc.schedules.pieces import equal_shards, piece_grid


def weighted_direct(collective: str, length: int, p: int, itemsize: int, chunks: int,
                    shard_bounds: np.ndarray, algorithm: str,
                    ranks=None) -> Schedule | RankSchedule:
  """Direct reduce-scatter and/or all-gather with shard j = ``shard_bounds[j:j+2]``; with
  ``ranks``, the part of it that they send or receive (``TableBuilder.build_part``)."""
  tb = TableBuilder(ranks)
  grid = piece_grid(shard_bounds, chunks)
  rs = collective in ("all_reduce", "reduce_scatter")
  ag = collective in ("all_reduce", "all_gather")
  # Round k + 1: rank i sends to i + k + 1, so no port gets two at once. Round 1 has a
  # transfer of every piece.
  shape, cover = (chunks, p - 1, p), lambda c, k, owner: [(c, 0, owner)]
  if rs:  # owner gets from owner - k - 1
    c, k, owner = tb.index(shape, lambda r, c, k, owner: [(c, k, r), (c, k, (r + k + 1) % p)],
                           cover)
    lo, hi = np.moveaxis(grid[owner, c], -1, 0)
    tb.add_rows(2 * c, (owner - k - 1) % p, owner, lo, lo, hi - lo, REDUCE)
  if ag:
    c, k, owner = tb.index(shape, lambda r, c, k, owner: [(c, k, r), (c, k, (r - k - 1) % p)],
                           cover)
    lo, hi = np.moveaxis(grid[owner, c], -1, 0)
    tb.add_rows(2 * c + 1, owner, (owner + k + 1) % p, lo, lo, hi - lo, COPY)
  if ranks is None:
    return tb.build(collective, p, length, itemsize, algorithm, chunks=chunks)
  w = np.diff(shard_bounds)  # owner j gets w_j from each other rank, then sends it to each
  sent = (length - w) * rs + (p - 1) * w * ag
  received = (p - 1) * w * rs + (length - w) * ag
  return tb.build_part(collective, p, length, itemsize, algorithm, sent, received,
                       chunks=chunks)


def direct(collective: str, length: int, p: int, itemsize: int, chunks: int,
           ranks=None) -> Schedule | RankSchedule:
  """Direct algorithm with equal shards (with ``ranks``: their part, ``weighted_direct``).

  Bytes sent per rank: ``2(p-1)/p * N`` (all_reduce), ``(p-1)/p * N``
  (reduce_scatter, all_gather); steps: 2 or 1 per chunk.
  """
  return weighted_direct(collective, length, p, itemsize, chunks, equal_shards(length, p),
                         "direct", ranks)


def direct_broadcast(length: int, p: int, itemsize: int, root: int) -> Schedule:
  """The root sends the whole buffer to every rank: ``(p-1) N`` bytes from the root, 1 step."""
  tb = TableBuilder()
  tb.add_rows(0, root, (root + np.arange(1, p)) % p, 0, 0, length, COPY)
  return tb.build("broadcast", p, length, itemsize, "direct", root=root)
