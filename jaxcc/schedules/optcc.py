"""OptCC: all-reduce under asymmetric bandwidth (arXiv 2606.01680, as rebuilt in research/optcc.md).

Rank i owns a shard of ``w_i`` elements chosen from the bandwidth vector so that
every port is busy for the same time: rank i sends and receives
``N + (p-2) w_i``, so ``w_i = max(0, (T B_i - N) / (p-2))`` with T the
smallest time for which the shards cover N. This reaches the lower bound
``max(N / B_min, 2(p-1) N / sum B)`` in the fluid limit. A rank too slow to own
anything (``w_i = 0``) only scatters its input and gathers the result.

Each of the K chunks runs four stages, pipelined across chunks:
  S1  scatter-in:   zero-share ranks ("leaves") -> owners, reduce
  S2  reduce-scatter among owners (direct), reduce
  S3  all-gather among owners (direct), copy
  S4  gather-out:   owners -> leaves, copy
Without leaves the steps are S2, S3 per chunk (2 per chunk), in equal chunks.
With leaves the leaves' ports are the bottleneck, so each leaf's port must
stay busy from the start to the end: its result piece has to leave the owner
right after the leaf's own piece arrives there. So the owners' S2 of a chunk
runs ahead and is summed first, a leaf's S1 piece is the last term of its
sum, and S4 follows at once: steps S2(c), S1(c), S4(c) per chunk. The owners'
S3, which no leaf waits for, fills the gaps of the owners' ports after every
other step, but for its pieces into an owner slower than the fastest: those
come after the S2 of the next chunk, as that owner's receive port is busy for
the whole run only with its all-gather interleaved (p = 256, K = 16,
stragglers at 0.5 and 0.75: 1.0039x the bound, against 1.035x with the whole
S3 trailing and 1.165x with all of it last). With few owners the whole S3
trailing is faster (p = 8, K = 64, stragglers 0.5, 0.75, 0.75: 1.0084x
against 1.0445x): the planner simulates the placements of ``ORDERINGS``
where the table is small (``planner.PRICED_ORDERINGS``) and takes the
fastest. 4 steps per chunk. The chunks grow geometrically at the start and shrink at the end
(``pieces.tapered_grid``): what is left of the pipeline's start (the first
S2) and drain (the last S3) is a small chunk's share. The ramps take 4
doublings with 8 owners or more, else ``floor(log2 K / 2)``: with few owners
each one's S2 running ahead is a large part of its port's work, and larger
middle chunks cost more than the ramps save (p = 4, K = 16: 1.071x the bound
against 1.100x with 4 doublings). In the fluid model at p = 64 with one to
three stragglers of which at least one is a leaf, 16 chunks end 1.004-1.007x
the lower bound (equal chunks in the order S1, S2, S4, S3: 1.020-1.039x).

Within a stage the transfers go in rounds (owner i to owner i + k; in round k
every leaf sends to owner k), so no owner receives two owners' pieces at once.

From ``GRID_MIN_OWNERS`` owners of the fastest port on, the owners sit on an
``a x b`` grid (``grid_layout``, ``_grid_optcc``) and reduce-scatter and
all-gather in two hops, along rows and along columns: the same bytes per port,
but ``4 (a + b)`` transfers per rank and chunk instead of ``4 (p-1)``, so the
table is ``O(p^1.5 K)`` and a rank's part ``O(sqrt(p) K)``. Its first hop's
messages are ``b`` times the direct form's, so at one depth it drains later
(fluid model, one straggler at 0.5: p = 256, K = 16 1.032x the bound against
the direct form's 1.0038x), and it needs the depth its few transfers allow:
p = 1024 1.016x at K = 16, 1.0062x at 32, 1.0029x at 64; p = 4096 1.0093x at
K = 16, planned in 6 s and simulated in 21 s, where the direct form's table
at K = 16 would be 537 M transfers. The grid keeps equal shares: its first
hop has every owner of column j receive ``b - 1`` pieces of column j's range
whatever its own port, so owners of unequal ports balance only where each
column's owners share one speed; ranks slower than the fastest are leaves
(at most ``GRID_SLACK`` over water-filling), else the direct form runs.
Where messages cost something the grid's fewer messages outweigh its later
drain well below 512 owners: from ``GRID_FEWEST_OWNERS`` owners on the
planner takes it where the closed-form model prices it faster at its best
depth (``sim.model.optcc_min_owners``). At 30 us a message, 256 MiB per rank
of 25 GB/s, one straggler at 0.5: p = 64 1.31x the bound (the direct form at
its best depth 1.53x), p = 128 1.31x (1.79x), p = 256 1.43x (2.22x). With
fewer owners its fill (a skinny grid's first hop) costs more than the
messages save (p = 24, 5 us: 1.10x against 1.08x).
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import numpy as np

from jaxcc.schedules.ir import (COPY, REDUCE, RankSchedule, Schedule, TableBuilder, split,
                                split_weighted)
from jaxcc.schedules.pieces import piece_grid, tapered_grid
from jaxcc.schedules.tables import positions

# The grid form (``grid_layout``): from this many owners of the fastest port on, where its
# equal shares are at most GRID_SLACK slower than water-filling's in the fluid model; from
# GRID_FEWEST_OWNERS on where message costs make it faster (``sim.model.optcc_min_owners``).
GRID_MIN_OWNERS = 512
GRID_FEWEST_OWNERS = 32
GRID_SLACK = 1e-3
# With leaves, the chunks the owners' all-gather into a slower owner and into a fastest one
# trails its chunk's reduce-scatter by (None: after every other step); the default first.
ORDERINGS = ((1, None), (1, 1), (None, None))


def optimal_shares(bandwidth: Sequence[float]) -> np.ndarray:
  """Fractions ``w_i / N`` that minimise ``max_i (N + (p-2) w_i) / B_i`` (water-filling)."""
  b = np.asarray(bandwidth, dtype=np.float64)
  p = len(b)
  if p <= 2:
    return b / b.sum()
  fastest_first = np.sort(b)[::-1]
  for k in range(p, 0, -1):
    t = (p - 2 + k) / fastest_first[:k].sum()  # time in units of N, k owners
    if t * fastest_first[k - 1] >= 1.0:
      break
  w = np.maximum(0.0, (t * b - 1.0) / (p - 2))
  return w / w.sum()


def shares(bandwidth: Sequence[float], min_owners: int = GRID_MIN_OWNERS) -> np.ndarray:
  """Fractions ``w_i / N`` that ``optcc`` gives each rank: equal on its grid, else
  ``optimal_shares``."""
  layout = grid_layout(bandwidth, min_owners)
  if layout is None:
    return optimal_shares(bandwidth)
  w = np.zeros(len(bandwidth))
  w[layout[0]] = 1.0 / layout[0].size
  return w


def messages_per_chunk(bandwidth: Sequence[float],
                       min_owners: int = GRID_MIN_OWNERS) -> np.ndarray:
  """Per rank, the most transfers it sends in a chunk (as many as it receives), shape
  ``(p,)``: ``2 (m - 1) + l`` for each of m owners and m for each of l leaves in the direct
  form; ``2 (a + b - 2) + ceil(l / a)`` for an owner and ``b`` for a leaf on an ``(a, b)``
  grid."""
  layout = grid_layout(bandwidth, min_owners)
  if layout is None:
    owns = optimal_shares(bandwidth) > 0
    m = int(owns.sum())
    return np.where(owns, 2 * (m - 1) + (len(owns) - m), m).astype(np.int64)
  (a, b), leaves = layout[0].shape, layout[1]
  out = np.full(len(bandwidth), b, np.int64)
  out[layout[0].ravel()] = 2 * (a + b - 2) + math.ceil(len(leaves) / a)
  return out


def orderings(bandwidth: Sequence[float], min_owners: int = GRID_MIN_OWNERS
              ) -> tuple[tuple[int | None, int | None], ...]:
  """The ``lags`` of ``optcc`` worth pricing on ``bandwidth``: ``ORDERINGS`` in the direct
  form with leaves and owners of unequal ports, else the default alone."""
  w = shares(bandwidth, min_owners)
  owners = np.asarray(bandwidth)[w > 0]
  if (grid_layout(bandwidth, min_owners) is None and (w == 0).any()
      and owners.min() < owners.max()):
    return ORDERINGS
  return ORDERINGS[:1]


def optcc(length: int, p: int, itemsize: int, chunks: int, bandwidth: Sequence[float],
          ranks=None, lags: tuple[int | None, int | None] = ORDERINGS[0],
          min_owners: int = GRID_MIN_OWNERS) -> Schedule | RankSchedule:
  """OptCC all_reduce for ranks with port bandwidths ``bandwidth``; with ``ranks``, the part
  of it that they send or receive (``TableBuilder.build_part``).

  Bytes sent (and received) per rank: ``N + (p-2) w_i``; steps: 4 per chunk with leaves,
  2 without; on its grid (``grid_layout`` from ``min_owners`` owners on) 6 and 4. ``lags``:
  where the direct form with leaves places the owners' all-gather (``ORDERINGS``).
  """
  bw = np.asarray(bandwidth, dtype=np.float64)
  layout = grid_layout(bw, min_owners)
  if layout is not None:
    return _grid_optcc(length, p, itemsize, chunks, *layout, ranks=ranks)
  tb = TableBuilder(ranks)
  shards = split_weighted(length, optimal_shares(bw))
  owns = np.diff(shards) > 0
  c = np.arange(chunks)[:, None, None]
  slow_first = np.argsort(bw, kind="stable")
  owners, leaves = slow_first[owns[slow_first]], slow_first[~owns[slow_first]]
  m = len(owners)
  if len(leaves):
    grid = tapered_grid(shards, chunks, 4 if m >= 8 else (chunks.bit_length() - 1) // 2)
    s2, s1, s4 = 4 * c, 4 * c + 1, 4 * c + 2
  else:
    grid = piece_grid(shards, chunks)
    s2, s3 = 2 * c, 2 * c + 1
  if len(leaves):  # round k: every leaf sends to owners[k] and gets its result back from it
    shape = (chunks, m, len(leaves))
    c, k, leaf = index = tb.index(
        shape, lambda r, c, k, leaf: [(c, k, positions(r, leaves)),
                                      (c, positions(r, owners), leaf)],
        lambda c, k, leaf: [(c, k, 0)])
    lo, hi = np.moveaxis(grid[owners[k], c], -1, 0)
    tb.add_rows(tb.at(s1, shape, index), leaves[leaf], owners[k], lo, lo, hi - lo, REDUCE)
    tb.add_rows(tb.at(s4, shape, index), owners[k], leaves[leaf], lo, lo, hi - lo, COPY)
  # Round k + 1: owner i sends to owner i + k + 1.
  shape = (chunks, max(m - 1, 0), m)
  c, k, i = index = tb.index(shape, lambda r, c, k, i: _owner_pairs(r, owners, c, k),
                             lambda c, k, i: _owner_cover(grid[owners], c, i))
  src, dst = owners[i], owners[(i + k + 1) % m]
  lo, hi = np.moveaxis(grid[dst, c], -1, 0)
  tb.add_rows(tb.at(s2, shape, index), src, dst, lo, lo, hi - lo, REDUCE)
  lo, hi = np.moveaxis(grid[src, c], -1, 0)
  if len(leaves):  # lags[0] chunks behind into a slower owner, lags[1] into a fastest one
    after = [4 * chunks + c if lag is None else 4 * (c + lag) + 3 for lag in lags]
    s3 = np.where(bw[dst] < bw[owners].max(initial=0.0), *after)
  else:
    s3 = tb.at(s3, shape, index)
  tb.add_rows(s3, src, dst, lo, lo, hi - lo, COPY)
  if ranks is None:
    return tb.build("all_reduce", p, length, itemsize, "optcc", chunks=chunks)
  traffic = length + (p - 2) * np.diff(shards)
  return tb.build_part("all_reduce", p, length, itemsize, "optcc", traffic, traffic,
                       chunks=chunks)


def grid_layout(bandwidth: Sequence[float],
                min_owners: int = GRID_MIN_OWNERS) -> tuple[np.ndarray, np.ndarray] | None:
  """The owners on an ``(a, b)`` grid and the leaves of OptCC's grid form, or None.

  The grid form is taken where at least ``min_owners`` ranks share the fastest
  port and making every other rank (and the ``m - a b`` owners that do not fit
  the grid) a leaf costs at most ``GRID_SLACK`` of the water-filling time
  ``max_i (N + (p-2) w_i) / B_i``: its owners then have equal shares, which the
  grid needs for balanced ports. ``a <= b`` minimise the owners left over,
  then ``a + b``. Cached per bandwidth vector (read-only arrays): the planner
  asks for it for the depth, the price and the schedule.
  """
  return _grid_layout(tuple(map(float, bandwidth)), min_owners)


@functools.lru_cache(maxsize=64)
def _grid_layout(bandwidth: tuple[float, ...], min_owners: int):
  bw = np.asarray(bandwidth, dtype=np.float64)
  p = len(bw)
  full = np.flatnonzero(bw == bw.max(initial=0.0))
  m = len(full)
  if m < max(min_owners, 4):  # a 2 x 2 grid at least
    return None
  a = max(range(max(2, math.isqrt(m) // 2), math.isqrt(m) + 1), key=lambda a: (-(m % a), a))
  b = m // a
  owners = full[:a * b]
  leaves = np.setdiff1d(np.arange(p), owners)
  grid_time = max((1 + (p - 2) / (a * b)) / bw.max(), (1 / bw[leaves]).max(initial=0.0))
  best_time = ((1 + (p - 2) * optimal_shares(bw)) / bw).max()
  if grid_time > best_time * (1 + GRID_SLACK):
    return None
  owners = owners.reshape(a, b)
  owners.setflags(write=False)
  leaves.setflags(write=False)
  return owners, leaves


def _grid_optcc(length: int, p: int, itemsize: int, chunks: int, grid: np.ndarray,
                leaves: np.ndarray, ranks=None) -> Schedule | RankSchedule:
  """OptCC's grid form: the reduce-scatter and all-gather among owners in two hops.

  Owner ``(r, j)`` of the ``(a, b)`` grid reduces column j's range of the
  buffer with its row (R1), then its piece of it with its column (R2); the
  all-gather runs back, column (A1) then row (A2). Leaf l sends column j of
  chunk c into row ``(l + c + j) mod a`` of column j with R1 and gets the
  column's result from that owner after A1. Bytes per owner each way are
  ``N + (p-2) N / (a b)``, as the direct form's; messages per owner and
  chunk ``2 (a + b - 2)`` instead of ``2 (m - 1)``, per leaf ``2 b``. Steps per
  chunk: R1, leaves in, R2, A1, leaves out, with every A2 after all of them
  (it fills the owners' ports' gaps); without leaves R1, R2, A1, A2. With ``ranks``, the
  part of it that they send or receive.
  """
  a, b = grid.shape
  tb = TableBuilder(ranks)
  cols = tapered_grid(split(length, b), chunks, 4)  # (b, K, 2): column j's chunk c
  lo, hi = cols[..., 0].T, cols[..., 1].T  # (K, b)
  c = np.arange(chunks)[:, None, None, None]  # axes: chunk, round, row, column
  if len(leaves):
    r1, l1, r2, a1, l4, a2 = 5 * c, 5 * c + 1, 5 * c + 2, 5 * c + 3, 5 * c + 4, 5 * chunks + c
  else:
    r1, r2, a1, a2 = 4 * c, 4 * c + 1, 4 * c + 2, 4 * c + 3
  # Covers: round 1 of R1 and A2 from row 0 moves every column's range of the chunk, round 1
  # of R2 and A1 every row's piece of its first column with elements.
  first = np.argmax(hi > lo, axis=1)
  along = (chunks, b - 1, a, b)  # R1 and A2, round k + 1: (r, j) -> (r, j + k + 1)
  along_index = tb.index(along, lambda q, c, k, r, j: _grid_pairs(q, grid, c, k, 1),
                         lambda c, k, r, j: [(c, 0, 0, j)])
  across = (chunks, a - 1, a, b)  # R2 and A1, round k + 1: (r + k + 1, j)
  across_index = tb.index(across, lambda q, c, k, r, j: _grid_pairs(q, grid, c, k, 0),
                          lambda c, k, r, j: [(c, 0, r, first[c])])
  c, k, r, j = along_index
  to = (j + k + 1) % b
  tb.add_rows(tb.at(r1, along, along_index), grid[r, j], grid[r, to], lo[c, to], lo[c, to],
              hi[c, to] - lo[c, to], REDUCE)
  c, k, r, j = across_index
  down = (r + k + 1) % a
  piece = lambda row: lo[c, j] + (hi[c, j] - lo[c, j]) * row // a  # row's piece of (c, j)
  tb.add_rows(tb.at(r2, across, across_index), grid[r, j], grid[down, j], piece(down),
              piece(down), piece(down + 1) - piece(down), REDUCE)
  tb.add_rows(tb.at(a1, across, across_index), grid[r, j], grid[down, j], piece(r), piece(r),
              piece(r + 1) - piece(r), COPY)
  c, k, r, j = along_index
  tb.add_rows(tb.at(a2, along, along_index), grid[r, j], grid[r, to], lo[c, j], lo[c, j],
              hi[c, j] - lo[c, j], COPY)
  if len(leaves):  # round k: leaf l into column (k + l) mod b, through row (l + c + column) mod a
    shape = (chunks, b, len(leaves))
    c, k, leaf = index = tb.index(
        shape, lambda q, c, k, leaf: _leaf_pairs(q, grid, leaves, c, k, leaf, chunks),
        lambda c, k, leaf: [(c, k, 0)])
    col = (k + leaf) % b
    owner, start, n = grid[(leaf + c + col) % a, col], lo[c, col], hi[c, col] - lo[c, col]
    tb.add_rows(tb.at(l1[..., 0], shape, index), leaves[leaf], owner, start, start, n, REDUCE)
    tb.add_rows(tb.at(l4[..., 0], shape, index), owner, leaves[leaf], start, start, n, COPY)
  if ranks is None:
    return tb.build("all_reduce", p, length, itemsize, "optcc", chunks=chunks)
  traffic = np.full(p, length, np.int64)  # a leaf sends and receives the buffer
  traffic[grid] = _grid_traffic(length, hi - lo, a, len(leaves))
  return tb.build_part("all_reduce", p, length, itemsize, "optcc", traffic, traffic,
                       chunks=chunks)


def _owner_pairs(ranks, owners: np.ndarray, c, k) -> list[tuple]:
  """The transfers (chunk, round k, owner i) from owner i to owner i + k + 1 of the direct
  form that the owners among ``ranks`` send and receive."""
  at = positions(ranks, owners)
  return [(c, k, at), (c, k, (at - k - 1) % len(owners))]


def _owner_cover(pieces: np.ndarray, c, i) -> list[tuple]:
  """Per chunk, a transfer (chunk, round k, owner) of the direct form into each owner ``i``
  from one of the first two owners with a piece (``pieces``: the owners' grid): one of
  positive length of every step of S2 and S3 that has one, as their steps depend on the chunk
  and the receiver only."""
  first = np.argsort(pieces[..., 1] <= pieces[..., 0], axis=0, kind="stable")[:2, c]
  src = np.where(first[0] == i, first[1], first[0])
  return [(c, (i - src) % len(pieces) - 1, src)]


def _grid_pairs(ranks, grid: np.ndarray, c, k, axis: int) -> list[tuple]:
  """The transfers (chunk, round k, row, column) of the grid form from an owner to the one
  ``k + 1`` further along ``axis`` (1: its row, 0: its column) that the owners among
  ``ranks`` send and receive."""
  at = np.divmod(positions(ranks, grid), grid.shape[1])
  back = list(at)
  back[axis] = (at[axis] - k - 1) % grid.shape[axis]
  return [(c, k, *at), (c, k, *back)]


def _leaf_pairs(ranks, grid: np.ndarray, leaves: np.ndarray, c, k, leaf,
                chunks: int) -> list[tuple]:
  """The transfers (chunk, round k, leaf) between the grid form's leaves and owners that
  ``ranks`` send and receive: all of a leaf's; owner ``(r, j)``'s with each leaf l in round
  ``j - l`` of the chunks ``r - l - j`` mod a."""
  a, b = grid.shape
  r, j = np.divmod(positions(ranks, grid), b)
  t = np.arange(-(-chunks // a)).reshape((-1,) + (1,) * r.ndim)  # chunk c + a t
  return [(c, k, positions(ranks, leaves)), ((r - leaf - j) % a + a * t, (j - leaf) % b, leaf)]


def _grid_traffic(length: int, sizes: np.ndarray, a: int, leaves: int) -> np.ndarray:
  """The elements each owner of the grid form sends (as many as it receives), ``(a, b)``:
  ``N + (a-2) s + (b-1) n + x`` for a column of ``n`` elements, its piece ``s`` of it and the
  ``x`` it exchanges with leaves (``sizes``: ``(K, b)``, column j's chunk c)."""
  chunks, b = sizes.shape
  c, j = np.arange(chunks)[:, None], np.arange(b)
  per_residue = np.bincount(np.arange(leaves) % a, minlength=a)
  out = np.empty((a, b), np.int64)
  for row in range(a):  # (K, b) at a time
    piece = (sizes * (row + 1) // a - sizes * row // a).sum(axis=0)
    with_leaves = (per_residue[(row - c - j) % a] * sizes).sum(axis=0)
    out[row] = length + (a - 2) * piece + (b - 1) * sizes.sum(axis=0) + with_leaves
  return out
