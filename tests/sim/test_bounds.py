"""jaxcc.sim.lower_bound: the closed forms of optcc.md §2 and §7."""

import pytest

from jaxcc.schedules.ir import COPY, REDUCE
from jaxcc.sim import check, lower_bound, simulate
from jaxcc.sim.bounds import fault_free_ring_time
from jaxcc.topology import Topology

from . import build


def straggler(p, b, latency=0.0):
  return Topology.uniform(p, 1.0, latency).with_straggler(p - 1, b)


# optcc.md §7 "Finite K" LB column, units of N / B.
LB = {(8, 1.0): 1.7500, (8, 0.875): 1.7778, (8, 0.75): 1.8065, (8, 0.5): 2.0000,
      (16, 1.0): 1.8750, (16, 0.875): 1.8898, (16, 0.75): 1.9048, (16, 0.5): 2.0000,
      (32, 1.0): 1.9375, (32, 0.875): 1.9451, (32, 0.75): 1.9528, (32, 0.5): 2.0000}


@pytest.mark.parametrize("p,b", sorted(LB))
def test_all_reduce_matches_optcc_table(p, b):
  assert lower_bound("all_reduce", 1000, straggler(p, b)) / 1000 == pytest.approx(
      LB[p, b], abs=5e-5)
  assert lower_bound("all_reduce", 1000, straggler(p, b)) / 1000 == pytest.approx(
      max(1 / b, 2 * (p - 1) / (p - 1 + b)))


@pytest.mark.parametrize("p,b,overhead", [(8, 0.875, 0.016), (8, 0.5, 0.143), (16, 0.5, 0.067),
                                          (32, 0.75, 0.008), (64, 0.5, 0.016), (128, 0.5, 0.008)])
def test_all_reduce_fluid_overhead(p, b, overhead):
  ratio = lower_bound("all_reduce", 64, straggler(p, b)) / fault_free_ring_time(64, p, 1.0)
  assert ratio - 1 == pytest.approx(overhead, abs=5e-4)


def test_all_reduce_latency_and_separate_ports():
  topology = Topology((4.0, 2.0, 4.0), (1.0, 4.0, 4.0), (0.3, 0.1, 0.2), message_cost=0.0)
  # N / min R = 8 / 1 dominates; alpha_min = min over pairs of max(lat_i, lat_j) = 0.2.
  assert lower_bound("all_reduce", 8, topology) == pytest.approx(8 + 0.2)
  topology = Topology.from_bandwidths([4.0] * 4, recv_bandwidths=[1.0, 1.0, 1.0, 1.0])
  assert lower_bound("all_reduce", 8, topology) == pytest.approx(2 * 3 * 8 / 4)
  assert lower_bound("all_reduce", 8, Topology.uniform(1, 1.0, latency=1.0)) == 0.0
  assert lower_bound("all_reduce", 0, Topology.uniform(4, 1.0, latency=1.0)) == 0.0


def test_all_reduce_latency_hides_in_the_pipeline():
  # Direct all_reduce on 2 ranks in K = 64 chunks of one element per rank, latency 4: the
  # second hop overlaps the first, so the bound is N / B + alpha (+ 2 alpha is too much).
  chunks, topology = 64, Topology.uniform(2, 1.0, latency=4.0, message_cost=0.0)
  rows = []
  for c in range(chunks):
    a, b = 2 * c, 2 * c + 1  # Rank 0 owns element a, rank 1 element b of chunk c.
    rows += [(a, 1, 0, a, a, 1, REDUCE), (a, 0, 1, b, b, 1, REDUCE),
             (b, 0, 1, a, a, 1, COPY), (b, 1, 0, b, b, 1, COPY)]
  schedule = build("all_reduce", 2, 2 * chunks, rows)
  check(schedule)
  time = simulate(schedule, topology).time
  assert lower_bound("all_reduce", 2 * chunks, topology) == 2 * chunks + 4.0
  assert 2 * chunks + 4.0 < time < 2 * chunks + 2 * 4.0
  # With little data, two hops (a rank can't send and receive a range in one step): 2 alpha.
  assert lower_bound("all_reduce", 1, Topology.uniform(2, 1.0, 4.0, message_cost=0.0)) == 8.0


def test_message_costs_hold_each_port_once_and_two_hops_twice():
  cost = 0.5
  topology = Topology((4.0, 2.0, 4.0), (1.0, 4.0, 4.0), (0.3, 0.1, 0.2), message_cost=cost)
  # Rank 0 receives N = 8 bytes at 1 byte/s in at least one message, then alpha_min 0.2.
  assert lower_bound("all_reduce", 8, topology) == pytest.approx(8 + cost + 0.2)
  # With little data: two hops, each through a send and a receive port.
  two = Topology.uniform(2, 1.0, latency=4.0, message_cost=cost)
  assert lower_bound("all_reduce", 1, two) == pytest.approx(2 * (4.0 + 2 * cost))
  perm = [(1, 2)]
  assert lower_bound("ppermute", 8, topology, perm=perm) == pytest.approx(8 / 2 + 2 * cost + 0.2)
  # Each rank's own cost, on the side it moves bytes: rank 1 sends 8 bytes at 1 byte/s as
  # the root, or receives them at 4.
  costs = Topology.from_bandwidths([1.0] * 3, recv_bandwidths=[4.0] * 3,
                                   message_cost=[0.0, 9.0, 0.5])
  assert lower_bound("broadcast", 8, costs, root=1) == pytest.approx(8 + 9.0)
  assert lower_bound("broadcast", 8, costs, root=0) == pytest.approx(8 / 4 + 9.0)


