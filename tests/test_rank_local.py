"""Rank-local planning: the part of a schedule that some ranks send or receive, planned without
the whole table (``planner.rank_schedule``, ``TableBuilder(ranks)``), is the whole table's part
bit for bit, with the whole schedule's steps, traffic and one digest in every process."""

import dataclasses

import numpy as np
import pytest

from jaxcc import Topology, planner
from jaxcc._src import native_executor
from jaxcc.schedules.direct import direct
from jaxcc.schedules.ir import RankSchedule, traffic
from jaxcc.schedules.optcc import _grid_optcc, grid_layout, optcc, optimal_shares
from jaxcc.schedules.ring import ring

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")


def assert_part(whole, part, ranks):
  """``part`` is ``whole``'s part for ``ranks``: rows, steps and traffic."""
  assert isinstance(part, RankSchedule)
  np.testing.assert_array_equal(part.serialized_for(ranks), whole.serialized_for(ranks))
  assert part.num_steps == whole.num_steps
  assert (part.collective, part.nranks, part.length, part.chunks) == (
      whole.collective, whole.nranks, whole.length, whole.chunks)
  sent, received = traffic(whole.table, whole.nranks)
  np.testing.assert_array_equal(part.sent, sent)
  np.testing.assert_array_equal(part.received, received)


def random_case(rng, collective="all_reduce"):
  p = int(rng.integers(2, 41))
  chunks = int(rng.integers(1, 17))
  length = int(rng.choice([0, 1, 3, rng.integers(1, 3 * p * chunks), rng.integers(1, 20000)]))
  if collective != "all_reduce":
    length -= length % p
  bandwidth = np.full(p, 10.0)
  for rank in rng.choice(p, int(rng.integers(0, 4))):
    bandwidth[rank] *= float(rng.choice([0.1, 0.25, 0.5, 0.75, 0.9]))
  ranks = np.sort(rng.choice(p, int(rng.integers(1, p + 1)), replace=False))
  return p, chunks, length, bandwidth, ranks


@pytest.mark.parametrize("seed", range(6))
def test_ring_and_direct_parts_are_the_whole_tables_parts(seed):
  rng = np.random.default_rng(seed)
  for trial in range(40):
    collective = COLLECTIVES[trial % 3]
    p, chunks, length, _, ranks = random_case(rng, collective)
    assert_part(ring(collective, length, p, 4, chunks),
                ring(collective, length, p, 4, chunks, ranks), ranks)
    assert_part(direct(collective, length, p, 4, chunks),
                direct(collective, length, p, 4, chunks, ranks), ranks)


@pytest.mark.parametrize("seed", range(6))
def test_optcc_parts_are_the_whole_tables_parts(seed):
  rng = np.random.default_rng(100 + seed)
  forms = set()
  for _ in range(40):
    p, chunks, length, bandwidth, ranks = random_case(rng)
    assert_part(optcc(length, p, 4, chunks, bandwidth), optcc(length, p, 4, chunks, bandwidth,
                                                               ranks), ranks)
    forms.add(("direct", bool((optimal_shares(bandwidth) == 0).any())))
    layout = grid_layout(bandwidth, min_owners=4)
    if layout is not None:
      assert_part(_grid_optcc(length, p, 4, chunks, *layout),
                  _grid_optcc(length, p, 4, chunks, *layout, ranks=ranks), ranks)
      forms.add(("grid", len(layout[1]) > 0))
  assert len(forms) >= 3  # the direct form with and without leaves, the grid form


@pytest.mark.parametrize("make", [
    lambda length, ranks=None: direct("all_reduce", length, 5, 4, 4, ranks),
    lambda length, ranks=None: ring("all_reduce", length, 5, 4, 3, ranks),
    lambda length, ranks=None: optcc(length, 6, 4, 8, [1.0, 0.1, 1, 1, 0.5, 1], ranks),
    lambda length, ranks=None: optcc(length, 6, 4, 8, [1.0, 1, 1, 1, 0.5, 1], ranks),
    lambda length, ranks=None: _grid_optcc(length, 12, 4, 6, *grid_layout([1.0] * 11 + [0.1],
                                                                          4), ranks=ranks),
])
def test_steps_without_transfers_are_numbered_away_as_in_the_whole_table(make):
  """Pieces of 0 elements leave whole steps empty: each rank's part numbers the steps as the
  whole table does."""
  whole = make(3)
  assert whole.num_steps < make(10_000).num_steps
  for rank in range(whole.nranks):
    assert_part(whole, make(3, [rank]), [rank])


@pytest.mark.parametrize("algorithm", ["ring", "direct", "optcc"])
def test_planner_plans_parts_with_one_digest(algorithm):
  topo = Topology.uniform(12, 1e9).with_straggler(3, 0.5).with_straggler(7, 0.1)
  whole = planner.schedule("all_reduce", 4099, 2, topo, algorithm, chunks=4)
  parts = [planner.rank_schedule("all_reduce", 4099, 2, topo, algorithm, ranks, chunks=4)
           for ranks in ([0], [3, 7], [11, 0, 5], range(12))]
  for part, ranks in zip(parts, ([0], [3, 7], [0, 5, 11], range(12))):
    assert_part(whole, part, ranks)
  assert len({part.digest for part in parts}) == 1
  other = planner.rank_schedule("all_reduce", 4099, 2, topo, algorithm, [0], chunks=8)
  assert other.digest != parts[0].digest
  assert planner.rank_schedule("all_reduce", 4099, 2, topo, algorithm, [0],
                               chunks=4) is parts[0]  # cached


