"""Symbolic proof that a Schedule computes its collective.

``check`` runs the schedule on symbols instead of data, with the semantics of
``jaxcc.schedules.ir``: every element of every rank holds the SET of input
ranks whose contribution it contains (a bitmask of ``ceil(p / 64)`` uint64
words), a "defined" flag and the position it came from. A ``COPY`` copies all
three; a ``REDUCE`` fails if the two sets overlap (a contribution counted twice)
or the positions differ. ``REDUCE`` is only allowed in all_reduce and
reduce_scatter, where every element is defined from the start. The final state
must be the collective's result, in place (a ppermute's in the output half),
on every rank.

Elements are grouped into segments cut at every range boundary of the schedule
(closed under the offsets of transfers whose source and destination ranges
differ), so the cost is per segment, not per element, and real sizes check fast.
"""

from __future__ import annotations

import numpy as np

from jaxcc.schedules.ir import REDUCE, Schedule, ScheduleError, describe, transfer_error
from jaxcc.schedules.tables import rank_in_group, ranges, starts, unique

API = "jaxcc.sim.check"


def check(schedule: Schedule) -> None:
  """Proves that ``schedule`` computes its collective on every rank.

  Initial and final states (p ranks, rank r's shard is ``schedule.owned_range(r)``):

  * all_reduce: r holds {r} everywhere; finally every element holds all ranks.
  * reduce_scatter: r holds {r} everywhere; finally r's shard holds all ranks.
  * all_gather: r holds {r} on its shard, undefined elsewhere; finally every
    element is defined and holds exactly {owner of its shard}.
  * broadcast: the root holds {root}, the others are undefined; finally every
    element holds {root}.
  * ppermute (``n = length / 2``): r holds {r} on the input ``[0, n)``,
    undefined on the output ``[n, 2n)``; finally for each ``(src, dst)`` of
    ``perm`` element ``n + i`` of dst holds element i of src, and the output
    of a rank no pair sends to is still undefined. Inputs may end as anything.

  Args:
    schedule: the schedule to prove.

  Raises:
    ScheduleError: naming the step, the transfer and the rank of the first problem
      (a broken rule of the IR, ``Schedule.validate``, first).
  """
  schedule.validate(API)
  if not schedule.length:  # an empty buffer: no transfers, nothing to prove
    return
  p, coll = schedule.nranks, schedule.collective
  cuts = _cuts(schedule)
  nseg = len(cuts) - 1
  bits, defined, want = _states(schedule, cuts)
  origin = np.tile(cuts[:-1], p)  # The position each segment's first element came from.
  writer = _execute(schedule, cuts, bits.reshape(p * nseg, -1), defined.reshape(-1),
                    origin).reshape(p, nseg)
  origin = origin.reshape(p, nseg)
  half = schedule.length // 2
  output = cuts[:-1] >= half  # the ppermute's output half
  home = cuts[:-1] - half * output if coll == "ppermute" else cuts[:-1]
  misplaced = origin != home
  wrong = ~defined | (bits != want).any(-1) | misplaced
  if coll == "reduce_scatter":
    wrong &= _owner(schedule, cuts)[None, :] == np.arange(p)[:, None]
  receives = np.zeros(p, bool)
  receives[[d for _, d in schedule.perm]] = True
  if coll == "ppermute":
    wrong = np.where(receives[:, None], wrong, defined) & output[None, :]
  if wrong.any():
    r, g = np.unravel_index(np.argmax(wrong), wrong.shape)
    if coll == "ppermute" and not receives[r]:
      what = f"holds data of {_ranks(bits[r, g])} but no pair of the perm sends to rank {r}"
    elif not defined[r, g]:
      what = "is undefined"
    elif misplaced[r, g]:
      what = f"holds element {origin[r, g]} (misplaced)"
    elif coll in ("all_reduce", "reduce_scatter"):
      what = f"misses the contributions of {_ranks(want[r, g] & ~bits[r, g])}"
    else:
      what = f"holds {_ranks(bits[r, g])} instead of {_ranks(want[r, g])}"
    element = f"element {cuts[g]} {what} at the end"
    if writer[r, g] < 0:
      raise ScheduleError(f"{API}: {describe(schedule)}: rank {r}: {element}; "
                          f"no transfer writes it")
    raise transfer_error(API, schedule, writer[r, g], r, f"{element} (last written by this "
                         f"transfer)")


