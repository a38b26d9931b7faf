"""The Schedule: the one intermediate representation between algorithms and executors.

A schedule moves ranges of a per-rank buffer of ``length`` elements between
``nranks`` ranks. It is a list of steps; each step a set of transfers
``(src, dst, src_range, dst_range, op)``. The table behind it is one int64
array with a row per transfer, so it crosses into the FFI unchanged.

Semantics (every executor and the simulator keep them):

* Program order: a rank runs its steps in order. A transfer of step ``t``
  reads the sender's buffer as it stands after the sender's step ``t - 1``;
  the receives of step ``t`` are applied at the end of step ``t``.
* ``COPY`` overwrites ``dst_range`` with the received values.
* ``REDUCE``: all reduce transfers into one rank in one step share one
  ``dst_range``; the rank replaces it by the sum of its own values and every
  received window, in the canonical order (ascending ``(dst - src) mod p``),
  accumulated in fp32 for 16-bit floats and rounded once (``jaxcc_reduce``).
* Per step and rank: at most one transfer per ordered pair; written ranges are
  pairwise disjoint (the shared reduce range aside) and disjoint from the
  ranges the rank sends in that step.
* ``ppermute``: the buffer is the input ``[0, length / 2)`` followed by the
  output ``[length / 2, length)``. For each pair ``(src, dst)`` of ``perm``
  (no rank twice as a source or as a destination, none its own destination)
  rank dst's output ends as rank src's input; the output of a rank that no
  pair names as destination is left as it was (the caller fills it with
  zeros, as ``lax.ppermute`` gives). A rank cannot send and receive a range
  in one step, so the output cannot overwrite the input in place.

Executors may overlap steps as far as the data dependencies between ranges
allow (read after write, write after read, write after write); the result is
the same as running the steps one after another.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from typing import Iterator, NamedTuple

import numpy as np

COPY = 0
REDUCE = 1
OP_NAMES = {COPY: "copy", REDUCE: "reduce"}

# Columns of Schedule.table.
STEP, SRC, DST, SRC_START, DST_START, LENGTH, OP = range(7)
NUM_COLUMNS = 7

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "ppermute")


class Transfer(NamedTuple):
  """One transfer of a step: ``length`` elements from ``src`` to ``dst``."""

  src: int
  dst: int
  src_start: int
  dst_start: int
  length: int
  op: int

  @property
  def src_range(self) -> tuple[int, int]:
    return (self.src_start, self.src_start + self.length)

  @property
  def dst_range(self) -> tuple[int, int]:
    return (self.dst_start, self.dst_start + self.length)


@dataclasses.dataclass(frozen=True, eq=False)
class Schedule:
  """A collective as data: steps of transfers over per-rank buffers.

  Attributes:
    collective: one of ``COLLECTIVES``.
    nranks: number of ranks along the axis.
    length: elements in each rank's buffer.
    itemsize: bytes per element (sizes in the simulator are bytes).
    algorithm: name of the algorithm that produced it.
    table: int64 array, one row per transfer with columns
      ``step, src, dst, src_start, dst_start, length, op``, sorted by step.
    num_steps: number of steps (steps may be empty).
    root: the root rank of a broadcast.
    chunks: pipeline depth the algorithm chose (informational).
    perm: the ``(src, dst)`` pairs of a ppermute (empty for the others).
  """

  collective: str
  nranks: int
  length: int
  itemsize: int
  algorithm: str
  table: np.ndarray
  num_steps: int
  root: int = 0
  chunks: int = 1
  perm: tuple[tuple[int, int], ...] = ()

  def __post_init__(self):
    if self.collective not in COLLECTIVES:
      raise ValueError(f"collective must be one of {COLLECTIVES}, got {self.collective!r}")
    object.__setattr__(self, "perm", tuple((int(s), int(d)) for s, d in self.perm))
    table = np.asarray(self.table, dtype=np.int64).reshape(-1, NUM_COLUMNS)
    order = np.argsort(table[:, STEP], kind="stable")
    table = np.ascontiguousarray(table[order])
    table.setflags(write=False)
    object.__setattr__(self, "table", table)

  @functools.cached_property
  def digest(self) -> str:
    """A hash of all that executors and the checker see: equal digests, equal schedules."""
    h = hashlib.sha256()
    h.update(repr((self.collective, self.nranks, self.length, self.itemsize,
                   self.num_steps, self.root, self.perm)).encode())
    h.update(self.table.tobytes())
    return h.hexdigest()

  def __hash__(self):
    return hash(self.digest)

  def __eq__(self, other):
    return isinstance(other, Schedule) and self.digest == other.digest

  def __repr__(self):
    return (f"Schedule({self.collective}, algorithm={self.algorithm!r}, "
            f"nranks={self.nranks}, length={self.length}, steps={self.num_steps}, "
            f"transfers={len(self.table)}, chunks={self.chunks})")

  @property
  def nbytes(self) -> int:
    return self.length * self.itemsize

  @functools.cached_property
  def step_bounds(self) -> np.ndarray:
    """``table[step_bounds[t]:step_bounds[t + 1]]`` are the rows of step t."""
    return np.searchsorted(self.table[:, STEP], np.arange(self.num_steps + 1))

  def step_table(self, t: int) -> np.ndarray:
    lo, hi = self.step_bounds[t], self.step_bounds[t + 1]
    return self.table[lo:hi]

  @property
  def steps(self) -> Iterator[tuple[Transfer, ...]]:
    for t in range(self.num_steps):
      yield tuple(Transfer(*map(int, row[SRC:])) for row in self.step_table(t))

  def bytes_sent(self) -> np.ndarray:
    """Bytes each rank sends over the whole schedule, shape ``(nranks,)``."""
    return np.bincount(self.table[:, SRC], weights=self.table[:, LENGTH],
                       minlength=self.nranks) * self.itemsize

  def bytes_received(self) -> np.ndarray:
    """Bytes each rank receives over the whole schedule, shape ``(nranks,)``."""
    return np.bincount(self.table[:, DST], weights=self.table[:, LENGTH],
                       minlength=self.nranks) * self.itemsize

  def owned_range(self, rank: int) -> tuple[int, int]:
    """The shard of a rank for reduce_scatter and all_gather (equal tiles)."""
    shard = self.length // self.nranks
    return (rank * shard, (rank + 1) * shard)


class TableBuilder:
  """Collects transfers step by step; ``build`` returns the Schedule."""

  def __init__(self):
    self._rows: list[tuple[int, ...]] = []

  def add(self, step: int, src: int, dst: int, src_start: int, dst_start: int,
          length: int, op: int) -> None:
    if length <= 0:
      return
    self._rows.append((step, src, dst, src_start, dst_start, length, op))

  def build(self, collective: str, nranks: int, length: int, itemsize: int,
            algorithm: str, root: int = 0, chunks: int = 1,
            perm: tuple[tuple[int, int], ...] = ()) -> Schedule:
    table = np.array(self._rows, dtype=np.int64).reshape(-1, NUM_COLUMNS)
    # Renumber the steps so that none is empty.
    used, table[:, STEP] = np.unique(table[:, STEP], return_inverse=True)
    steps = len(used)
    return Schedule(collective=collective, nranks=nranks, length=length,
                    itemsize=itemsize, algorithm=algorithm, table=table,
                    num_steps=steps, root=root, chunks=chunks, perm=perm)


def split(total: int, parts: int) -> np.ndarray:
  """Boundaries of ``parts`` near-equal pieces of ``total``: shape ``(parts + 1,)``."""
  return (np.arange(parts + 1, dtype=np.int64) * total) // max(parts, 1)


def split_weighted(total: int, weights) -> np.ndarray:
  """Boundaries of pieces of ``total`` proportional to ``weights`` (sum > 0)."""
  w = np.asarray(weights, dtype=np.float64)
  cum = np.concatenate([[0.0], np.cumsum(w)])
  bounds = np.rint(cum / cum[-1] * total).astype(np.int64)
  bounds[-1] = total
  return np.maximum.accumulate(bounds)
