"""jaxcc.sim.simulate: the port model, the dataflow dependencies and optcc.md §7's numbers."""

import importlib

import numpy as np
import pytest

from jaxcc._src import ffi
from jaxcc.planner import ALGORITHMS, plan
from jaxcc.schedules.ir import COPY, REDUCE
from jaxcc.schedules.optcc import optcc
from jaxcc.sim import ScheduleError, SimResult, simulate
from jaxcc.sim.bounds import fault_free_ring_time, lower_bound
from jaxcc.topology import Topology

from . import build, chain_broadcast, direct, four_stage, ring_all_reduce

simulate_module = importlib.import_module("jaxcc.sim.simulate")  # The name is the function.


def straggler(p, b, bandwidth=1.0, latency=0.0):
  return Topology.uniform(p, bandwidth, latency, message_cost=0.0).with_straggler(p - 1, b)


def test_single_message_is_store_and_forward():
  topology = Topology((2.0, 8.0), (5.0, 4.0), (0.5, 0.25), message_cost=0.0)
  result = simulate(build("broadcast", 2, 10, [(0, 0, 1, 0, 0, 10, COPY)], itemsize=3),
                    topology)
  assert isinstance(result, SimResult)
  assert result.time == pytest.approx(30 / 2 + 30 / 4 + 0.5)
  np.testing.assert_allclose(result.tx_busy, [15, 0])
  np.testing.assert_allclose(result.rx_busy, [0, 7.5])
  np.testing.assert_allclose(result.bytes_sent, [30, 0])
  np.testing.assert_allclose(result.bytes_received, [0, 30])
  assert result.num_messages == 1
  blocking = simulate(build("broadcast", 2, 10, [(0, 0, 1, 0, 0, 10, COPY)]), topology,
                      port_blocking_latency=True)
  assert blocking.time == pytest.approx(10 / 2 + 10 / 4 + 0.5)
  np.testing.assert_allclose(blocking.rx_busy, [0, 10 / 4 + 0.5])


def test_a_message_holds_each_port_for_its_rank_message_cost():
  topology = Topology((2.0, 8.0), (5.0, 4.0), (0.5, 0.25), message_cost=(1.0, 3.0))
  one = [(0, 0, 1, 0, 0, 10, COPY)]
  result = simulate(build("broadcast", 2, 10, one, itemsize=3), topology)
  assert result.time == pytest.approx(1.0 + 30 / 2 + 3.0 + 30 / 4 + 0.5)
  np.testing.assert_allclose(result.tx_busy, [16, 0])
  np.testing.assert_allclose(result.rx_busy, [0, 10.5])
  # Two pieces instead of one: each pays its message costs; the second's send overlaps the
  # first's receive.
  two = [(0, 0, 1, 0, 0, 5, COPY), (1, 0, 1, 5, 5, 5, COPY)]
  result = simulate(build("broadcast", 2, 10, two, itemsize=3), topology)
  assert result.time == pytest.approx(2 * (1.0 + 15 / 2) + 3.0 + 15 / 4 + 0.5)
  np.testing.assert_allclose(result.tx_busy, [17, 0])
  np.testing.assert_allclose(result.rx_busy, [0, 13.5])


def test_empty_schedule():
  result = simulate(build("all_reduce", 3, 4, []), Topology.uniform(3, 1.0))
  assert result.time == 0.0 and result.num_messages == 0
  np.testing.assert_array_equal(result.tx_busy, np.zeros(3))


def test_topology_size_must_match():
  with pytest.raises(ValueError,
                     match="^jaxcc.sim.simulate: topology has 2 ranks but the schedule has 3"):
    simulate(build("all_reduce", 3, 4, []), Topology.uniform(2, 1.0))


def test_broken_schedules_are_rejected_naming_simulate():
  with pytest.raises(ScheduleError, match=r"^jaxcc.sim.simulate: hand broadcast schedule "
                     r"\(nranks=2, length=4\): step 0, transfer #0 .*: rank 0: sends to itself"):
    simulate(build("broadcast", 2, 4, [(0, 0, 0, 0, 0, 4, COPY)]), Topology.uniform(2, 1.0))


