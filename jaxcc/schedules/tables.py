"""Vectorised helpers over int64 key arrays: the sorting and grouping that the IR rules,
the checker and the simulator run on schedule tables, and the rank lookups of the builders that
plan some ranks' rows (``TableBuilder(ranks)``)."""

from __future__ import annotations

import numpy as np


def starts(sorted_keys) -> np.ndarray:
  """Where a new key begins in a sorted key array (a bool mask)."""
  return np.r_[True, sorted_keys[1:] != sorted_keys[:-1]][:len(sorted_keys)]


def unique(x) -> np.ndarray:
  """``np.unique(x)`` by sorting (numpy's hash-based unique is slower on large int arrays)."""
  x = np.sort(x)
  return x[starts(x)]


def ranges(begins, counts) -> np.ndarray:
  """The concatenation of ``arange(b, b + c)`` over the pairs."""
  offsets = np.repeat(begins - np.cumsum(counts) + counts, counts)
  return offsets + np.arange(offsets.size)


def rank_in_group(keys, mask) -> np.ndarray:
  """For the rows in ``mask``: their index among the rows with the same key (row order)."""
  out = np.zeros(len(keys), np.int64)
  rows = np.flatnonzero(mask)
  rows = rows[np.argsort(keys[rows], kind="stable")]
  pos = np.arange(len(rows))
  out[rows] = pos - np.maximum.accumulate(np.where(starts(keys[rows]), pos, 0))
  return out


def positions(ranks, members) -> np.ndarray:
  """The positions in ``members`` (distinct ranks) of the ranks of ``ranks`` that it holds, as
  ``ranks`` is shaped: along its first axis (``TableBuilder.index``'s ``touching``)."""
  members = np.asarray(members, np.int64).reshape(-1)
  at = np.full(max(int(members.max(initial=-1)), int(ranks.max(initial=-1))) + 1, -1, np.int64)
  at[members] = np.arange(len(members))
  at = at[ranks.reshape(-1)]
  return at[at >= 0].reshape((-1,) + ranks.shape[1:])
