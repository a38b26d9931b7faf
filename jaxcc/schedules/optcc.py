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
S3 trailing and 1.165x with all of it last). 4 steps per chunk. The
chunks grow geometrically at the start and shrink at the end
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
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxcc.schedules.ir import COPY, REDUCE, Schedule, TableBuilder, split_weighted
from jaxcc.schedules.pieces import piece_grid, tapered_grid


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


def optcc(length: int, p: int, itemsize: int, chunks: int,
          bandwidth: Sequence[float]) -> Schedule:
  """OptCC all_reduce for ranks with port bandwidths ``bandwidth``.

  Bytes sent (and received) per rank: ``N + (p-2) w_i``; steps: 4 per chunk with leaves,
  2 without.
  """
  tb = TableBuilder()
  bw = np.asarray(bandwidth, dtype=np.float64)
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
  # Round k: every leaf sends to owners[k] and gets its result back from it.
  k, leaf = np.arange(m)[None, :, None], leaves[None, None, :]
  lo, hi = np.moveaxis(grid[owners[k], c], -1, 0)
  if len(leaves):
    tb.add_rows(s1, leaf, owners[k], lo, lo, hi - lo, REDUCE)
    tb.add_rows(s4, owners[k], leaf, lo, lo, hi - lo, COPY)
  k, i = np.arange(1, m)[None, :, None], np.arange(m)[None, None, :]
  src, dst = owners[i], owners[(i + k) % m]
  lo, hi = np.moveaxis(grid[dst, c], -1, 0)
  tb.add_rows(s2, src, dst, lo, lo, hi - lo, REDUCE)
  lo, hi = np.moveaxis(grid[src, c], -1, 0)
  if len(leaves):  # into a slower owner: after the next chunk's S2; else after everything
    s3 = np.where(bw[dst] < bw[owners].max(initial=0.0), 4 * c + 7, 4 * chunks + c)
  tb.add_rows(s3, src, dst, lo, lo, hi - lo, COPY)
  return tb.build("all_reduce", p, length, itemsize, "optcc", chunks=chunks)