def test_latency_blocks_the_receive_port_only_when_asked():
  # Two messages into rank 2: the second waits for the rx port.
  schedule = build("all_gather", 3, 3, [(0, 0, 2, 0, 0, 1, COPY), (0, 1, 2, 1, 1, 1, COPY)])
  topology = Topology.uniform(3, 1.0, latency=10.0, message_cost=0.0)
  assert simulate(schedule, topology).time == pytest.approx(1 + 2 + 10)
  assert simulate(schedule, topology, port_blocking_latency=True).time == pytest.approx(
      1 + 2 * (1 + 10))


def test_priority_is_step_then_row():
  # Rank 0 has a 2-element message of step 0 and a 1-element message of step 1, both ready.
  schedule = build("broadcast", 3, 3, [(1, 0, 2, 2, 2, 1, COPY), (0, 0, 1, 0, 0, 2, COPY)])
  fluid = Topology.uniform(3, 1.0, message_cost=0.0)
  assert simulate(schedule, fluid).time == pytest.approx(4)  # Else 5.
  schedule = build("broadcast", 3, 3, [(0, 0, 1, 0, 0, 2, COPY), (0, 0, 2, 2, 2, 1, COPY)])
  assert simulate(schedule, fluid).time == pytest.approx(4)
  schedule = build("broadcast", 3, 3, [(0, 0, 2, 2, 2, 1, COPY), (0, 0, 1, 0, 0, 2, COPY)])
  assert simulate(schedule, fluid).time == pytest.approx(5)


def test_ports_are_work_conserving():
  # Rank 0's step-1 send waits for data; its step-2 send goes first.
  rows = [(0, 1, 0, 0, 0, 1, COPY), (1, 0, 2, 0, 0, 1, COPY), (2, 0, 3, 1, 1, 3, COPY)]
  result = simulate(build("broadcast", 4, 4, rows, root=1),
                    Topology.uniform(4, 1.0, message_cost=0.0))
  # 0->3 holds the tx port over [0, 3]; 0->2 is ready at 2, sent over [3, 4], received at 5.
  assert result.time == pytest.approx(6)  # 0->3 is received over [3, 6].


def test_read_after_write_and_dataflow_overlap():
  # Chain 0 -> 1 -> 2 on [0, 1) (2.5 per hop) overlaps an independent 3 -> 4 on [1, 4) of
  # step 1, which starts at once: 6.5 in all, where step after step takes 2.5 + 6.5.
  rows = [(0, 0, 1, 0, 0, 1, COPY), (1, 1, 2, 0, 0, 1, COPY), (1, 3, 4, 1, 1, 3, COPY)]
  topology = Topology.uniform(5, 1.0, latency=0.5, message_cost=0.0)
  assert simulate(build("broadcast", 5, 4, rows), topology).time == pytest.approx(6.5)


def test_write_after_write():
  # Rank 0 gets [0, 4) from rank 1 (slow) then [0, 1) from rank 2 (step 1), then sends [0, 1).
  rows = [(0, 1, 0, 0, 0, 4, COPY), (1, 2, 0, 0, 0, 1, COPY), (2, 0, 3, 0, 0, 1, COPY)]
  result = simulate(build("broadcast", 4, 4, rows, root=1),
                    Topology.uniform(4, 1.0, message_cost=0.0))
  assert result.time == pytest.approx(10)  # 2->0 lands at 2 but applies after 1->0 at 8.


def test_write_after_read():
  # Rank 0 sends [0, 2) at step 1 once [1, 2) arrives from the slow rank 1 (at 11); rank 3's
  # write of [0, 1) at step 2 lands at 2 but must wait until that send has left (13). Only
  # then can rank 0 forward [0, 1) (step 3) and rank 4 pass it on (step 4): done at 17, not 15.
  rows = [(0, 1, 0, 1, 1, 1, COPY), (1, 0, 2, 0, 0, 2, COPY), (2, 3, 0, 0, 0, 1, COPY),
          (3, 0, 4, 0, 0, 1, COPY), (4, 4, 5, 0, 0, 1, COPY)]
  topology = Topology.from_bandwidths([1, 0.1, 1, 1, 1, 1], recv_bandwidths=[1] * 6,
                                      message_cost=0.0)
  assert simulate(build("broadcast", 6, 2, rows), topology).time == pytest.approx(17)


def test_reduce_group_applies_at_its_last_delivery():
  rows = [(0, 1, 0, 0, 0, 1, REDUCE), (0, 2, 0, 0, 0, 1, REDUCE), (1, 0, 3, 0, 0, 1, COPY)]
  topology = Topology((1.0,) * 4, (1.0,) * 4, (0.0, 0.0, 3.0, 0.0), message_cost=0.0)
  # 1->0 delivered at 2, 2->0 at 3 + 3 = 6 (rx after 1->0); 0->3 then takes 2.
  assert simulate(build("all_reduce", 4, 1, rows), topology).time == pytest.approx(8)


