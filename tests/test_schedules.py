"""Schedules: the algorithms' volumes and steps, the planner, the IR's serialisation."""

import numpy as np
import pytest

import jaxcc
from jaxcc import Topology, plan, planner
from jaxcc.planner import ALGORITHMS, auto_algorithm, schedule
from jaxcc.schedules import COPY, REDUCE, ScheduleError, depth_limit, optimal_shares
from jaxcc.schedules import optcc as optcc_module
from jaxcc.schedules.depth import MAX_CHUNKS, MAX_RANK_TRANSFERS
from jaxcc.schedules.ir import DST, HEADER_LEN, SRC, TABLE_MAGIC, TABLE_VERSION, read_table
from jaxcc.sim import check, simulate
from jaxcc.sim import model as sim_model


@pytest.mark.parametrize("p", [2, 3, 5, 8])
def test_ring_and_direct_volumes(p):
  topo = Topology.uniform(p, 1.0)
  n = 4 * p * 6
  for alg in ("ring", "direct"):
    ar = plan("all_reduce", n, topo, alg, chunks=2)
    np.testing.assert_array_equal(ar.bytes_sent(), 2 * (p - 1) * n // p)
    np.testing.assert_array_equal(ar.bytes_received(), 2 * (p - 1) * n // p)
    for coll in ("reduce_scatter", "all_gather"):
      s = plan(coll, n, topo, alg, chunks=2)
      np.testing.assert_array_equal(s.bytes_sent(), (p - 1) * n // p)
  assert plan("all_reduce", n, topo, "ring", chunks=3).num_steps == 3 * 2 * (p - 1)
  assert plan("all_reduce", n, topo, "direct", chunks=3).num_steps == 3 * 2


@pytest.mark.parametrize("p, b, expected", [  # research/optcc.md §5 table
    (8, 0.875, 0.0926), (8, 0.75, 0.0591), (8, 0.5, 0.0), (16, 0.875, 0.0467),
    (16, 0.75, 0.0306), (32, 0.875, 0.0234), (32, 0.75, 0.0155), (32, 0.5, 0.0)])
def test_optimal_shares_match_closed_form(p, b, expected):
  w = optimal_shares(Topology.uniform(p, 1.0).with_straggler(0, b).bandwidth)
  assert w.sum() == pytest.approx(1.0)
  assert w[0] == pytest.approx(expected, abs=5e-5)
  np.testing.assert_allclose(w[1:], w[1])


def test_optcc_volumes_balance_ports():
  p, b, n = 8, 0.75, 8 << 20
  topo = Topology.uniform(p, 1.0).with_straggler(3, b)
  s = plan("all_reduce", n, topo, "optcc", itemsize=1)
  w = optimal_shares(topo.bandwidth) * n
  np.testing.assert_allclose(s.bytes_sent(), n + (p - 2) * w, rtol=1e-5)
  np.testing.assert_allclose(s.bytes_received(), n + (p - 2) * w, rtol=1e-5)
  busy = s.bytes_sent() / np.array(topo.bandwidth)
  np.testing.assert_allclose(busy, busy.max(), rtol=1e-5)  # every port busy equally long


def test_optcc_straggler_below_threshold_only_scatters_and_gathers():
  p, n = 16, 1 << 20
  topo = Topology.uniform(p, 1.0).with_straggler(5, 0.5)
  s = plan("all_reduce", n, topo, "optcc", itemsize=1)
  assert s.bytes_sent()[5] == n and s.bytes_received()[5] == n
  assert s.chunks == planner.depth("all_reduce", n, 1, topo, "optcc")


def test_r2ccl_volume_model():
  p, b, n = 8, 0.5, 1 << 20
  s = plan("all_reduce", n, Topology.uniform(p, 1.0).with_straggler(0, b), "r2ccl", itemsize=1)
  ring_part = 2 * (p - 1) / p * b * n
  assert s.bytes_sent()[0] == pytest.approx(ring_part + (1 - b) * n, rel=1e-3)
  assert s.bytes_received()[0] == pytest.approx(ring_part + (1 - b) * n, rel=1e-3)


def test_broadcast_algorithms():
  p, n = 5, 1000
  topo = Topology.uniform(p, 1.0)
  direct = plan("broadcast", n, topo, "direct", itemsize=1, root=2)
  assert direct.bytes_sent()[2] == (p - 1) * n and direct.num_steps == 1
  chain = plan("broadcast", n, topo, "ring", itemsize=1, root=2, chunks=4)
  np.testing.assert_array_equal(chain.bytes_received(), [n, n, 0, n, n])
  assert chain.num_steps == 4 + p - 2


def test_depth_limit():
  assert depth_limit("all_reduce", 250, 8) == 16  # pieces of at least one element
  assert depth_limit("all_reduce", 1 << 38, 8) == MAX_CHUNKS
  # A rank's own transfers bound the depth (4 (p-1) per chunk), not the whole table's.
  assert depth_limit("all_reduce", 1 << 38, 64) == 256 <= MAX_RANK_TRANSFERS // (4 * 63)
  assert depth_limit("all_reduce", 1 << 38, 1024) == 16 <= MAX_RANK_TRANSFERS // (4 * 1023)
  assert depth_limit("reduce_scatter", 1 << 38, 1024) == 32
  assert depth_limit("broadcast", 1 << 38, 8) == MAX_CHUNKS
  assert depth_limit("all_reduce", 1 << 26, 4096, rank_transfers=506) == 128


@pytest.mark.parametrize("cost", [0.0, 2e-6, 10e-6])
def test_depth_is_the_modelled_best_and_the_simulated_best_on_8_ranks(cost):
  """The depth of the least modelled time: the limit without message costs, else the
  depth the simulator times fastest among 1 to 64 chunks."""
  topo = Topology.uniform(8, 25e9, message_cost=cost).with_straggler(1, 0.5)
  n = 256 << 20
  for algorithm in ("optcc", "direct", "ring"):
    k = planner.depth("all_reduce", n // 4, 4, topo, algorithm)
    if cost == 0:
      assert k == depth_limit("all_reduce", n // 4, 8) == MAX_CHUNKS
      continue
    times = {c: jaxcc.sim.simulate(plan("all_reduce", n, topo, algorithm, chunks=c), topo).time
             for c in (1, 2, 4, 8, 16, 32, 64)}
    assert k == min(times, key=times.get), (algorithm, k, times)
    assert plan("all_reduce", n, topo, algorithm).chunks == k


def test_table_serialisation_and_transfers():
  s = plan("all_reduce", 4 * 12, Topology.uniform(3, 1.0), "ring", chunks=1)
  assert s.table.dtype == np.int64 and s.table.shape == (12, 7)
  assert not s.table.flags.writeable
  steps = list(s.steps)
  assert len(steps) == s.num_steps == 4
  first = steps[0][0]
  assert first.op in (COPY, REDUCE)
  assert first.src_range[1] - first.src_range[0] == first.length
  assert all(t.op == REDUCE for t in steps[0]) and all(t.op == COPY for t in steps[-1])
  wire = s.serialized
  assert wire.dtype == np.int64 and not wire.flags.writeable
  assert wire[:HEADER_LEN].tolist() == [TABLE_MAGIC, TABLE_VERSION, 7, 12]
  np.testing.assert_array_equal(read_table(wire, "api"), s.table)


def test_serialized_for_holds_the_rows_its_ranks_send_or_receive():
  s = plan("all_reduce", 4 * 1000, Topology.uniform(6, 1.0).with_straggler(2, 0.5), "optcc",
           chunks=3)
  assert s.serialized_for(range(6)) is s.serialized
  for ranks in ([0], [2, 5], [1, 3, 4]):
    rows = read_table(s.serialized_for(ranks), "api")
    mine = np.isin(s.table[:, SRC], ranks) | np.isin(s.table[:, DST], ranks)
    np.testing.assert_array_equal(rows, s.table[mine])
    assert not s.serialized_for(ranks).flags.writeable
  assert s.serialized_for([2, 5]) is s.serialized_for((5, 2))


@pytest.mark.parametrize("edit, match", [
    (lambda t: t[1:], "api: schedule table magic/version mismatch: rebuild jaxcc "
     r"\(found no jaxcc table header, this jaxcc reads version 1\)"),
    (lambda t: np.r_[t[:1], TABLE_VERSION + 1, t[2:]], "magic/version mismatch: rebuild jaxcc "
     r"\(found version 2"),
    (lambda t: t[:0], "found no jaxcc table header"),
    (lambda t: t[:-1], "header says 12 rows of 7 columns, but the table has 83 values after it"),
])
def test_read_table_rejects_other_headers(edit, match):
  wire = plan("all_reduce", 4 * 12, Topology.uniform(3, 1.0), "ring", chunks=1).serialized
  with pytest.raises(ValueError, match=match):
    read_table(edit(wire), "api")


def test_schedules_are_cached_and_hashable():
  topo = Topology.uniform(4, 1.0)
  a = plan("all_reduce", 4096, topo, "optcc")
  assert a is plan("all_reduce", 4096, topo, "optcc")
  assert a == plan("all_reduce", 4096, Topology.uniform(4, 1.0), "optcc")
  assert hash(a) == hash(plan("all_reduce", 4096, Topology.uniform(4, 1.0), "optcc"))
  assert a != plan("all_reduce", 4096, topo, "ring")


@pytest.mark.parametrize("args, kwargs, error, match", [
    (("all_reduce", 4096, Topology.uniform(4, 1.0), "bogus"), {}, ValueError,
     "^jaxcc.plan: unsupported algorithm 'bogus' for all_reduce"),
    (("reduce_scatter", 4096, Topology.uniform(4, 1.0), "optcc"), {}, ValueError,
     "'optcc' is for all_reduce only"),
    (("all_gather", 4096, Topology.uniform(4, 1.0), "r2ccl"), {}, ValueError,
     "expected one of"),
    (("gather", 4096, Topology.uniform(4, 1.0), "ring"), {}, ValueError,
     "^jaxcc.plan: unknown collective"),
    (("all_reduce", 4097, Topology.uniform(4, 1.0), "ring"), {}, ValueError,
     "^jaxcc.plan: nbytes must be a non-negative multiple of itemsize=4"),
    (("reduce_scatter", 4 * 6, Topology.uniform(4, 1.0), "ring"), {}, ValueError,
     "^jaxcc.plan: .* divisible by the axis size 4"),
    (("broadcast", 16, Topology.uniform(4, 1.0), "ring"), {"root": 4}, ValueError,
     r"^jaxcc.plan: root must be a rank in \[0, 4\)"),
    (("all_reduce", 16, None, "ring"), {}, TypeError,
     "^jaxcc.plan: topology must be a jaxcc.Topology"),
    (("all_reduce", 16, Topology.uniform(4, 1.0), "ring"), {"chunks": 0}, ValueError,
     "^jaxcc.plan: chunks must be a positive integer"),
])
def test_plan_errors(args, kwargs, error, match):
  with pytest.raises(error, match=match):
    plan(*args, **kwargs)


def test_every_algorithm_plans_for_one_rank():
  for coll, algs in ALGORITHMS.items():
    for alg in algs:
      kw = {"perm": [(0, 0)]} if coll == "ppermute" else {}
      s = plan(coll, 4 * 3, Topology.uniform(1, 1.0), alg, **kw)
      assert len(s.table) == 0 and s.num_steps == 0


def test_every_algorithm_plans_an_empty_buffer():
  topo = Topology.uniform(3, 1.0)
  for coll, algs in ALGORITHMS.items():
    for alg in algs:
      kw = {"perm": [(0, 1), (1, 2)]} if coll == "ppermute" else {}
      s = plan(coll, 0, topo, alg, **kw)
      assert s.length == 0 and len(s.table) == 0 and s.num_steps == 0
      jaxcc.sim.check(s)
      assert jaxcc.sim.simulate(s, topo).time == 0.0


@pytest.mark.parametrize("p", [1, 3, 8])
def test_ppermute_schedule(p):
  n, perm = 1001, [(0, 0)] + [(i, p - i) for i in range(1, p)]  # 0 stays; the rest reverse
  s = plan("ppermute", 4 * n, Topology.uniform(p, 1.0), "direct", perm=perm, chunks=3)
  moves = tuple((a, b) for a, b in perm if a != b)
  assert s.collective == "ppermute" and s.perm == moves and s.length == 2 * n
  assert s.num_steps == (3 if moves else 0) and s.chunks == 3
  sources, destinations = np.zeros(p), np.zeros(p)
  for a, b in moves:
    sources[a] = destinations[b] = 4 * n
  np.testing.assert_array_equal(s.bytes_sent(), sources)  # N from each source, nothing relayed
  np.testing.assert_array_equal(s.bytes_received(), destinations)
  for t, step in enumerate(s.steps):  # chunk t of the input lands at the same place in the output
    assert sorted((x.src, x.dst) for x in step) == sorted(moves)
    assert all(x.op == COPY and x.dst_start == n + x.src_start for x in step)
    assert {x.src_range for x in step} == {(t * n // 3, (t + 1) * n // 3)}


def test_ppermute_plan_pipelines_like_a_broadcast_chain():
  topo, perm, nbytes = Topology.uniform(4, 1.0), [(i, (i + 1) % 4) for i in range(4)], 1 << 19
  big = plan("ppermute", nbytes, topo, perm=perm)
  assert big.algorithm == "direct"
  assert big.chunks == planner.depth("ppermute", nbytes // 4, 4, topo, "direct", perm=perm) > 1
  assert schedule("ppermute", nbytes // 4, 4, topo, "direct", perm=perm) is big
  assert schedule("ppermute", nbytes // 4, 4, topo, "direct", perm=perm, chunks=1).chunks == 1


def test_schedule_is_plan_in_elements_at_the_depth_asked_for():
  topo = Topology.uniform(4, 1.0).with_straggler(1, 0.25)
  n = 8 << 20
  deep = schedule("all_reduce", n // 4, 4, topo, "auto")
  assert deep is plan("all_reduce", n, topo)
  assert deep.chunks == planner.depth("all_reduce", n // 4, 4, topo, deep.algorithm)
  assert schedule("all_reduce", n // 4, 4, topo, deep.algorithm, chunks=deep.chunks) is deep
  # auto_algorithm prices the pipelined candidates; the one-chunk schedule is then built.
  assert auto_algorithm("all_reduce", n // 4, 4, topo) == deep.algorithm == "optcc"
  flat = schedule("all_reduce", n // 4, 4, topo, deep.algorithm, chunks=1)
  assert flat.chunks == 1 and flat.algorithm == "optcc"
  assert auto_algorithm("all_reduce", n // 4, 4, topo, chunks=1) == \
      schedule("all_reduce", n // 4, 4, topo, "auto", chunks=1).algorithm


def test_errors_name_the_api():
  topo = Topology.uniform(4, 1.0)
  with pytest.raises(ValueError, match=r"^jaxcc.all_reduce: unsupported algorithm 'tree' for "
                     r"all_reduce; expected one of \('auto', 'ring'"):
    schedule("all_reduce", 16, 4, topo, "tree", api="jaxcc.all_reduce")
  with pytest.raises(ValueError, match=r"^jaxcc.all_gather: the buffer of 6 elements does not "
                     r"split into 4 equal shards"):
    schedule("all_gather", 6, 4, topo, "ring", api="jaxcc.all_gather")
  with pytest.raises(ValueError, match=r"^jaxcc.plan: chunks must be a positive integer"):
    schedule("all_gather", 8, 4, topo, "ring", chunks=True)
  with pytest.raises(ValueError, match=r"^jaxcc.broadcast: nbytes must be"):
    plan("broadcast", 3, topo, api="jaxcc.broadcast")


def test_validate_checks_once_and_names_the_api():
  s = plan("all_reduce", 4 * 12, Topology.uniform(3, 1.0), "ring", chunks=1)
  assert s.validate() is s
  bad = type(s)(s.collective, s.nranks, s.length, s.itemsize, s.algorithm,
                np.r_[s.table[:1], s.table[:1]], s.num_steps)
  with pytest.raises(ScheduleError, match=r"^jaxcc.x: ring all_reduce schedule \(nranks=3, "
                     r"length=12\): step 0, transfer #1 .*second transfer to rank 1"):
    bad.validate("jaxcc.x")


@pytest.mark.parametrize("kwargs, match", [
    ({}, "^jaxcc.plan: perm must be a sequence of .src, dst. pairs, got None"),
    ({"perm": [(0, 1), (2, 1)]}, "names a rank twice as source or as destination"),
    ({"perm": [(0, 4)]}, "rank 4 in perm is outside the axis of size 4"),
    ({"perm": [(0, 1)], "algorithm": "ring"},
     r"^jaxcc.plan: unsupported algorithm 'ring' for ppermute.*'direct'"),
])
def test_ppermute_plan_errors(kwargs, match):
  with pytest.raises(ValueError, match=match):
    plan("ppermute", 64, Topology.uniform(4, 1.0), **kwargs)
  with pytest.raises(ValueError, match="^jaxcc.plan: perm is for ppermute only"):
    plan("broadcast", 64, Topology.uniform(4, 1.0), perm=[(0, 1)])


def grid_schedule(length, topo, chunks, itemsize=4):
  """OptCC's grid form on a topology too small for ``optcc`` to choose it."""
  grid, leaves = optcc_module.grid_layout(topo.bandwidth, min_owners=4)
  return optcc_module._grid_optcc(length, topo.size, itemsize, chunks, grid, leaves)


@pytest.mark.parametrize("p, stragglers", [(4, ()), (8, (3,)), (13, (0, 12)), (18, (4,)),
                                           (30, (1, 2, 29))])
@pytest.mark.parametrize("chunks", [1, 3, 8])
@pytest.mark.parametrize("length", [1, 997, 40_000])
def test_optcc_grid_form_is_proved_and_balances_ports(p, stragglers, chunks, length):
  topo = Topology.uniform(p, 1.0)
  for rank in stragglers:
    topo = topo.with_straggler(rank, 0.3)  # slow enough that owners left over may be leaves
  grid, leaves = optcc_module.grid_layout(topo.bandwidth, min_owners=4)
  assert grid.size + len(leaves) == p and set(stragglers) <= set(leaves.tolist())
  s = grid_schedule(length, topo, chunks).validate()
  check(s)
  a, b = grid.shape
  per_owner = length + (p - 2) * length / (a * b)  # N + (p-2) w, in elements
  # The pieces' rounding, and each leaf's column pieces, which rotate over the owners of a
  # column chunk by chunk.
  tolerance = 2 * chunks * (a + b) + len(leaves) * (length // b + 1)
  for volume in (s.bytes_sent() / 4, s.bytes_received() / 4):
    np.testing.assert_allclose(volume[grid.ravel()], per_owner, atol=tolerance)
    np.testing.assert_array_equal(volume[leaves], length)
  steps = 6 if len(leaves) else 4
  assert s.num_steps <= steps * chunks


@pytest.mark.parametrize("p", [64, 128])
def test_optcc_takes_the_grid_form_below_512_owners_where_messages_cost(p):
  """At 30 us a message the grid's fewer messages win, as the simulator confirms; without
  message costs, and with too few owners, the direct form runs."""
  n = 1 << 28
  costly = Topology.uniform(p, 25e9).with_straggler(1, 0.5)
  assert optcc_module.grid_layout(costly.bandwidth) is None
  assert sim_model.optcc_min_owners(n, costly) == optcc_module.GRID_FEWEST_OWNERS
  s = schedule("all_reduce", n // 4, 4, costly, "optcc")
  grid, leaves = optcc_module.grid_layout(costly.bandwidth, optcc_module.GRID_FEWEST_OWNERS)
  per_chunk = 2 * grid.size * (sum(grid.shape) - 2) + 2 * grid.shape[1] * len(leaves)
  assert len(s.table) == s.chunks * per_chunk
  direct = min(simulate(optcc_module.optcc(n // 4, p, 4, k, costly.bandwidth), costly).time
               for k in (1, 2, 4))
  assert simulate(s, costly).time < 0.9 * direct
  fluid = Topology.uniform(p, 25e9, message_cost=0.0).with_straggler(1, 0.5)
  assert sim_model.optcc_min_owners(n, fluid) == optcc_module.GRID_MIN_OWNERS
  few = Topology.uniform(16, 25e9).with_straggler(1, 0.5)
  assert sim_model.optcc_min_owners(n, few) == optcc_module.GRID_MIN_OWNERS


def test_optcc_takes_the_grid_form_from_512_owners_and_goes_deeper():
  straggler = Topology.uniform(1024, 25e9).with_straggler(1, 0.5)
  grid, leaves = optcc_module.grid_layout(straggler.bandwidth)
  assert grid.shape == (31, 33) and leaves.tolist() == [1]  # 1023 owners = 31 x 33
  assert optcc_module.grid_layout(Topology.uniform(511, 1.0).bandwidth) is None
  # Ranks at two speeds: every slower rank a leaf would cost more than GRID_SLACK.
  two_speeds = Topology.from_bandwidths([1.0] * 600 + [0.9] * 600)
  assert optcc_module.grid_layout(two_speeds.bandwidth) is None
  np.testing.assert_allclose(optcc_module.shares(two_speeds.bandwidth),
                             optimal_shares(two_speeds.bandwidth))
  shares = optcc_module.shares(straggler.bandwidth)
  assert shares[1] == 0 and shares.sum() == pytest.approx(1.0)

  messages = optcc_module.messages_per_chunk(straggler.bandwidth)
  assert messages.max() == 2 * (31 + 33 - 2) + 1 and messages[1] == 33
  n = 1 << 28  # 256 MiB
  fluid = Topology.uniform(1024, 25e9, message_cost=0.0).with_straggler(1, 0.5)
  k = planner.depth("all_reduce", n // 4, 4, fluid, "optcc")
  assert k == 256 > planner.depth("all_reduce", n // 4, 4, fluid, "direct") == 16
  s = plan("all_reduce", n, straggler, "optcc", chunks=4)
  assert len(s.table) == 4 * (2 * 1023 * (31 + 33 - 2) + 2 * 33)  # owners', then the leaf's
  sent = np.bincount(s.table[:, SRC], minlength=1024)
  received = np.bincount(s.table[:, DST], minlength=1024)
  assert (sent <= 4 * messages).all() and (received <= 4 * messages).all()