def test_planner_plans_the_grid_form_from_512_owners():
  topo = Topology.uniform(520, 1e9).with_straggler(1, 0.5)
  assert grid_layout(topo.bandwidth) is not None
  whole = planner.schedule("all_reduce", 100_003, 4, topo, "optcc", chunks=2)
  for ranks in ([0], [1], [1, 2, 519], list(range(0, 520, 7))):
    assert_part(whole, planner.rank_schedule("all_reduce", 100_003, 4, topo, "optcc", ranks,
                                             chunks=2), ranks)


@pytest.mark.parametrize("collective, algorithm, kwargs", [
    ("all_reduce", "r2ccl", {}),
    ("all_reduce", "hierarchical", {}),
    ("reduce_scatter", "hierarchical", {}),
    ("all_gather", "ring", {}),
    ("all_reduce", "optcc", {}),  # a flat algorithm on clusters: the whole table, cut
    ("broadcast", "ring", {"root": 2}),
    ("broadcast", "direct", {"root": 5}),
    ("ppermute", "direct", {"perm": ((0, 3), (3, 1), (1, 0), (6, 6), (7, 2))}),
])
def test_other_algorithms_and_clusters_cut_the_whole_table(collective, algorithm, kwargs):
  topo = Topology.clusters([3, 5], intra_bandwidth=25e9, inter_bandwidth=2.5e9)
  if algorithm == "r2ccl":
    topo = Topology.uniform(8, 1e9).with_straggler(2, 0.5)
  length = 8 * 131
  whole = planner.schedule(collective, length, 4, topo, algorithm, chunks=3, **kwargs)
  digests = set()
  for ranks in ([0], [4], [2, 3], range(8)):
    part = planner.rank_schedule(collective, length, 4, topo, algorithm, ranks, chunks=3,
                                 **kwargs)
    np.testing.assert_array_equal(part.serialized_for(ranks), whole.serialized_for(ranks))
    assert part.num_steps == whole.num_steps
    sent, received = traffic(whole.table, 8, topo.cluster)
    np.testing.assert_array_equal(part.sent, sent)
    np.testing.assert_array_equal(part.received, received)
    digests.add(part.digest)
  assert len(digests) == 1


def test_pacing_from_a_part_is_the_whole_ones_for_its_senders():
  topo = Topology.uniform(9, 25e6).with_straggler(4, 0.5).with_straggler(6, 0.3)
  for algorithm in ("optcc", "direct", "ring"):
    whole = planner.schedule("all_reduce", 9 * 1000, 4, topo, algorithm, chunks=2)
    rates = native_executor.pacing_rates(whole, topo).reshape(9, 9)
    for ranks in ([4], [0, 6]):
      part = planner.rank_schedule("all_reduce", 9 * 1000, 4, topo, algorithm, ranks,
                                   chunks=2)
      mine = native_executor.pacing_rates(part, topo).reshape(9, 9)
      np.testing.assert_array_equal(mine[ranks], rates[ranks])


def test_a_part_serves_its_own_ranks_only():
  topo = Topology.uniform(6, 1e9)
  part = planner.rank_schedule("all_reduce", 600, 4, topo, "direct", [1, 4])
  whole = planner.schedule("all_reduce", 600, 4, topo, "direct")
  np.testing.assert_array_equal(part.serialized_for([4]), whole.serialized_for([4]))
  with pytest.raises(ValueError, match="not for rank 2"):
    part.serialized_for([1, 2])


@pytest.mark.parametrize("ranks, match", [([6], r"ranks in \[0, 6\)"), ([], "at least one"),
                                          (["x"], "integers")])
def test_rank_schedule_errors_name_the_api(ranks, match):
  with pytest.raises(ValueError, match=f"jaxcc.all_reduce: .*{match}"):
    planner.rank_schedule("all_reduce", 600, 4, Topology.uniform(6, 1e9), "ring", ranks,
                          api="jaxcc.all_reduce")
  with pytest.raises(ValueError, match="jaxcc.all_reduce: unsupported algorithm"):
    planner.rank_schedule("all_reduce", 600, 4, Topology.uniform(6, 1e9), "chain", [0],
                          api="jaxcc.all_reduce")


def test_digest_follows_every_planning_argument():
  topo = Topology.uniform(6, 1e9)
  base = dict(collective="all_reduce", length=600, itemsize=4, topology=topo,
              algorithm="direct", ranks=[0], chunks=2)
  digest = planner.rank_schedule(**base).digest
  for change in (dict(length=606), dict(itemsize=2), dict(algorithm="ring"), dict(chunks=4),
                 dict(topology=topo.with_straggler(2, 0.5)),
                 dict(topology=dataclasses.replace(topo, latency=(1e-6,) * 6))):
    assert planner.rank_schedule(**{**base, **change}).digest != digest, change
