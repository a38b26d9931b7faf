"""OptCC: all-reduce under asymmetric bandwidth (arXiv 2606.01680, as rebuilt in research/optcc.md).

Rank i owns a shard of ``w_i`` elements chosen from the bandwidth vector so that
every port is busy for the same time: rank i sends and receives
``N + (p-2) w_i``, so ``w_i = max(0, (T B_i - N) / (p-2))`` with T the
smallest time for which the shards cover N. This reaches the lower bound
``max(N / B_min, 2(p-1) N / sum B)`` in the fluid limit. A rank too slow to own
anything (``w_i = 0``) only scatters its input and gathers the result.

Each of the K chunks runs four stages, pipelined across chunks:
  S1  scatter-in:   zero-share ranks -> owners, reduce
  S2  reduce-scatter among owners (direct), reduce
  S3  all-gather among owners (direct), copy
  S4  gather-out:   owners -> zero-share ranks, copy
Steps (and so port priorities) run S1, S2, S4, S3: a slow rank's result
leaves its owner before the owners exchange theirs. Within a stage the
transfers go in rounds (owner i to owner i + k), so no port receives two
pieces at once. Steps: 4 per chunk (2 when every rank owns a shard).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxcc.schedules.ir import COPY, REDUCE, Schedule, TableBuilder, split_weighted
from jaxcc.schedules.pieces import piece_grid


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

  Bytes sent (and received) per rank: ``N + (p-2) w_i``; steps: 4 per chunk.
  """
  tb = TableBuilder()
  bw = np.asarray(bandwidth, dtype=np.float64)
  shards = split_weighted(length, optimal_shares(bw))
  grid = piece_grid(shards, chunks)
  owns = np.diff(shards) > 0
  slow_first = np.argsort(bw, kind="stable")
  owners, leaves = slow_first[owns[slow_first]], slow_first[~owns[slow_first]]
  m, num_leaves = len(owners), len(leaves)
  # Rows are in rounds: in round k owner i sends to owner i + k, and leaf l to owner
  # k + offset(l), so no port receives two pieces at once; a leaf gets its results
  # back in the order it sent its pieces.
  c = np.arange(chunks)[:, None, None]
  k, l = np.arange(m)[None, :, None], np.arange(num_leaves)[None, None, :]
  to = owners[(k + l * m // max(num_leaves, 1)) % m]
  lo, hi = np.moveaxis(grid[to, c], -1, 0)
  tb.add_rows(4 * c, leaves[l], to, lo, lo, hi - lo, REDUCE)        # S1
  tb.add_rows(4 * c + 2, to, leaves[l], lo, lo, hi - lo, COPY)      # S4
  k, i = np.arange(1, m)[None, :, None], np.arange(m)[None, None, :]
  src, dst = owners[i], owners[(i + k) % m]
  lo, hi = np.moveaxis(grid[dst, c], -1, 0)
  tb.add_rows(4 * c + 1, src, dst, lo, lo, hi - lo, REDUCE)         # S2
  lo, hi = np.moveaxis(grid[src, c], -1, 0)
  tb.add_rows(4 * c + 3, src, dst, lo, lo, hi - lo, COPY)           # S3
  return tb.build("all_reduce", p, length, itemsize, "optcc", chunks=chunks)
