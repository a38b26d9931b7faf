"""Ring algorithms (NCCL's ring), pipelined over chunks.

All-reduce is a ring reduce-scatter followed by a ring all-gather. With ``p``
ranks and ``N`` bytes each rank sends and receives ``2(p-1)/p * N`` bytes in
``2(p-1)`` steps per chunk; every link carries the same volume, so one slow
rank slows the whole ring to ``T_ff / b``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxcc.schedules.ir import COPY, REDUCE, RankSchedule, Schedule, TableBuilder
from jaxcc.schedules.pieces import equal_shards, piece_grid
from jaxcc.schedules.tables import positions


def add_ring_reduce_scatter(tb: TableBuilder, grid: np.ndarray, order: Sequence[int],
                            step0, stride: int, chunk) -> None:
  """Ring reduce-scatter of one chunk among ``order``; ``order[i]`` ends owning shard i.

  At step j, ``order[i]`` sends its partial sum of shard ``i - 1 - j`` to
  ``order[i + 1]``, which adds its own: ``m - 1`` steps of one piece per rank.
  ``grid`` is the piece grid indexed by position in ``order``. ``step0`` and
  ``chunk`` may be equal-length arrays: one ring per entry, in that order.
  """
  _add_ring(tb, grid, order, step0, stride, chunk, 1, REDUCE)


def add_ring_all_gather(tb: TableBuilder, grid: np.ndarray, order: Sequence[int],
                        step0, stride: int, chunk) -> None:
  """Ring all-gather of one chunk among ``order``; ``order[i]`` starts with shard i.

  At step j, ``order[i]`` forwards shard ``i - j`` to ``order[i + 1]``:
  ``m - 1`` steps of one piece per rank. ``step0`` and ``chunk`` as in
  ``add_ring_reduce_scatter``.
  """
  _add_ring(tb, grid, order, step0, stride, chunk, 0, COPY)


def _add_ring(tb, grid, order, step0, stride, chunk, lag, op) -> None:
  """The rows of ring phases (chunk-major, then step j, then position i): position i sends
  shard ``i - lag - j`` to position ``i + 1`` at step ``step0 + j * stride``."""
  order = np.asarray(order, np.int64)
  m = len(order)
  step0, chunk = np.atleast_1d(step0), np.atleast_1d(chunk)

  def touching(r, e, j, i):  # position i sends, i + 1 receives
    at = positions(r, order)
    return [(e, j, at), (e, j, (at - 1) % m)]

  def cover(e, j, i):  # per ring and step: the sender of the first shard with a piece
    first = np.argmax(grid[:, chunk, 1] > grid[:, chunk, 0], axis=0)[e]
    return [(e, j, (first + lag + j) % m)]

  e, j, i = tb.index((len(step0), m - 1, m), touching, cover)
  lo, hi = np.moveaxis(grid[(i - lag - j) % m, chunk[e]], -1, 0)
  tb.add_rows(step0[e] + j * stride, order[i], order[(i + 1) % m], lo, lo, hi - lo, op)


def ring(collective: str, length: int, p: int, itemsize: int, chunks: int,
         ranks=None) -> Schedule | RankSchedule:
  """Ring all_reduce, reduce_scatter or all_gather over ranks 0 -> 1 -> ... -> p-1 -> 0; with
  ``ranks``, the part of it that they send or receive (``TableBuilder.build_part``).

  Bytes sent per rank: ``2(p-1)/p * N`` for all_reduce, ``(p-1)/p * N`` for
  reduce_scatter and all_gather (N = the full buffer); steps: ``2(p-1)``,
  ``p-1`` and ``p-1`` per chunk, chunks pipelined.
  """
  tb = TableBuilder(ranks)
  shards = equal_shards(length, p)
  grid = piece_grid(shards, chunks)
  order = list(range(p))
  rs = collective in ("all_reduce", "reduce_scatter")
  ag = collective in ("all_reduce", "all_gather")
  per_chunk = (p - 1) * (int(rs) + int(ag))
  base = np.arange(chunks) * per_chunk
  if rs:
    add_ring_reduce_scatter(tb, grid, order, base, 1, np.arange(chunks))
  if ag:
    add_ring_all_gather(tb, grid, order, base + (p - 1) * int(rs), 1, np.arange(chunks))
  if ranks is None:
    return tb.build(collective, p, length, itemsize, "ring", chunks=chunks)
  # Rank i sends every shard but i (reduce-scatter) and but i + 1 (all-gather).
  w = np.diff(shards)
  sent = (length - w) * rs + (length - np.roll(w, -1)) * ag
  received = (length - np.roll(w, 1)) * rs + (length - w) * ag
  return tb.build_part(collective, p, length, itemsize, "ring", sent, received, chunks=chunks)


def chain_broadcast(length: int, p: int, itemsize: int, chunks: int, root: int) -> Schedule:
  """Pipelined chain broadcast root -> root+1 -> ... : every rank but the last forwards.

  Bytes sent per rank: N (the last rank in the chain sends nothing); steps:
  ``chunks + p - 2``: chunk c crosses hop h at step c + h.
  """
  tb = TableBuilder()
  lo, hi = piece_grid(np.array([0, length]), chunks)[0].T[:, :, None]
  c, h = np.arange(chunks)[:, None], np.arange(p - 1)[None, :]
  tb.add_rows(c + h, (root + h) % p, (root + h + 1) % p, lo, lo, hi - lo, COPY)
  return tb.build("broadcast", p, length, itemsize, "ring", root=root, chunks=chunks)
