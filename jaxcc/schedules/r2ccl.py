"""R2CCL-AllReduce, the state-of-the-art baseline (arXiv 2512.25059, modelled in research/optcc.md §8).

With the slowest rank at fraction f of the fastest, a ring all-reduce over all
ranks covers the first ``f N`` elements (it then takes the fault-free time),
and the rest ``(1-f) N`` is all-reduced among the full-speed ranks only: the
slow ranks scatter their part of it in and gather the result back. Both run
concurrently, chunk by chunk. A slow rank still moves ``(1-f) N`` extra each
way at its reduced rate: ``T ~ T_ff + (1-f) N / (f B)``, 57% over T_ff at
p = 8, f = 1/2.

Steps per chunk: ``2(p-1)`` for the global ring and ``2(m-1) + 2`` for the
partial one (m full-speed ranks), interleaved.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxcc.schedules.ir import COPY, REDUCE, Schedule, TableBuilder
from jaxcc.schedules.pieces import equal_shards, piece_grid
from jaxcc.schedules.ring import add_ring_all_gather, add_ring_reduce_scatter


def r2ccl(length: int, p: int, itemsize: int, chunks: int,
          bandwidth: Sequence[float]) -> Schedule:
  """R2CCL-AllReduce: global ring on ``f N``, partial all-reduce of the rest among fast ranks.

  Bytes sent per rank: ``2(p-1)/p f N`` plus, for a fast rank,
  ``2(m-1)/m (1-f) N`` and its pieces to the slow ranks, for a slow rank ``(1-f) N``.
  """
  bw = np.asarray(bandwidth, dtype=np.float64)
  fraction = float(bw.min() / bw.max())
  fast = [int(r) for r in np.flatnonzero(bw >= bw.max())]
  slow = [int(r) for r in np.flatnonzero(bw < bw.max())]
  main = int(round(fraction * length)) if slow else length
  tb = TableBuilder()
  # Global ring on [0, main): even steps.
  ring_grid = piece_grid(equal_shards(main, p), chunks)
  ring_steps = 2 * (p - 1)
  for c in range(chunks):
    add_ring_reduce_scatter(tb, ring_grid, list(range(p)), 2 * c * ring_steps, 2, c)
    add_ring_all_gather(tb, ring_grid, list(range(p)), 2 * c * ring_steps + 2 * (p - 1), 2, c)
  # Partial all-reduce of [main, length) among the fast ranks: odd steps.
  m = len(fast)
  part_grid = piece_grid(main + equal_shards(length - main, m), chunks)
  for c in range(chunks):  # 4m - 1 <= 2 * ring_steps steps from base
    base = 2 * c * ring_steps + 1
    for src in slow:  # scatter-in: shard i starts its ring at fast[i]
      for i, dst in enumerate(fast):
        lo, hi = part_grid[i, c]
        tb.add(base, src, dst, lo, lo, hi - lo, REDUCE)
    add_ring_reduce_scatter(tb, part_grid, fast, base + 2, 2, c)
    add_ring_all_gather(tb, part_grid, fast, base + 2 * m, 2, c)
    for dst in slow:  # gather-out from the rank that completed each shard
      for i, src in enumerate(fast):
        lo, hi = part_grid[i, c]
        tb.add(base + 2 * (2 * m - 1), src, dst, lo, lo, hi - lo, COPY)
  return tb.build("all_reduce", p, length, itemsize, "r2ccl", chunks=chunks)