def test_dependency_graph():
  # Step 0: 0 sends [0, 2) to 1 and [2, 4) to 2. Step 1: 3 writes [1, 3) into 0.
  # Step 2: 0 sends [0, 4) to 1.
  rows = [(0, 0, 1, 0, 0, 2, COPY), (0, 0, 2, 2, 2, 2, COPY), (1, 3, 0, 1, 1, 2, COPY),
          (2, 0, 1, 0, 0, 4, COPY)]
  unit_of, need, raw_need, raw_out, waw_out, war_out = simulate_module._dependencies(
      build("broadcast", 4, 4, rows))
  assert unit_of == [0, 1, 2, 3]
  assert raw_need == [0, 0, 0, 1] and raw_out[2] == [3]  # Read after write.
  assert war_out[0] == [2] and war_out[1] == [2] and war_out[3] == []  # Write after read.
  assert waw_out[0] == [3] and need == [1, 1, 3, 2]  # 0->1 at step 2 overwrites step 0's.


def test_pipelining_helps():
  topology = straggler(4, 0.5)
  one = simulate(ring_all_reduce(4, chunks=1, piece=8), topology).time
  eight = simulate(ring_all_reduce(4, chunks=8, piece=1), topology).time
  assert eight < one


def test_pipelined_ring_approaches_t_ff_over_b():
  p, b = 8, 0.5
  target = fault_free_ring_time(1.0, p, 1.0) / b
  ratios = []
  for chunks in (1, 4, 16, 64):
    schedule = ring_all_reduce(p, chunks)
    ratios.append(simulate(schedule, straggler(p, b)).time / schedule.nbytes / target)
  assert all(a > c for a, c in zip(ratios, ratios[1:]))
  assert 1 <= ratios[-1] < 1.005


def test_chain_broadcast_pipelines():
  p, chunks = 6, 16
  result = simulate(chain_broadcast(p, 16, chunks=chunks),
                    Topology.uniform(p, 1.0, message_cost=0.0))
  # The first chunk takes p - 1 hops of tx + rx; the others follow at the port rate.
  assert result.time == pytest.approx((p - 1) * 2 + chunks - 1)


# optcc.md §7 "Finite K [sim]", alpha = 0, units of N/B; straggler b at rank p - 1.
RING_K4 = {(8, 0.875): 2.1964, (8, 0.75): 2.5521, (8, 0.5): 3.6250, (16, 0.875): 2.3772,
           (16, 0.75): 2.7396, (16, 0.5): 3.8125, (32, 0.875): 2.4665, (32, 0.75): 2.8281,
           (32, 0.5): 3.9062}
FOUR_STAGE_K32 = {(8, 1.0): 1.8973, (8, 0.875): 1.9018, (8, 0.75): 1.9077, (8, 0.5): 2.0714,
                  (16, 1.0): 1.9688, (16, 0.875): 1.9732, (16, 0.75): 1.9792, (16, 0.5): 2.0667,
                  (32, 1.0): 2.0010, (32, 0.875): 2.0055, (32, 0.75): 2.0114, (32, 0.5): 2.0645}


@pytest.mark.parametrize("p", [8, 16, 32])
def test_optcc_table_ring_k4(p):
  schedule = ring_all_reduce(p, chunks=4)
  for (q, b), expected in RING_K4.items():
    if q == p:
      assert simulate(schedule, straggler(p, b)).time / schedule.nbytes == pytest.approx(
          expected, rel=5e-4)
  # b = 1: every port busy from t = 0, plus the last piece's receive: T_ff + N / (p K).
  # optcc.md's simulator gives 1.8438 / 1.9219 / 1.9609: it starts a port on the first
  # message ready in event order, before equal-time events can ready a higher priority one.
  uniform = simulate(schedule, Topology.uniform(p, 1.0, message_cost=0.0)).time / schedule.nbytes
  assert uniform == pytest.approx(fault_free_ring_time(1.0, p, 1.0) + 1 / (4 * p))


