"""The Schedule: the one intermediate representation between algorithms and executors.

A schedule moves ranges of a per-rank buffer of ``length`` elements between
``nranks`` ranks. It is a list of steps; each step a set of transfers
``(src, dst, src_range, dst_range, op)``. The table behind it is one int64
array with a row per transfer; behind a header it crosses into the FFI as one
attribute (``serialized``).

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

``Schedule.validate`` enforces the rules above that a table alone shows (ranges,
ranks, ops, the per-step rules); ``jaxcc.sim.check`` proves the result.
``Schedule.serialized`` is the table as executors read it: a header
(``TABLE_MAGIC``, ``TABLE_VERSION``, ``NUM_COLUMNS``, the number of rows), then
the rows (``read_table`` checks it; ``xla_ffi/include/jaxcc/schedule.h`` reads
the same layout). ``Schedule.serialized_for(ranks)`` is that layout with only the
rows that ``ranks`` send or receive: what a process passes for the ranks it holds.
``RankSchedule`` is that part planned on its own (``TableBuilder(ranks)``), without the whole
table: what the native executor runs.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from typing import Iterator, NamedTuple

import numpy as np

from jaxcc.schedules.tables import starts, unique

COPY = 0
REDUCE = 1
OP_NAMES = {COPY: "copy", REDUCE: "reduce"}

# Columns of Schedule.table.
STEP, SRC, DST, SRC_START, DST_START, LENGTH, OP = range(7)
NUM_COLUMNS = 7
# The header of Schedule.serialized; a change of the layout bumps TABLE_VERSION here and in
# xla_ffi/include/jaxcc/schedule.h.
TABLE_MAGIC = int.from_bytes(b"jaxccSCH", "big")
TABLE_VERSION = 1
HEADER_LEN = 4

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "ppermute")


class ScheduleError(ValueError):
  """A schedule breaks a rule of the IR or does not compute its collective."""


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
class _Steps:
  """The fields a Schedule and a RankSchedule share, in the order both take them."""

  collective: str
  nranks: int
  length: int
  itemsize: int
  algorithm: str
  table: np.ndarray
  num_steps: int


@dataclasses.dataclass(frozen=True, eq=False)
class Schedule(_Steps):
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

  root: int = 0
  chunks: int = 1
  perm: tuple[tuple[int, int], ...] = ()

  def __post_init__(self):
    if self.collective not in COLLECTIVES:
      raise ValueError(f"jaxcc.Schedule: collective must be one of {COLLECTIVES}, "
                       f"got {self.collective!r}")
    object.__setattr__(self, "perm", tuple((int(s), int(d)) for s, d in self.perm))
    table = np.asarray(self.table, dtype=np.int64)
    if table.ndim != 2 or table.shape[1] != NUM_COLUMNS:
      table = table.reshape(-1, NUM_COLUMNS)
    # Sorted by step (stably), in a copy of its own; a sorted read-only table that owns its
    # memory (TableBuilder.build's) is kept.
    if (table[1:, STEP] < table[:-1, STEP]).any():
      step = table[:, STEP]  # a narrow copy sorts by radix
      step = step.astype(np.int32) if 0 <= step.min() and step.max() < 2**31 else step
      table = np.ascontiguousarray(table[np.argsort(step, kind="stable")])
    elif table.flags.writeable or not table.flags.owndata or not table.flags.c_contiguous:
      table = np.array(table, order="C")
    table.setflags(write=False)
    object.__setattr__(self, "table", table)

  @functools.cached_property
  def digest(self) -> str:
    """A hash of all that executors and the checker see: equal digests, equal schedules."""
    h = hashlib.sha256()
    h.update(repr((self.collective, self.nranks, self.length, self.itemsize,
                   self.num_steps, self.root, self.perm)).encode())
    h.update(self.table)  # its C-contiguous buffer, not a copy
    return h.hexdigest()

  def __hash__(self):
    return hash(self.digest)

  def __eq__(self, other):
    return isinstance(other, Schedule) and self.digest == other.digest

  def __repr__(self):
    return (f"Schedule({self.collective}, algorithm={self.algorithm!r}, "
            f"nranks={self.nranks}, length={self.length}, steps={self.num_steps}, "
            f"transfers={len(self.table)}, chunks={self.chunks})")

  @functools.cached_property
  def serialized(self) -> np.ndarray:
    """The table as executors read it: header, then the rows (int64, read-only)."""
    return _serialize(self.table)

  def serialized_for(self, ranks) -> np.ndarray:
    """``serialized`` cut to the rows that ``ranks`` send or receive: all that the executors
    of those ranks read, so a program holding a few ranks carries their own transfers, not
    the whole table (the same array as ``serialized`` when ``ranks`` holds every rank)."""
    ranks = np.unique(np.asarray(ranks, np.int64))
    if len(ranks) == self.nranks:
      return self.serialized
    cache = self.__dict__.setdefault("_serialized_for", {})
    key = ranks.tobytes()
    if key not in cache:
      cache[key] = _serialize(_rows_of(self.table, self.nranks, ranks))
    return cache[key]

  def validate(self, api: str = "jaxcc.Schedule.validate") -> Schedule:
    """Checks the structural rules of the IR (once: a valid schedule stays valid).

    Args:
      api: the public function the error messages name.

    Returns:
      The schedule itself.

    Raises:
      ScheduleError: naming ``api``, the step, the transfer and the rank that
        break a rule.
    """
    if "_valid" not in self.__dict__:
      _check_rules(self, api)
      self.__dict__["_valid"] = True  # stored as cached_property stores: frozen allows it
    return self

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


@dataclasses.dataclass(frozen=True, eq=False)
class RankSchedule(_Steps):
  """The part of a Schedule that some ranks send or receive: what a process holding those ranks
  plans (``planner.rank_schedule``, without the whole table) and its native executor runs.

  Attributes:
    collective, nranks, length, itemsize, algorithm, num_steps, root, chunks, perm: the whole
      schedule's.
    ranks: the ranks it is for, sorted.
    table: the rows of the whole table that ``ranks`` send or receive, in its order.
    sent, received: int64 ``(2, nranks)``: the elements each rank sends and receives in the
      whole schedule, within its cluster (row 0) and across clusters (row 1), on the topology
      it was planned for (the pacing of the connections).
    digest: the whole schedule's identity, equal in every process that planned it: the
      planner's hash of the planning arguments (empty from ``TableBuilder.build_part``).
  """

  ranks: np.ndarray
  sent: np.ndarray
  received: np.ndarray
  digest: str = ""
  root: int = 0
  chunks: int = 1
  perm: tuple[tuple[int, int], ...] = ()

  @classmethod
  def of(cls, schedule: Schedule, ranks, digest: str, cluster=None) -> RankSchedule:
    """The part of ``schedule`` for ``ranks`` (cut from its table); ``cluster``: the cluster
    of each rank, None: one."""
    ranks = np.unique(np.asarray(ranks, np.int64))
    rows = (schedule.table if len(ranks) == schedule.nranks
            else _rows_of(schedule.table, schedule.nranks, ranks))
    sent, received = traffic(schedule.table, schedule.nranks, cluster)
    return cls(schedule.collective, schedule.nranks, schedule.length, schedule.itemsize,
               schedule.algorithm, rows, schedule.num_steps, ranks, sent, received,
               digest, schedule.root, schedule.chunks, schedule.perm)

  def __repr__(self):
    return (f"RankSchedule({self.collective}, algorithm={self.algorithm!r}, "
            f"nranks={self.nranks}, length={self.length}, steps={self.num_steps}, "
            f"ranks={len(self.ranks)}, transfers={len(self.table)}, chunks={self.chunks})")

  def serialized_for(self, ranks) -> np.ndarray:
    """``Schedule.serialized_for(ranks)`` of the whole schedule, for ``ranks`` among its own.

    Raises:
      ValueError: a rank of ``ranks`` that it was not planned for.
    """
    ranks = np.unique(np.asarray(ranks, np.int64))
    others = np.setdiff1d(ranks, self.ranks)
    if len(others):
      raise ValueError(f"jaxcc.RankSchedule: planned for ranks {self.ranks.tolist()}, not for "
                       f"rank {int(others[0])}")
    cache = self.__dict__.setdefault("_serialized_for", {})
    key = ranks.tobytes()
    if key not in cache:
      rows = (self.table if len(ranks) == len(self.ranks)
              else _rows_of(self.table, self.nranks, ranks))
      cache[key] = _serialize(rows)
    return cache[key]


def traffic(table: np.ndarray, nranks: int, cluster=None) -> tuple[np.ndarray, np.ndarray]:
  """The elements each rank sends and receives in ``table``, each int64 ``(2, nranks)``: within
  its cluster (row 0) and across clusters (row 1); ``cluster``: of each rank, None: one."""
  src, dst, n = table[:, SRC], table[:, DST], table[:, LENGTH]
  cross = 0 if cluster is None else (np.asarray(cluster)[src] != np.asarray(cluster)[dst])
  return tuple(np.bincount(cross * nranks + end, weights=n, minlength=2 * nranks)
               .astype(np.int64).reshape(2, nranks) for end in (src, dst))


class TableBuilder:
  """Collects transfers step by step (one at a time or as arrays); ``build`` returns the
  Schedule. Rows keep the order they were added in; a transfer of length 0 is left out.

  With ``ranks`` it builds the part of a schedule that those ranks send or receive
  (``build_part``): it keeps their rows only, and numbers the steps as the whole schedule does
  from the steps of every row of positive length it is given. An algorithm gives it, through
  ``index``, the rows of those ranks and a row of positive length of every step that has one,
  not the whole table.
  """

  def __init__(self, ranks=None):
    self._blocks: list[np.ndarray] = []
    self._rows: list[tuple[int, ...]] = []
    self._ranks = None if ranks is None else np.unique(np.asarray(ranks, np.int64))
    self._mine = np.zeros(0, bool)
    self._busy: list[np.ndarray] = []  # the steps seen with ``ranks``

  def index(self, shape, touching, cover) -> tuple[np.ndarray, ...]:
    """Indices into a block of transfers of ``shape`` that ``add_rows`` adds in C order.

    Without ``ranks``: every index, as broadcastable aranges (``np.ix_``). With them: the
    indices that ``touching(ranks, *axes)`` names (the transfers those ranks send and those
    they receive) and ``cover(*axes)`` names (a transfer of positive length of each step of
    the block that has one, if any), as 1-D arrays sorted in C order, each once; ``axes`` are
    the aranges, ``ranks`` an array along a new first axis; each names a list of index tuples
    that broadcast together, and indices outside ``shape`` are left out.
    """
    axes = np.ix_(*(np.arange(n) for n in shape))
    if self._ranks is None:
      return axes
    if not math.prod(shape):
      return tuple(np.zeros(0, np.int64) for _ in shape)
    ranks = self._ranks.reshape((-1,) + (1,) * len(shape))
    flat = [np.zeros(0, np.int64)]
    for idx in (*touching(ranks, *axes), *cover(*axes)):
      idx = [a.reshape(-1) for a in np.broadcast_arrays(*idx)]
      inside = np.logical_and.reduce([(0 <= a) & (a < n) for a, n in zip(idx, shape)])
      flat.append(np.ravel_multi_index([a[inside] for a in idx], shape))
    return np.unravel_index(unique(np.concatenate(flat)), shape)

  def at(self, values, shape, index) -> np.ndarray:
    """``values`` (an array that broadcasts to a block of ``shape``) at the block's ``index``
    (``index``'s answer)."""
    return values if self._ranks is None else np.broadcast_to(values, shape)[index]

  def add(self, step: int, src: int, dst: int, src_start: int, dst_start: int,
          length: int, op: int) -> None:
    if length <= 0:
      return
    self._rows.append((step, src, dst, src_start, dst_start, length, op))

  def add_rows(self, step, src, dst, src_start, dst_start, length, op) -> None:
    """Adds one transfer per element of the broadcast arrays, in C order."""
    cols = (step, src, dst, src_start, dst_start, length, op)
    shape = np.broadcast_shapes(*(np.shape(c) for c in cols))
    rows = np.empty(shape + (NUM_COLUMNS,), np.int64)
    for j, c in enumerate(cols):
      rows[..., j] = c
    rows = rows.reshape(-1, NUM_COLUMNS)
    self._flush()
    self._keep(rows if rows[:, LENGTH].min(initial=1) > 0 else rows[rows[:, LENGTH] > 0])

  def _flush(self) -> None:
    if self._rows:
      self._keep(np.array(self._rows, dtype=np.int64).reshape(-1, NUM_COLUMNS))
      self._rows = []

  def _keep(self, rows: np.ndarray) -> None:
    """Keeps ``rows`` (of positive length), or with ``ranks`` those of the ranks and their
    steps."""
    if self._ranks is not None and len(rows):
      self._busy.append(unique(rows[:, STEP]))
      top = max(int(rows[:, SRC].max()), int(rows[:, DST].max())) + 1
      if len(self._mine) < top:
        self._mine = np.zeros(top, bool)
        self._mine[self._ranks[self._ranks < top]] = True
      rows = rows[self._mine[rows[:, SRC]] | self._mine[rows[:, DST]]]
    self._blocks.append(rows)

  def build(self, collective: str, nranks: int, length: int, itemsize: int,
            algorithm: str, root: int = 0, chunks: int = 1,
            perm: tuple[tuple[int, int], ...] = ()) -> Schedule:
    """The Schedule: the rows sorted by step (stably, in the order they were added) and the
    steps renumbered so that none is empty, in one pass that puts each row in its place."""
    table, steps = self._table()
    return Schedule(collective=collective, nranks=nranks, length=length,
                    itemsize=itemsize, algorithm=algorithm, table=table,
                    num_steps=steps, root=root, chunks=chunks, perm=perm)

  def build_part(self, collective: str, nranks: int, length: int, itemsize: int,
                 algorithm: str, sent, received, root: int = 0,
                 chunks: int = 1) -> RankSchedule:
    """The RankSchedule of a builder with ``ranks``: their rows as ``build`` sorts and numbers
    them in the whole table. ``sent`` and ``received``: the elements each rank sends and
    receives in the whole schedule (one cluster); the digest is left to the planner."""
    table, steps = self._table(unique(np.concatenate([np.zeros(0, np.int64), *self._busy])))
    zero = np.zeros(nranks, np.int64)
    return RankSchedule(collective, nranks, length, itemsize, algorithm, table, steps,
                        self._ranks, np.stack([sent, zero]).astype(np.int64),
                        np.stack([received, zero]).astype(np.int64), root=root, chunks=chunks)

  def _table(self, busy: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """The rows sorted by step and renumbered (read-only), and the number of steps: those
    with rows, or with ``busy`` (sorted) the steps it names."""
    self._flush()
    blocks = [b for b in self._blocks if len(b)]
    table = np.empty((sum(len(b) for b in blocks), NUM_COLUMNS), np.int64)
    steps = 0 if busy is None else len(busy)
    if blocks:
      lo = min(int(b[:, STEP].min()) for b in blocks)
      span = max(int(b[:, STEP].max()) for b in blocks) - lo + 1
      counts = np.stack([np.bincount(b[:, STEP] - lo, minlength=span) for b in blocks])
      total = counts.sum(axis=0)
      if busy is None:
        renumber = np.cumsum(total > 0) - 1
        steps = int(renumber[-1]) + 1
      else:
        renumber = np.searchsorted(busy, np.arange(lo, lo + span))
      # Where the rows of step s from block b start: after every earlier step, then after
      # that step's rows of the earlier blocks.
      first = (np.cumsum(total) - total)[None, :] + np.cumsum(counts, axis=0) - counts
      for b, block in enumerate(blocks):
        step = block[:, STEP] - lo
        if (step[1:] < step[:-1]).any():
          order = np.argsort(step.astype(np.int32) if span < 2**31 else step, kind="stable")
          block, step = block[order], step[order]
        group = np.cumsum(counts[b]) - counts[b]  # where each step's rows start in the block
        at = first[b][step] + np.arange(len(step)) - group[step]
        table[at] = block
        table[at, STEP] = renumber[step]
    table.setflags(write=False)
    return table, steps


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


def read_table(values: np.ndarray, api: str) -> np.ndarray:
  """The rows of a serialized table (``Schedule.serialized``), shape ``(rows, NUM_COLUMNS)``.

  Raises:
    ValueError: naming ``api`` when the header is not this version's (a table
      written by another build of jaxcc) or does not match the values.
  """
  values = np.asarray(values, np.int64).reshape(-1)
  if len(values) < HEADER_LEN or values[0] != TABLE_MAGIC or values[1] != TABLE_VERSION:
    found = (f"version {int(values[1])}" if len(values) >= HEADER_LEN and values[0] == TABLE_MAGIC
             else "no jaxcc table header")
    raise ValueError(f"{api}: schedule table magic/version mismatch: rebuild jaxcc (found "
                     f"{found}, this jaxcc reads version {TABLE_VERSION})")
  columns, rows = int(values[2]), int(values[3])
  if columns != NUM_COLUMNS or rows < 0 or len(values) != HEADER_LEN + rows * columns:
    raise ValueError(f"{api}: schedule table header says {rows} rows of {columns} columns, "
                     f"but the table has {len(values) - HEADER_LEN} values after it")
  return values[HEADER_LEN:].reshape(rows, NUM_COLUMNS)


def check_perm(perm, p: int, api: str) -> tuple[tuple[int, int], ...]:
  """``perm`` as a tuple of ``(src, dst)`` int pairs, validated as ``lax.ppermute`` does.

  Args:
    perm: pairs ``(src, dst)``; ranks in ``[0, p)``, each at most once as a
      source and once as a destination (``(r, r)`` is allowed).
    p: the number of ranks.
    api: the name the error messages start with.

  Raises:
    ValueError: naming ``api``, the bad rank or the bad pairs.
  """
  try:
    pairs = tuple((int(s), int(d)) for s, d in perm)
  except (TypeError, ValueError):
    raise ValueError(f"{api}: perm must be a sequence of (src, dst) pairs, "
                     f"got {perm!r}") from None
  srcs, dsts = [s for s, _ in pairs], [d for _, d in pairs]
  for r in srcs + dsts:
    if not 0 <= r < p:
      raise ValueError(f"{api}: rank {r} in perm is outside the axis of size {p}")
  if len(set(srcs)) != len(srcs) or len(set(dsts)) != len(dsts):
    raise ValueError(f"{api}: perm {pairs} names a rank twice as source or as destination")
  return pairs


def describe(schedule: Schedule) -> str:
  """The schedule as error messages name it."""
  return (f"{schedule.algorithm} {schedule.collective} schedule (nranks={schedule.nranks}, "
          f"length={schedule.length})")


def transfer_error(api: str, schedule: Schedule, row, rank, what: str) -> ScheduleError:
  """A ScheduleError naming ``api``, the schedule, the step and transfer ``row``, and ``rank``."""
  step, src, dst, src_start, dst_start, n, op = (int(v) for v in schedule.table[row])
  transfer = (f"transfer #{int(row)} ({src}->{dst} {OP_NAMES.get(op, op)} "
              f"{_range(src_start, n)} -> {_range(dst_start, n)})")
  return ScheduleError(f"{api}: {describe(schedule)}: step {step}, {transfer}: "
                       f"rank {int(rank)}: {what}")


def _check_rules(schedule: Schedule, api: str) -> None:
  """The structural rules of the module docstring, vectorised over the table."""
  p, length, coll = schedule.nranks, schedule.length, schedule.collective
  name = f"{api}: {describe(schedule)}"
  if p < 1 or length < 0:
    raise ScheduleError(f"{name}: nranks must be >= 1 and length >= 0")
  if coll in ("reduce_scatter", "all_gather") and length % p:
    raise ScheduleError(f"{name}: {coll} needs length divisible by nranks (equal shards), "
                        f"got length {length}")
  if coll == "broadcast" and not 0 <= schedule.root < p:
    raise ScheduleError(f"{name}: root {schedule.root} outside [0, {p})")
  if coll == "ppermute":
    _check_perm_rules(schedule, name)
  elif schedule.perm:
    raise ScheduleError(f"{name}: perm is for ppermute only")
  table = schedule.table
  if not len(table):
    return
  step, src, dst, src_start, dst_start, n, op = table.T
  rules = (
      ((step < 0) | (step >= schedule.num_steps), src, f"step outside [0, {schedule.num_steps})"),
      ((op != COPY) & (op != REDUCE), src, "op is neither copy (0) nor reduce (1)"),
      ((src < 0) | (src >= p), src, f"src rank outside [0, {p})"),
      ((dst < 0) | (dst >= p), dst, f"dst rank outside [0, {p})"),
      (src == dst, src, "sends to itself"),
      (n <= 0, src, "length must be > 0"),
      ((src_start < 0) | (src_start + n > length), src, f"src range outside [0, {length})"),
      ((dst_start < 0) | (dst_start + n > length), dst, f"dst range outside [0, {length})"),
      ((op == REDUCE) & (coll in ("all_gather", "broadcast", "ppermute")), dst,
       f"reduce is not allowed in {coll}"),
  )
  for bad, rank, what in rules:
    if bad.any():
      row = int(np.argmax(bad))
      raise transfer_error(api, schedule, row, rank[row], what)

  pair = (step * p + src) * p + dst
  order = np.argsort(pair, kind="stable")
  same = np.flatnonzero(pair[order][1:] == pair[order][:-1])
  if len(same):
    a, b = order[same[0]], order[same[0] + 1]
    raise transfer_error(api, schedule, b, src[b], f"second transfer to rank {dst[b]} in this "
                         f"step (first: transfer #{a})")

  # Reduce groups (step, dst): one shared dst range; the first row stands for the group.
  group = step * p + dst
  red = np.flatnonzero(op == REDUCE)
  red = red[np.argsort(group[red], kind="stable")]
  first = starts(group[red])
  head = red[np.maximum.accumulate(np.where(first, np.arange(len(red)), 0))]
  bad = (dst_start[red] != dst_start[head]) | (n[red] != n[head])
  if bad.any():
    row, other = red[np.argmax(bad)], head[np.argmax(bad)]
    raise transfer_error(api, schedule, row, dst[row], f"reduces into "
                         f"{_range(dst_start[row], n[row])} but transfer #{other} reduces into "
                         f"{_range(dst_start[other], n[other])} in the same step")

  # Written ranges per (step, dst): pairwise disjoint.
  writes = np.concatenate([np.flatnonzero(op == COPY), red[first]])
  writes = writes[np.lexsort((dst_start[writes], group[writes]))]
  w_group, w_start = group[writes], dst_start[writes]
  w_end = w_start + n[writes]
  bad = (w_group[1:] == w_group[:-1]) & (w_start[1:] < w_end[:-1])
  if bad.any():
    i = int(np.argmax(bad))
    a, b = writes[i], writes[i + 1]
    raise transfer_error(api, schedule, b, dst[b], f"writes {_range(dst_start[b], n[b])}, "
                         f"overlapping {_range(dst_start[a], n[a])} written by transfer #{a} in "
                         f"the same step")

  # Written ranges disjoint from the ranges the rank sends in that step. Writes are sorted
  # and disjoint per group, so their ends ascend: only the last write starting before the
  # end of a sent range can overlap it.
  groups = unique(np.r_[w_group, step * p + src])
  w_id, s_id = np.searchsorted(groups, w_group), np.searchsorted(groups, step * p + src)
  pos = np.searchsorted(w_id * (length + 1) + w_start,
                        s_id * (length + 1) + src_start + n) - 1
  hit = pos >= 0
  hit[hit] = (w_id[pos[hit]] == s_id[hit]) & (w_end[pos[hit]] > src_start[hit])
  if hit.any():
    row = int(np.argmax(hit))
    other = writes[pos[row]]
    raise transfer_error(api, schedule, row, src[row], f"sends {_range(src_start[row], n[row])} "
                         f"while transfer #{other} writes {_range(dst_start[other], n[other])} "
                         f"into it in the same step")


def _check_perm_rules(schedule: Schedule, name: str) -> None:
  """A ppermute's buffer halves and perm: valid pairs, none a rank's own destination."""
  if schedule.length % 2:
    raise ScheduleError(f"{name}: ppermute needs an even length (the input half and the output "
                        f"half), got length {schedule.length}")
  try:
    check_perm(schedule.perm, schedule.nranks, name)
  except ValueError as e:
    raise ScheduleError(str(e)) from None
  for src, dst in schedule.perm:
    if src == dst:
      raise ScheduleError(f"{name}: perm pair ({src}, {dst}) sends rank {src} to itself; "
                          f"leave it out (the caller keeps the input)")


def _range(start, n) -> str:
  return f"[{start}, {start + n})"


def _rows_of(table: np.ndarray, nranks: int, ranks: np.ndarray) -> np.ndarray:
  """The rows of ``table`` that ``ranks`` send or receive."""
  mine = np.zeros(nranks, bool)
  mine[ranks] = True
  return table[mine[table[:, SRC]] | mine[table[:, DST]]]


def _serialize(rows: np.ndarray) -> np.ndarray:
  """The header, then ``rows`` (int64, read-only): the layout ``read_table`` reads."""
  header = np.array([TABLE_MAGIC, TABLE_VERSION, NUM_COLUMNS, len(rows)], np.int64)
  out = np.concatenate([header, rows.reshape(-1)])
  out.setflags(write=False)
  return out
