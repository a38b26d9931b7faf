"""jaxcc.sim.check: correct schedules pass, each kind of broken one names its problem."""

import numpy as np
import pytest

from jaxcc import plan
from jaxcc.schedules.ir import COPY, REDUCE, Schedule
from jaxcc.sim import ScheduleError, check
from jaxcc.topology import Topology

from . import build, chain_broadcast, direct, four_stage, ring_all_reduce


def drop_rows(schedule: Schedule, keep) -> Schedule:
  return Schedule(schedule.collective, schedule.nranks, schedule.length, schedule.itemsize,
                  schedule.algorithm, schedule.table[keep], schedule.num_steps,
                  schedule.root, schedule.chunks)


@pytest.mark.parametrize("p", [1, 2, 3, 5, 8, 13])
def test_correct_schedules_pass(p):
  check(ring_all_reduce(p))
  check(ring_all_reduce(p, chunks=3, piece=2))
  for collective in ("all_reduce", "reduce_scatter", "all_gather"):
    check(direct(collective, p, shard=3))
  for root in {0, p // 2, p - 1}:
    check(chain_broadcast(p, 7, root=root, chunks=3))
  if p > 2:
    check(four_stage(p, chunks=3, piece=2))


def test_more_than_64_and_128_ranks():
  check(ring_all_reduce(65))
  schedule = direct("all_reduce", 130)
  check(schedule)
  broken = drop_rows(schedule, (schedule.table[:, 1] != 129) | (schedule.table[:, 6] == COPY))
  with pytest.raises(ScheduleError, match=r"misses the contributions of rank \{129\}"):
    check(broken)


def test_empty_schedules():
  check(build("all_reduce", 1, 5, []))
  check(build("all_gather", 1, 5, []))
  with pytest.raises(ScheduleError, match=r"^jaxcc.sim.check: hand all_reduce schedule "
                     r"\(nranks=2, length=3\): rank 0: element 0 misses the contributions of "
                     r"rank \{1\} at the end; no transfer writes it"):
    check(build("all_reduce", 2, 3, []))


def test_offsets_are_tracked():
  # Rank 1 stages root's [0, 3) at [2, 5); rank 2 takes it back to [0, 3).
  rows = [(0, 0, 1, 0, 2, 3, COPY), (1, 1, 2, 2, 0, 3, COPY),
          (2, 0, 1, 0, 0, 5, COPY), (2, 0, 2, 3, 3, 2, COPY)]
  check(build("broadcast", 3, 5, rows))
  with pytest.raises(ScheduleError, match=r"step 1, transfer #1 \(0->1 copy \[2, 4\) -> "
                     r"\[0, 2\)\): rank 1: element 0 holds element 2 \(misplaced\)"):
    check(build("broadcast", 2, 4, [(0, 0, 1, 0, 2, 2, COPY), (1, 0, 1, 2, 0, 2, COPY)]))
  with pytest.raises(ScheduleError, match=r"rank 1: element 1 would add element 0 of another"):
    check(build("all_reduce", 2, 2, [(0, 0, 1, 0, 1, 1, REDUCE)]))


def test_missing_step():
  ring = ring_all_reduce(5)
  broken = drop_rows(ring, ring.table[:, 0] != ring.num_steps - 1)
  with pytest.raises(ScheduleError, match=r"step 2, transfer #14 \(4->0 reduce \[2, 3\) -> "
                     r"\[2, 3\)\): rank 0: element 2 misses the contributions of rank \{1\}"):
    check(broken)


def test_missing_transfer_in_all_gather_leaves_undefined():
  ag = direct("all_gather", 4, shard=2)
  broken = drop_rows(ag, np.arange(len(ag.table)) != 5)
  src, dst = ag.table[5, 1:3]
  with pytest.raises(ScheduleError, match=rf"rank {dst}: element {2 * src} is undefined at the "
                     "end; no transfer writes it"):
    check(broken)


def test_forwarding_too_early_in_all_gather():
  ring = [(j, i, (i + 1) % 3, (i - j) % 3, (i - j) % 3, 1, COPY)
          for j in range(2) for i in range(3)]
  check(build("all_gather", 3, 3, ring))
  # Rank 1 forwards shard 0 in the step it receives it...
  with pytest.raises(ScheduleError, match=r"step 0, transfer #1 \(1->2 copy \[0, 1\) -> \[0, 1\)"
                     r"\): rank 1: sends \[0, 1\) while transfer #0 writes \[0, 1\) into it"):
    check(build("all_gather", 3, 3, [(0, 0, 1, 0, 0, 1, COPY), (0, 1, 2, 0, 0, 1, COPY)]))
  # ...or before: rank 2 receives undefined data.
  rows = [(0, 1, 2, 0, 0, 1, COPY), (1, 0, 1, 0, 0, 1, COPY), (2, 1, 0, 1, 1, 1, COPY),
          (2, 2, 0, 2, 2, 1, COPY), (2, 2, 1, 2, 2, 1, COPY), (2, 1, 2, 1, 1, 1, COPY)]
  with pytest.raises(ScheduleError, match=r"step 0, transfer #0 \(1->2 copy \[0, 1\) -> \[0, 1\)"
                     r"\): rank 2: element 0 is undefined at the end"):
    check(build("all_gather", 3, 3, rows))


def test_double_counted_reduce():
  # A reduce-scatter step too many counts the sender's contribution twice.
  rows = [tuple(r) for r in ring_all_reduce(4).table if r[0] < 3]
  rows += [(3, i, (i + 1) % 4, (i - 3) % 4, (i - 3) % 4, 1, REDUCE) for i in range(4)]
  with pytest.raises(ScheduleError, match=r"step 3, transfer #12 \(0->1 reduce \[1, 2\) -> "
                     r"\[1, 2\)\): rank 1: element 1 would count rank \{1\} twice"):
    check(build("all_reduce", 4, 4, rows))


def test_overlapping_write_and_read_in_one_step():
  rows = [(0, 0, 1, 0, 0, 2, COPY), (0, 1, 2, 1, 1, 2, COPY)]
  with pytest.raises(ScheduleError, match=r"step 0, transfer #1 \(1->2 copy \[1, 3\) -> \[1, 3\)"
                     r"\): rank 1: sends \[1, 3\) while transfer #0 writes \[0, 2\) into it"):
    check(build("broadcast", 3, 4, rows))


def test_two_reduce_ranges_into_one_rank():
  rows = [(0, 1, 0, 0, 0, 2, REDUCE), (0, 2, 0, 1, 1, 2, REDUCE)]
  with pytest.raises(ScheduleError, match=r"transfer #1 \(2->0 reduce \[1, 3\) -> \[1, 3\)\): "
                     r"rank 0: reduces into \[1, 3\) but transfer #0 reduces into \[0, 2\)"):
    check(build("all_reduce", 3, 4, rows))


def test_overlapping_writes():
  rows = [(0, 1, 0, 0, 0, 2, REDUCE), (0, 2, 0, 0, 0, 2, REDUCE), (0, 3, 0, 1, 1, 2, COPY)]
  with pytest.raises(ScheduleError, match=r"step 0, transfer #2 \(3->0 copy .*\): rank 0: writes "
                     r"\[1, 3\), overlapping \[0, 2\) written by transfer #0 in the same step"):
    check(build("all_reduce", 4, 4, rows))


@pytest.mark.parametrize("collective,row,message", [
    ("all_reduce", (0, 0, 3, 0, 0, 1, COPY), r"rank 3: dst rank outside \[0, 3\)"),
    ("all_reduce", (0, 1, 1, 0, 0, 1, COPY), r"rank 1: sends to itself"),
    ("all_reduce", (0, 0, 1, 3, 0, 2, COPY), r"rank 0: src range outside \[0, 4\)"),
    ("all_reduce", (0, 0, 1, 0, 3, 2, COPY), r"rank 1: dst range outside \[0, 4\)"),
    ("all_reduce", (0, 0, 1, 0, 0, 1, 7), r"op is neither copy \(0\) nor reduce \(1\)"),
    ("broadcast", (0, 0, 1, 0, 0, 1, REDUCE), r"rank 1: reduce is not allowed in broadcast"),
    ("all_gather", (0, 0, 1, 0, 0, 1, REDUCE), r"rank 1: reduce is not allowed in all_gather"),
    ("ppermute", (0, 0, 1, 0, 2, 1, REDUCE), r"rank 1: reduce is not allowed in ppermute"),
])
def test_bad_transfers(collective, row, message):
  with pytest.raises(ScheduleError, match=r"step 0, transfer #0 .*" + message):
    check(build(collective, 3, 3 if collective == "all_gather" else 4, [row]))


def test_two_transfers_between_one_pair_in_one_step():
  rows = [(0, 0, 1, 0, 0, 1, COPY), (0, 0, 1, 2, 2, 1, COPY)]
  with pytest.raises(ScheduleError, match=r"transfer #1 .*: rank 0: second transfer to rank 1 "
                     r"in this step \(first: transfer #0\)"):
    check(build("broadcast", 2, 4, rows))


def test_bad_schedule_attributes():
  with pytest.raises(ScheduleError, match="^jaxcc.sim.check: .* needs length divisible by nranks"):
    check(build("reduce_scatter", 3, 4, []))
  with pytest.raises(ScheduleError, match=r"root 3 outside \[0, 3\)"):
    check(build("broadcast", 3, 4, [], root=3))
  assert issubclass(ScheduleError, ValueError)


@pytest.mark.parametrize("collective,algorithm", [
    ("all_reduce", "ring"), ("all_reduce", "direct"), ("all_reduce", "optcc"),
    ("all_reduce", "r2ccl"), ("reduce_scatter", "ring"), ("reduce_scatter", "direct"),
    ("all_gather", "ring"), ("all_gather", "direct")])
def test_plan_schedules_are_correct(collective, algorithm):
  for p in range(1, 65):
    topology = Topology.uniform(p, 1e9).with_straggler(p - 1, 0.5)
    for length in sorted({1, 2, 3, p - 1, p, p + 1, 5 * p + 3, 97, 1000} - {0}):
      # reduce_scatter and all_gather need equal shards: there `length` is per shard.
      total = length if collective == "all_reduce" else length * p
      check(plan(collective, 4 * total, topology, algorithm, itemsize=4))


@pytest.mark.parametrize("stragglers", [
    ((1, 0.5),), ((1, 0.5), (2, 0.75)), ((0, 0.3), (2, 0.3)), ((1, 0.4), (3, 0.6), (4, 0.9))])
def test_optcc_with_leaves_is_correct_at_every_depth(stragglers):
  """The leaves' order and the tapered chunks: equal and unequal owners, 1 to 40 chunks."""
  for p in (5, 9, 12):
    topology = Topology.uniform(p, 1e9)
    for rank, fraction in stragglers:
      topology = topology.with_straggler(rank, fraction)
    for chunks in (1, 2, 3, 4, 7, 16, 40):
      for length in (p, 97, 1000):
        check(plan("all_reduce", 4 * length, topology, "optcc", itemsize=4, chunks=chunks))


def ppermute_rows(perm, n, chunks=1):
  """Each source's input ``[0, n)`` to its destination's output ``[n, 2n)``, chunk c at step c."""
  bounds = [c * n // chunks for c in range(chunks + 1)]
  return [(c, s, d, bounds[c], n + bounds[c], bounds[c + 1] - bounds[c], COPY)
          for c in range(chunks) for s, d in perm]


@pytest.mark.parametrize("p", [2, 3, 5, 8, 13])
def test_correct_ppermute_schedules_pass(p):
  perms = ([(i, (i + 1) % p) for i in range(p)],     # a cycle
           [(i, i + p // 2) for i in range(p // 2)],  # half the ranks receive nothing
           [(i, p - 1 - i) for i in range(p) if 2 * i + 1 != p],  # a reversal, no fixed point
           [])
  for perm in perms:
    for chunks in (1, 3):
      check(build("ppermute", p, 2 * 7, ppermute_rows(perm, 7, chunks), perm=perm))


def test_plan_ppermute_schedules_are_correct():
  rng = np.random.default_rng(0)
  for p in range(1, 65):
    topology = Topology.uniform(p, 1e9)
    dsts = rng.permutation(p)
    perm = [(s, int(d)) for s, d in zip(range(p), dsts) if rng.random() < 0.8]  # fixed points too
    for length in sorted({1, 2, 3, p + 1, 97, 1000}):
      for chunks in (None, 1, 4):
        check(plan("ppermute", 4 * length, topology, perm=perm, itemsize=4, chunks=chunks))


@pytest.mark.parametrize("rows, perm, message", [
    ([(0, 0, 1, 0, 3, 3, COPY)], ((0, 1), (1, 0)),
     r"rank 0: element 3 is undefined at the end; no transfer writes it"),
    ([(0, 1, 2, 0, 3, 3, COPY)], ((0, 2),), r"step 0, transfer #0 \(1->2 copy \[0, 3\) -> "
     r"\[3, 6\)\): rank 2: element 3 holds rank \{1\} instead of rank \{0\}"),
    ([(0, 0, 1, 0, 3, 3, COPY), (0, 0, 2, 0, 3, 3, COPY)], ((0, 1),),
     r"transfer #1 .*: rank 2: element 3 holds data of rank \{0\} but no pair of the perm sends "
     r"to rank 2"),
    ([(0, 0, 1, 0, 4, 2, COPY), (1, 0, 1, 2, 3, 1, COPY)], ((0, 1),),
     r"step 1, .*: rank 1: element 3 holds element 2 \(misplaced\)"),
    # In place: rank 0 would send [0, 3) while rank 1's input overwrites it in the same step.
    ([(0, 0, 1, 0, 0, 3, COPY), (0, 1, 0, 0, 0, 3, COPY)], ((0, 1), (1, 0)),
     r"rank 0: sends \[0, 3\) while transfer #1 writes \[0, 3\) into it in the same step"),
])
def test_broken_ppermute_schedules(rows, perm, message):
  with pytest.raises(ScheduleError, match=message):
    check(build("ppermute", 3, 6, rows, perm=perm))


@pytest.mark.parametrize("collective, length, perm, message", [
    ("ppermute", 5, (), r"ppermute needs an even length \(the input half and the output half\), "
     r"got length 5"),
    ("ppermute", 6, ((0, 1), (1, 1)), r"perm \(\(0, 1\), \(1, 1\)\) names a rank twice"),
    ("ppermute", 6, ((0, 3),), r"rank 3 in perm is outside the axis of size 3"),
    ("ppermute", 6, ((1, 1),), r"perm pair \(1, 1\) sends rank 1 to itself; leave it out"),
    ("all_gather", 6, ((0, 1),), r"perm is for ppermute only"),
])
def test_bad_ppermute_attributes(collective, length, perm, message):
  with pytest.raises(ScheduleError, match=message):
    check(build(collective, 3, length, [], perm=perm))
