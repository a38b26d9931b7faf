"""Shards and pipeline chunks: how algorithms cut a buffer into pieces.

Every algorithm here works on a grid: the buffer is cut into per-rank shards
(``shard_bounds``, p + 1 boundaries) and each shard into ``chunks`` near-equal
pipeline pieces. Piece ``(j, c)`` is chunk ``c`` of shard ``j``; chunk ``c``
is pipeline stage ``c`` of every shard.
"""

from __future__ import annotations

import numpy as np

from jaxcc.schedules.ir import split


def piece_grid(shard_bounds: np.ndarray, chunks: int) -> np.ndarray:
  """Starts and stops of every piece: int64 array ``(p, chunks, 2)``."""
  return _weighted_grid(shard_bounds, np.ones(chunks, np.int64))


def tapered_grid(shard_bounds: np.ndarray, chunks: int, ramp: int) -> np.ndarray:
  """``piece_grid`` with chunks that grow geometrically at the start and shrink at the end.

  Chunk weights: ``1, 2, ..., 2^(r-1)``, then ``2^r`` for the middle chunks,
  then ``2^(r-1), ..., 1``, with ``r = min(ramp, (chunks - 1) // 2)``: a
  pipeline's start and drain cost about its first and last chunk instead of a
  full one.
  """
  r = max(min(ramp, (chunks - 1) // 2), 0)
  up = 2 ** np.arange(r, dtype=np.int64)
  return _weighted_grid(shard_bounds,
                        np.concatenate([up, np.full(chunks - 2 * r, 2**r, np.int64), up[::-1]]))


def _weighted_grid(shard_bounds, weights) -> np.ndarray:
  """Each shard cut into chunks in proportion to the integer ``weights`` (rounded down)."""
  cum = np.concatenate([[0], np.cumsum(weights)])
  shard_bounds = np.asarray(shard_bounds, dtype=np.int64)
  sizes = np.diff(shard_bounds)
  cuts = (sizes[:, None] * cum[None, :]) // cum[-1] + shard_bounds[:-1, None]
  return np.stack([cuts[:, :-1], cuts[:, 1:]], axis=-1)


def equal_shards(length: int, p: int) -> np.ndarray:
  """p near-equal shards of ``length`` (exact tiles when p divides it)."""
  return split(length, p)
