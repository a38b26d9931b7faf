"""Pytrees in buckets: one collective per bucket of same-dtype leaves, as DDP and XLA's combiner.

A bucket holds leaves of one dtype, in the order of the pytree's leaves, up to
``bucket_bytes`` (a leaf larger than that is a bucket of its own). The
collective's primitive takes a bucket's leaves as its operands: XLA's own
collective moves them as one tuple, the other engines pack them into one flat
buffer (``pack`` and ``unpack``), so each bucket is one call on any engine.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp

# 25 MiB, DDP's default bucket_cap_mb.
DEFAULT_BUCKET_BYTES = 25 << 20


def buckets(leaves: Sequence[jax.Array], bucket_bytes: int,
            keys: Sequence | None = None) -> list[list[int]]:
  """The leaves' indices grouped into buckets: one dtype each (one ``keys[i]`` each when given),
  in leaf order, at most ``bucket_bytes`` unless a single leaf is larger."""
  out: list[list[int]] = []
  open_bucket: dict = {}  # key -> (index in out, bytes so far)
  for i, leaf in enumerate(leaves):
    key = leaf.dtype if keys is None else keys[i]
    size = nbytes([leaf])
    slot = open_bucket.get(key)
    if slot is not None and slot[1] + size <= bucket_bytes:
      out[slot[0]].append(i)
      open_bucket[key] = (slot[0], slot[1] + size)
    else:
      open_bucket[key] = (len(out), size)
      out.append([i])
  return out


def nbytes(xs: Sequence[jax.Array]) -> int:
  return sum(x.size * x.dtype.itemsize for x in xs)


def pack(xs: Sequence[jax.Array], rows: int = 1) -> jax.Array:
  """The arrays as one flat buffer of ``rows`` blocks: block r holds row r of every array (each
  reshaped to ``(rows, -1)``), one after another; one array needs no copy."""
  if len(xs) == 1:
    return xs[0].reshape(-1)
  return jnp.concatenate([x.reshape(rows, -1) for x in xs], axis=1).reshape(-1)


def unpack(flat: jax.Array, shapes: Sequence[tuple[int, ...]], rows: int = 1) -> list[jax.Array]:
  """Inverse of ``pack`` for arrays of ``shapes`` (each holding ``rows`` rows)."""
  if len(shapes) == 1:
    return [flat.reshape(shapes[0])]
  table = flat.reshape(rows, -1)
  out, start = [], 0
  for shape in shapes:
    width = math.prod(shape) // rows
    out.append(table[:, start:start + width].reshape(shape))
    start += width
  return out