def _states(schedule: Schedule, cuts):
  """Initial contribution sets and defined flags, and the wanted final sets, per segment."""
  p, coll = schedule.nranks, schedule.collective
  nseg, words = len(cuts) - 1, (p + 63) // 64
  ranks = np.arange(p)
  rank_bits = np.zeros((p, words), np.uint64)
  rank_bits[ranks, ranks // 64] = np.left_shift(np.uint64(1), (ranks % 64).astype(np.uint64))
  if coll == "all_gather":
    owner = _owner(schedule, cuts)
    defined, want = owner[None, :] == ranks[:, None], rank_bits[owner]
  elif coll == "broadcast":
    defined = np.broadcast_to(ranks[:, None] == schedule.root, (p, nseg))
    want = rank_bits[schedule.root]
  elif coll == "ppermute":  # each rank's output half wants its source's input
    defined = np.broadcast_to(cuts[None, :-1] < schedule.length // 2, (p, nseg))
    source = ranks.copy()
    for src, dst in schedule.perm:
      source[dst] = src
    want = rank_bits[source][:, None]
  else:
    defined, want = np.ones((p, nseg), bool), np.bitwise_or.reduce(rank_bits)
  bits = np.where(defined[..., None], rank_bits[:, None], np.uint64(0))
  return bits, defined.copy(), np.broadcast_to(want, bits.shape)


def _owner(schedule: Schedule, cuts) -> np.ndarray:
  """The rank whose shard each segment is in (reduce_scatter, all_gather)."""
  return cuts[:-1] // (schedule.length // schedule.nranks)


def _execute(schedule: Schedule, cuts, bits, defined, origin) -> np.ndarray:
  """Runs the schedule on the flat ``(rank, segment)`` state in place; returns the last writers.

  Per step the copies go first, then the k-th reduce into each rank for k = 0, 1, ...,
  each batch as one numpy operation. Within a step the ranges a rank sends are
  disjoint from those it receives (``Schedule.validate``), so every batch reads the pre-step state.
  """
  p, nseg = schedule.nranks, len(cuts) - 1
  writer = np.full(len(defined), -1, np.int64)
  step, src, dst, src_start, dst_start, n, op = schedule.table.T
  if not len(step):
    return writer
  kind = np.where(op == REDUCE, 1 + rank_in_group(step * p + dst, op == REDUCE), 0)
  order = np.argsort(step * p + kind, kind="stable")
  s0 = np.searchsorted(cuts, src_start[order])
  cnt = np.searchsorted(cuts, (src_start + n)[order]) - s0
  src_el = ranges(src[order] * nseg + s0, cnt)
  dst_el = ranges(dst[order] * nseg + np.searchsorted(cuts, dst_start[order]), cnt)
  el_row = np.repeat(order, cnt)
  heads = np.flatnonzero(starts((step * p + kind)[order]))
  bounds = np.r_[np.cumsum(np.r_[0, cnt])[heads], len(src_el)]
  for lo, hi, reduce in zip(bounds[:-1], bounds[1:], kind[order[heads]] > 0):
    si, di = src_el[lo:hi], dst_el[lo:hi]
    values = bits[si]
    if reduce:  # Only in all_reduce and reduce_scatter, where all is defined.
      current = bits[di]
      twice = (values & current).any(1)
      misplaced = origin[si] != origin[di]
      if twice.any() or misplaced.any():
        i = int(np.argmax(twice | misplaced))
        row, element = el_row[lo + i], cuts[di[i] % nseg]
        what = (f"would add element {origin[si[i]]} of another position" if misplaced[i] else
                f"would count {_ranks(values[i] & current[i])} twice")
        raise transfer_error(API, schedule, row, dst[row], f"element {element} {what}")
      bits[di] = values | current
    else:
      bits[di] = values
      defined[di] = defined[si]
      origin[di] = origin[si]
    writer[di] = el_row[lo:hi]
  return writer


def _cuts(schedule: Schedule) -> np.ndarray:
  """Segment boundaries: every range boundary, closed under transfer offsets."""
  table, length, p = schedule.table, schedule.length, schedule.nranks
  _, _, _, src_start, dst_start, n, _ = table.T
  bounds = [[0, length], src_start, src_start + n, dst_start, dst_start + n]
  if schedule.collective in ("reduce_scatter", "all_gather"):
    bounds.append(np.arange(p + 1) * (length // p))
  if schedule.collective == "ppermute":
    bounds.append([length // 2])
  cuts = unique(np.concatenate(bounds))
  moved = src_start != dst_start
  a, b, m = src_start[moved], dst_start[moved], n[moved]
  while len(a):
    inner = [_inner(cuts, a, m, b - a), _inner(cuts, b, m, a - b)]
    grown = unique(np.concatenate([cuts] + inner))
    if len(grown) == len(cuts):
      break
    cuts = grown
  return cuts


def _inner(cuts, start, n, shift):
  """The cuts strictly inside each range ``[start, start + n)``, moved by ``shift``."""
  lo = np.searchsorted(cuts, start, side="right")
  count = np.searchsorted(cuts, start + n, side="left") - lo
  return cuts[ranges(lo, count)] + np.repeat(shift, count)


def _ranks(words) -> str:
  """The set of ranks in a bitmask, as text."""
  ranks = [64 * w + b for w, word in enumerate(words.tolist()) for b in range(64)
           if word >> b & 1]
  text = ", ".join(map(str, ranks[:16])) + (", ..." if len(ranks) > 16 else "")
  return f"rank{'s' * (len(ranks) != 1)} {{{text}}}"
