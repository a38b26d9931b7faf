"""ppermute as a schedule: every source sends its whole array straight to its destination.

The buffer is the array followed by room for the one received (the IR's
ppermute layout, ``jaxcc.schedules.ir``): a rank cannot send and receive a
range in one step, and a cycle of the permutation leaves no order in which
inputs could be overwritten, so the received array lands beside the input.
Cut into ``chunks`` near-equal pieces, piece c moving at step c: over TCP the
dataflow runner encodes and sends a piece while the previous one is on the
wire. Nothing is relayed.
"""

from __future__ import annotations

import numpy as np

from jaxcc.schedules.ir import COPY, Schedule, TableBuilder, split


def permute(perm: tuple[tuple[int, int], ...], length: int, p: int, itemsize: int,
            chunks: int) -> Schedule:
  """The ppermute of ``length`` elements per rank along ``perm`` (checked by ``ir.check_perm``).

  A pair ``(r, r)`` moves nothing and is left out of the schedule and its
  ``perm``: the caller keeps r's input. Bytes sent per rank: ``N`` (the
  array, ``length * itemsize``) by the source of each other pair, received
  by its destination; steps: ``chunks`` (one per piece), 0 without pairs.
  """
  moves = tuple((s, d) for s, d in perm if s != d)
  tb = TableBuilder()
  bounds = split(length, chunks)
  lo, hi = bounds[:-1, None], bounds[1:, None]
  src, dst = (np.array([pair[k] for pair in moves], np.int64).reshape(1, -1) for k in (0, 1))
  tb.add_rows(np.arange(chunks)[:, None], src, dst, lo, length + lo, hi - lo, COPY)
  return tb.build("ppermute", p, 2 * length, itemsize, "direct", chunks=chunks, perm=moves)
