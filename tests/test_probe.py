"""jaxcc.probe_topology: clusters and ports from a measured rate matrix, and a real probe.

The probe itself needs the testbed (root and iproute2): skipped without them,
except under CI (``CI`` set), where that is a failure.
"""

import jax
import numpy as np
import pytest
from testbed_helpers import require

import jaxcc
from jaxcc import probe
from jaxcc.bench import probe as probe_bench


def _rates(send, recv, cluster, inter_send, inter_recv):
  p = len(send)
  rates = np.full((p, p), np.nan)
  for i in range(p):
    for j in range(p):
      if i != j:
        same = cluster[i] == cluster[j]
        rates[i, j] = min(send[i], recv[j]) if same else min(inter_send[i], inter_recv[j])
  return rates


def test_clusters_ports_and_stragglers_come_back_from_the_rates():
  configured = jaxcc.Topology.clusters([3, 5], 25e6, 2.5e6).with_straggler(1, 0.5, "intra") \
      .with_straggler(4, 0.5, "inter")
  noise = np.random.default_rng(0).uniform(0.98, 1.02, (8, 8))
  rates = _rates(configured.send_bandwidth, configured.recv_bandwidth, configured.cluster,
                 configured.inter_send_bandwidth, configured.inter_recv_bandwidth) * noise
  got = probe.topology_from_rates(rates)
  assert got.cluster == configured.cluster
  for name in ("send_bandwidth", "recv_bandwidth", "inter_send_bandwidth",
               "inter_recv_bandwidth"):
    np.testing.assert_allclose(getattr(got, name), getattr(configured, name), rtol=0.03)


def test_a_flat_network_stays_flat_and_a_lone_rank_is_a_straggler():
  flat = probe.topology_from_rates(_rates([25e6, 25e6, 12e6, 25e6], [25e6] * 4, [0] * 4,
                                          [0] * 4, [0] * 4))
  assert flat.cluster is None and flat.send_bandwidth[2] == 12e6
  # One rank alone behind a slow link reaches every rank slowly: a straggler, by its rates.
  lone = probe.topology_from_rates(_rates([25e6] * 3, [25e6] * 3, [0, 0, 1], [2e6] * 3,
                                          [2e6] * 3))
  assert lone.cluster is None and lone.stragglers() == {2: 2e6 / 25e6}
  pair = probe.topology_from_rates(_rates([25e6] * 4, [25e6] * 4, [0, 0, 1, 1], [2e6] * 4,
                                          [2e6] * 4))
  assert pair.cluster == (0, 0, 1, 1) and pair.inter_send_bandwidth == (2e6,) * 4


def test_message_costs_are_each_ranks_smallest_pair_and_default_where_unmeasured():
  rates = _rates([25e6] * 4, [25e6] * 4, [0, 0, 1, 1], [2e6] * 4, [2e6] * 4)
  cost = np.array([[np.nan, 20e-6, 40e-6, np.nan],
                   [25e-6, np.nan, 30e-6, 50e-6],
                   [40e-6, 30e-6, np.nan, 60e-6],
                   [np.nan, 70e-6, 60e-6, np.nan]])
  got = probe.topology_from_rates(rates, one_way=None, message_cost=cost)
  assert got.cluster == (0, 0, 1, 1)
  np.testing.assert_allclose(got.message_cost, [20e-6, 20e-6, 30e-6, 50e-6])
  assert probe.topology_from_rates(rates).message_cost == (jaxcc.topology.MESSAGE_COST,) * 4
  unmeasured = np.full((4, 4), np.nan)
  unmeasured[0, 1] = 5e-6
  np.testing.assert_allclose(probe.topology_from_rates(rates, message_cost=unmeasured)
                             .message_cost, [5e-6, 5e-6] + [jaxcc.topology.MESSAGE_COST] * 2)


@pytest.mark.parametrize("fraction", [0.5, 0.25])
def test_a_straggler_is_a_slow_port_not_a_cluster(fraction):
  send = [25e6, 25e6, 25e6 * fraction, 25e6]
  flat = probe.topology_from_rates(_rates(send, send, [0] * 4, [0] * 4, [0] * 4))
  assert flat.cluster is None and flat.stragglers() == {2: fraction}
  configured = jaxcc.Topology.clusters([4, 4], 25e6, 2.5e6).with_straggler(5, fraction)
  got = probe.topology_from_rates(_rates(
      configured.send_bandwidth, configured.recv_bandwidth, configured.cluster,
      configured.inter_send_bandwidth, configured.inter_recv_bandwidth))
  assert got == configured


def test_clusters_apart_along_the_axis_are_refused():
  rates = _rates([25e6] * 4, [25e6] * 4, [0, 1, 0, 1], [2e6] * 4, [2e6] * 4)
  with pytest.raises(ValueError, match="not consecutive"):
    probe.topology_from_rates(rates)


@pytest.mark.parametrize("seed", range(3))
def test_pair_rounds_move_every_pair_once_one_flow_per_port(seed):
  from jaxcc.network.native_probe import pair_rounds
  rng = np.random.default_rng([np.random.SeedSequence().entropy, seed])
  for p in (2, 3, 8, 13):
    pairs = rng.random((p, p)) < 0.5
    np.fill_diagonal(pairs, False)
    moved = np.zeros((p, p), int)
    for to in pair_rounds(pairs):
      sending = np.flatnonzero(to >= 0)
      assert len(set(to[sending])) == len(sending)  # one flow into each receive port
      moved[sending, to[sending]] += 1
    np.testing.assert_array_equal(moved, pairs)
  everyone = ~np.eye(8, dtype=bool)
  assert len(pair_rounds(everyone)) == 7
  cluster = np.array([0, 0, 0, 1, 1, 1, 1, 1])
  assert len(pair_rounds(everyone & np.equal.outer(cluster, cluster))) == 4


def test_bad_arguments_fail_with_the_argument_named():
  mesh = jax.make_mesh((8,), ("x",))
  with pytest.raises(ValueError, match="axis_name must name an axis"):
    jaxcc.probe_topology(mesh, "y")
  with pytest.raises(ValueError, match="its own process"):
    jaxcc.probe_topology(mesh, "x")


@pytest.mark.multiprocess
def test_the_probe_finds_the_testbeds_clusters():
  require()
  result = probe_bench.run(4, rate="200mbit", clusters=(2, 2), inter_rate="20mbit")
  assert result["clusters_found"], result
  assert 0.8 < result["worst_ratio"] < 1.25, result
  assert result["plan_ratio"] < 1.1, result