def test_reduce_scatter_slow_receiver_needs_only_its_shard():
  # Rank 0 receives nothing but its reduced shard: N / p, not (p - 1) N / p.
  rows = [(0, 2, 1, 0, 0, 1, REDUCE), (0, 0, 2, 2, 2, 1, REDUCE), (1, 0, 1, 1, 1, 1, REDUCE),
          (1, 1, 2, 2, 2, 1, REDUCE), (2, 1, 0, 0, 0, 1, REDUCE), (2, 2, 1, 1, 1, 1, REDUCE)]
  schedule = build("reduce_scatter", 3, 3, rows)
  check(schedule)
  topology = Topology.from_bandwidths([1.0] * 3, recv_bandwidths=[0.01, 1.0, 1.0],
                                      message_cost=0.0)
  assert lower_bound("reduce_scatter", 3, topology) == pytest.approx(1 / 0.01)
  assert simulate(schedule, topology).time == pytest.approx(103)  # < (p - 1) N / (p R_0).


def test_reduce_scatter_and_all_gather():
  p, n = 8, 800
  # Uniform: each rank sends and receives (p - 1) / p * N.
  for collective in ("reduce_scatter", "all_gather"):
    assert lower_bound(collective, n, Topology.uniform(p, 2.0, latency=0.5)) == pytest.approx(
        (p - 1) * n / p / 2.0 + 0.5)
  # A rank that receives slowly only needs its own shard in a reduce_scatter...
  slow_in = Topology.from_bandwidths([1.0] * p, recv_bandwidths=[0.1] + [1.0] * (p - 1))
  assert lower_bound("reduce_scatter", n, slow_in) == pytest.approx(
      max(n / p / 0.1, (p - 1) * n / p))
  # ...but every other shard in an all_gather.
  assert lower_bound("all_gather", n, slow_in) == pytest.approx((p - 1) * n / p / 0.1)


def test_broadcast():
  topology = Topology.from_bandwidths([1.0, 2.0, 4.0, 4.0], latency=0.25, message_cost=0.0)
  assert lower_bound("broadcast", 8, topology) == pytest.approx(8 / 1.0 + 0.25)
  assert lower_bound("broadcast", 8, topology, root=2) == pytest.approx(8 / 1.0 + 0.25)
  # Slow senders: (p - 1) N element transfers through sum(S) of send capacity.
  topology = Topology.from_bandwidths([8.0, 0.5, 0.5, 0.5], recv_bandwidths=[8.0] * 4)
  assert lower_bound("broadcast", 8, topology) == pytest.approx(3 * 8 / 9.5)


def test_fault_free_ring_time():
  assert fault_free_ring_time(800, 8, 2.0) == pytest.approx(2 * 7 / 8 * 400)
  assert fault_free_ring_time(800, 1, 2.0) == 0.0


@pytest.mark.parametrize("args,kwargs,message", [
    (("all_to_all", 8), {}, "^jaxcc.sim.lower_bound: collective must be one of"),
    (("all_reduce", -1), {}, "nbytes must be a finite number >= 0, got -1"),
    (("all_reduce", float("nan")), {}, "nbytes must be a finite number >= 0"),
    (("broadcast", 8), {"root": 4}, r"root must be a rank in \[0, 4\), got 4"),
    (("ppermute", 8), {},
     r"^jaxcc.sim.lower_bound: perm must be a sequence of \(src, dst\) pairs, got None"),
    (("ppermute", 8), {"perm": [(0, 4)]}, r"rank 4 in perm is outside the axis of size 4"),
    (("all_reduce", 8), {"perm": [(0, 1)]}, r"perm is for ppermute only, not 'all_reduce'"),
])
def test_bad_arguments(args, kwargs, message):
  with pytest.raises(ValueError, match=message):
    lower_bound(*args, Topology.uniform(4, 1.0), **kwargs)


def test_ppermute_is_bound_by_its_slowest_pair():
  topology = Topology((4.0, 2.0, 4.0, 4.0), (4.0, 4.0, 1.0, 4.0), (0.1, 0.3, 0.2, 0.1),
                      message_cost=0.0)
  # Pair (1, 2): N / min(S_1, R_2) = 8 / 1 plus max(0.3, 0.2); the fixed point (3, 3) is free.
  perm = [(0, 1), (1, 2), (3, 3)]
  assert lower_bound("ppermute", 8, topology, perm=perm) == pytest.approx(8 / 1.0 + 0.3)
  assert lower_bound("ppermute", 8, topology, perm=[(2, 0)]) == pytest.approx(8 / 4.0 + 0.2)
  assert lower_bound("ppermute", 8, topology, perm=[(3, 3)]) == 0.0
  assert lower_bound("ppermute", 8, topology, perm=[]) == 0.0
  moves = perm[:2]
  schedule = build("ppermute", 4, 16, [(0, s, d, 0, 8, 8, COPY) for s, d in moves], perm=moves)
  check(schedule)
  assert simulate(schedule, topology).time >= lower_bound("ppermute", 8, topology, perm=perm)