@pytest.mark.parametrize("p", [8, 16, 32])
def test_optcc_table_four_stage_k32(p):
  schedule = four_stage(p, chunks=32)
  for (q, b), expected in FOUR_STAGE_K32.items():
    if q == p:
      time = simulate(schedule, straggler(p, b)).time / schedule.nbytes
      assert time == pytest.approx(expected, rel=5e-3)
      bound = lower_bound("all_reduce", schedule.nbytes, straggler(p, b))
      assert time >= bound / schedule.nbytes


def test_optcc_table_four_stage_convergence_in_k():
  # p = 16, overhead over T_ff for b = 0.875 / 0.75 / 0.5.
  t_ff = fault_free_ring_time(1.0, 16, 1.0)
  for chunks, overheads in {8: (0.116, 0.129, 0.209), 128: (0.036, 0.037, 0.076)}.items():
    schedule = four_stage(16, chunks)
    for b, overhead in zip((0.875, 0.75, 0.5), overheads):
      time = simulate(schedule, straggler(16, b)).time / schedule.nbytes
      assert time == pytest.approx(t_ff * (1 + overhead), rel=5e-3)


def test_optcc_absolute_example_ring_k16():
  # p = 16, N = 256 MiB, B = 50 GB/s, alpha = 5 us of pure latency; times in ms.
  nbytes = 256 << 20
  schedule = ring_all_reduce(16, chunks=16, itemsize=nbytes // 256)
  for b, expected in {1.0: 10.85, 0.875: 11.93, 0.75: 13.83, 0.5: 20.35}.items():
    topology = straggler(16, b, bandwidth=50e9, latency=5e-6)
    assert simulate(schedule, topology).time * 1e3 == pytest.approx(expected, abs=0.006)
  # The same latency blocking the port, ring K = 4 at b = 0.5: +109.3% over T_ff.
  schedule = ring_all_reduce(16, chunks=4, itemsize=nbytes // 64)
  time = simulate(schedule, straggler(16, 0.5, 50e9, 5e-6), port_blocking_latency=True).time
  assert time / fault_free_ring_time(nbytes, 16, 50e9) - 1 == pytest.approx(1.093, abs=5e-4)


@pytest.mark.parametrize("topology", [
    Topology.uniform(6, 3.0, latency=0.1, message_cost=0.05),
    Topology.from_bandwidths([1, 2, 3, 4, 5, 6], latency=0.01, message_cost=0.0),
    Topology.from_bandwidths([4, 4, 4, 4, 4, 4], recv_bandwidths=[1, 8, 8, 8, 8, 2],
                             message_cost=[0.3, 0, 0, 0.1, 0, 0.2]),
])
def test_never_below_the_lower_bound(topology):
  for schedule in (ring_all_reduce(6, chunks=4), direct("all_reduce", 6, shard=4),
                   four_stage(6, chunks=8)):
    assert simulate(schedule, topology).time >= lower_bound(
        "all_reduce", schedule.nbytes, topology) * (1 - 1e-12)
  for collective in ("reduce_scatter", "all_gather"):
    schedule = direct(collective, 6, shard=4)
    assert simulate(schedule, topology).time >= lower_bound(collective, 24, topology)
  for root in (0, 5):
    schedule = chain_broadcast(6, 24, root=root, chunks=6)
    assert simulate(schedule, topology).time >= lower_bound(
        "broadcast", 24, topology, root=root)


@pytest.mark.parametrize("p", [2, 3, 8])
def test_plan_schedules_never_beat_the_bound(p):
  topologies = (straggler(p, 0.5, 1e9, 1e-6),
                Topology.from_bandwidths([1e9] * p, 5e-6, [1e9] * (p - 1) + [2e8]))
  for topology in topologies:
    for collective, names in ALGORITHMS.items():
      # A shift by one into the straggler p - 1; rank 0 receives nothing.
      kw = {"perm": [(i, i + 1) for i in range(p - 1)]} if collective == "ppermute" else {}
      for name in names:
        for nbytes in (4 * p, (1 << 20) * p):
          schedule = plan(collective, nbytes, topology, name, **kw)
          bound = lower_bound(collective, nbytes, topology, **kw)
          for blocking in (False, True):
            assert simulate(schedule, topology, port_blocking_latency=blocking).time >= bound


# --- the CPU module's simulate against the Python one ------------------------------------------

@pytest.fixture
def both_paths(monkeypatch):
  """``simulate`` through the CPU module and through Python, checked equal in every field."""
  assert ffi.cpu_module_or_none() is not None, "the CPU module is not built (make install)"

  def run(schedule, topology, port_blocking_latency=False):
    native = simulate(schedule, topology, port_blocking_latency=port_blocking_latency)
    with monkeypatch.context() as m:
      m.setattr(ffi, "cpu_module_or_none", lambda: None)
      python = simulate(schedule, topology, port_blocking_latency=port_blocking_latency)
    assert native.time == python.time, (schedule.algorithm, native.time, python.time)
    for name in SimResult._fields:
      np.testing.assert_array_equal(getattr(native, name), getattr(python, name), err_msg=name)
    return native

  return run


def topologies(p):
  """Flat with a straggler and latency, and clusters (with ranks that relay) of p >= 2 ranks."""
  sizes = [p // 2, p - p // 2]
  inter = [1e9 if r % 2 == 0 else 0.0 for r in range(p)]  # odd ranks relay through even ones
  inter[sizes[0]] = 5e8  # every cluster has a border rank
  out = [Topology.from_bandwidths([3e9] * (p - 1) + [1e9], 2e-6, [2e9] + [3e9] * (p - 1),
                                  [1e-6 * (r % 3) for r in range(p)]).with_straggler(0, 0.75),
         Topology.clusters(sizes, [4e9, 2e9], inter, latency=1e-6, inter_latency=5e-6,
                           message_cost=2e-7)]
  if p >= 3:
    out.append(Topology.clusters([1, p - 2, 1], 4e9, 1e9, latency=3e-7).with_straggler(
        p - 1, 0.5, level="inter"))
  return out


@pytest.mark.parametrize("p", range(2, 10))
def test_native_equals_python_on_plans(both_paths, p):
  kw = {"ppermute": {"perm": [(i, (i + 3) % p) for i in range(p)]}}
  for topology in topologies(p):
    for collective, names in ALGORITHMS.items():
      # reduce_scatter and all_gather need length divisible by p.
      length = (2 * p + 1) * (p if collective in ("reduce_scatter", "all_gather") else 1)
      for name in names:
        for chunks in (1, 3, 8):
          schedule = plan(collective, 4 * length, topology, name, chunks=chunks,
                          root=p // 2, **kw.get(collective, {}))
          for blocking in (False, True):
            both_paths(schedule, topology, port_blocking_latency=blocking)


def random_schedule(rng, p, length, steps):
  """A valid all_reduce table of random copies and reduces (Schedule.validate's rules)."""

  def overlaps(ranges, lo, hi):
    return any(lo < b and a < hi for a, b in ranges)

  rows = []
  for step in range(steps):
    writes = {}  # dst -> [(lo, hi)] written in this step
    reads = {}   # src -> [(lo, hi)] sent in this step
    groups = {}  # dst -> the reduce range
    pairs = set()
    for _ in range(int(rng.integers(1, 3 * p))):
      src, dst = (int(r) for r in rng.choice(p, 2, replace=False))
      op = REDUCE if rng.random() < 0.4 else COPY
      if op == REDUCE and dst in groups:  # the group's range
        lo, n = groups[dst][0], groups[dst][1] - groups[dst][0]
      else:
        n = int(rng.integers(1, length + 1))
        lo = int(rng.integers(0, length - n + 1))
      src_lo = int(rng.integers(0, length - n + 1))
      new_write = not (op == REDUCE and dst in groups)
      if ((src, dst) in pairs or (new_write and overlaps(writes.get(dst, []), lo, lo + n))
          or overlaps(reads.get(dst, []), lo, lo + n)
          or overlaps(writes.get(src, []), src_lo, src_lo + n)):
        continue
      pairs.add((src, dst))
      if new_write:
        writes.setdefault(dst, []).append((lo, lo + n))
      if op == REDUCE:
        groups[dst] = (lo, lo + n)
      reads.setdefault(src, []).append((src_lo, src_lo + n))
      rows.append((step, src, dst, src_lo, lo, n, op))
  return build("all_reduce", p, length, rows, itemsize=int(rng.integers(1, 9)))


def random_topology(rng, p):
  send, recv = rng.uniform(1.0, 4.0, p), rng.uniform(1.0, 4.0, p)
  latency = rng.choice([0.0, 0.1, 0.37], p)
  cost = tuple(rng.choice([0.0, 0.05, 0.2], p))
  if p < 2 or rng.random() < 0.4:
    return Topology(tuple(send), tuple(recv), tuple(latency), message_cost=cost)
  cut = int(rng.integers(1, p))
  cluster = tuple([0] * cut + [1] * (p - cut))
  inter = np.where(rng.random(p) < 0.5, rng.uniform(0.2, 1.0, p), 0.0)
  inter[0] = inter[cut] = 0.5  # a border rank in each cluster
  return Topology(tuple(send), tuple(recv), tuple(latency), cluster, tuple(inter), tuple(inter),
                  tuple(rng.choice([0.0, 0.5, 1.25], p)), cost)


def test_native_equals_python_on_large_schedules(both_paths):
  # Large enough for the CPU module to share the work between two threads.
  flat = straggler(32, 0.5, 25e9, 1e-6)
  relays = Topology.clusters([12, 12], 25e9, [2.5e9 if r % 3 == 0 else 0.0 for r in range(24)],
                             latency=1e-6, inter_latency=4e-6, message_cost=1e-6)
  rng = np.random.default_rng(3)
  cases = ((plan("all_reduce", 1 << 26, flat, "optcc"), flat),
           (plan("all_reduce", 1 << 24, relays, "hierarchical", chunks=64), relays),
           (random_schedule(rng, 24, 64, 1400), random_topology(rng, 24)))
  for schedule, topology in cases:
    assert len(schedule.table) >= 1 << 14
    both_paths(schedule, topology, port_blocking_latency=topology is flat)


def test_native_equals_python_on_random_schedules(both_paths):
  rng = np.random.default_rng(7)
  for _ in range(400):
    p = int(rng.integers(2, 9))
    schedule = random_schedule(rng, p, int(rng.integers(1, 24)), int(rng.integers(1, 20)))
    topology = random_topology(rng, p)
    both_paths(schedule, topology, port_blocking_latency=bool(rng.random() < 0.5))


def test_native_rejects_inconsistent_input():
  native = ffi.cpu_module_or_none()
  schedule = ring_all_reduce(4)
  topology = Topology.uniform(4, 1.0, message_cost=0.0)
  ports = simulate_module._ports(topology)
  args = (schedule.table, 1.0, 4, schedule.length, schedule.num_steps)
  assert native.simulate(*args, *ports, False)[0] == simulate(schedule, topology).time
  with pytest.raises(ValueError, match="the table must be sorted by step"):
    native.simulate(schedule.table[::-1], *args[1:], *ports, False)
  with pytest.raises(ValueError, match="rank outside"):
    native.simulate(schedule.table, 1.0, 3, *args[3:], *ports, False)
  with pytest.raises(ValueError, match="range outside the buffer"):
    native.simulate(schedule.table, 1.0, 4, 2, schedule.num_steps, *ports, False)
  with pytest.raises(ValueError, match="columns"):
    native.simulate(schedule.table[:, :6], *args[1:], *ports, False)
  with pytest.raises(ValueError, match="per-rank ports"):
    native.simulate(*args, ports[0][:3], *ports[1:], False)
  with pytest.raises(ValueError, match="finite bandwidths"):
    native.simulate(*args, ports[0] * 0, *ports[1:], False)
  with pytest.raises(ValueError, match="finite message cost"):
    native.simulate(*args, *ports[:3], ports[3] - 1, *ports[4:], False)
  clusters = simulate_module._ports(Topology.clusters([2, 2], 1.0, [1.0, 0.0, 1.0, 0.0]))[4]
  with pytest.raises(ValueError, match="relay"):
    native.simulate(*args, *ports[:4], (clusters[0], clusters[1] + 1, *clusters[2:]), False)


@pytest.mark.parametrize("stragglers", [((1, 0.5),), ((1, 0.5), (32, 0.75)),
                                        ((1, 0.5), (32, 0.75), (63, 0.3))])
def test_optcc_with_a_leaf_is_within_one_percent_of_the_bound(stragglers):
  """p = 64, 16 chunks, fluid: a leaf (0.5, or 0.3), with or without a slower owner (0.75)."""
  topology = Topology.uniform(64, 1.0, message_cost=0.0)
  for rank, fraction in stragglers:
    topology = topology.with_straggler(rank, fraction)
  schedule = optcc(64 * 4099, 64, 4, 16, topology.send_bandwidth)
  bound = lower_bound("all_reduce", schedule.nbytes, topology)
  assert simulate(schedule, topology).time / bound < 1.01
