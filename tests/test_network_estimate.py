"""jaxcc.network's estimator, change rule and topology snapping, on synthetic frame records."""

import numpy as np
import pytest

import jaxcc
from jaxcc.network import estimate, host
from jaxcc.network.measured import snap


def _frames(peer, sizes, rates, start=0.0, gap=0.0, op=1):
  """Back-to-back frames from ``peer``: each of ``sizes[k]`` bytes at ``rates[k]`` bytes/s."""
  out, t = [], start
  for size, rate in zip(sizes, rates):
    first = t + gap
    t = first + size / rate
    out.append((peer, host.RECEIVED, op, 0, int(first * 1e9), int(t * 1e9), size))
  return np.array(out, host.RECORD)


def test_a_token_buckets_burst_and_short_messages_are_left_out():
  burst = _frames(1, [64 << 10] * 4, [2e9] * 4)  # 256 KiB at line speed
  steady = _frames(1, [100_000] * 40, [25e6] * 40, start=burst["last_ns"][-1] / 1e9)
  chatter = _frames(2, [200] * 50, [25e6] * 50, gap=0.01)  # latency-bound, apart
  got = estimate.received_rates(np.concatenate([burst, steady, chatter]), 3)
  assert got.bytes[1] / got.seconds[1] == pytest.approx(25e6, rel=0.01)
  assert got.seconds[2] == 0 and got.seconds[0] == 0


def _received_rates_by_period(records, nproc, settle_bytes, gap_s, min_seconds):
  """received_rates one busy period at a time, as the module doc says it."""
  got, secs = np.zeros(nproc), np.zeros(nproc)
  mine = records[(records["direction"] == host.RECEIVED) & (records["op"] > 0)]
  for q in np.unique(mine["peer"]):
    frames = np.sort(mine[mine["peer"] == q], order="first_ns")
    period = [frames[0]]
    for f in list(frames[1:]) + [None]:
      if f is not None and (int(f["first_ns"]) - int(period[-1]["last_ns"])) / 1e9 <= gap_s:
        period.append(f)
        continue
      done = np.cumsum([int(g["bytes"]) for g in period])
      k = int(np.searchsorted(done, settle_bytes))
      if k < len(period) - 1:
        seconds = (int(period[-1]["last_ns"]) - int(period[k]["last_ns"])) / 1e9
        if seconds >= min_seconds:
          got[q] += done[-1] - done[k]
          secs[q] += seconds
      period = [f]
  return got, secs


@pytest.mark.parametrize("seed", range(5))
def test_received_rates_equals_its_period_by_period_twin(seed):
  rng = np.random.default_rng([np.random.SeedSequence().entropy, seed])
  parts = []
  for peer in range(4):
    for burst in range(rng.integers(1, 6)):
      n = int(rng.integers(1, 40))
      parts.append(_frames(peer, rng.integers(100, 200_000, n), rng.uniform(1e6, 1e9, n),
                           start=rng.uniform(0, 1), gap=float(rng.choice([0, 1e-3, 3e-3]))))
  records = np.concatenate(parts)
  records["op"][rng.random(len(records)) < 0.1] = host.HOST_OP
  records["direction"][rng.random(len(records)) < 0.1] = host.SENT
  rng.shuffle(records)
  for settle in (0, 1, 64 << 10, 256 << 10):
    got = estimate.received_rates(records, 5, settle_bytes=settle, gap_s=2e-3, min_seconds=5e-3)
    want = _received_rates_by_period(records, 5, settle, 2e-3, 5e-3)
    np.testing.assert_allclose(got.bytes, want[0])
    np.testing.assert_allclose(got.seconds, want[1], rtol=1e-12)


def test_host_messages_and_sent_frames_do_not_count():
  probe = _frames(1, [1 << 20] * 4, [25e6] * 4, op=host.HOST_OP)
  sent = _frames(1, [1 << 20] * 4, [25e6] * 4)
  sent["direction"] = host.SENT
  assert estimate.received_rates(np.concatenate([probe, sent]), 2).seconds.sum() == 0


def test_rate_matrix_puts_each_receivers_row_in_its_column():
  rows = [estimate.Received(np.array([0.0, 50.0]), np.array([0.0, 2.0])),
          estimate.Received(np.array([30.0, 0.0]), np.array([1.0, 0.0]))]
  np.testing.assert_array_equal(estimate.rate_matrix(rows), [[np.nan, 30.0], [25.0, np.nan]])


def test_noise_never_changes_a_port_and_a_halved_nic_does_within_patience():
  rng = np.random.default_rng(0)
  p = 8
  base = np.full((p, p), 25e6 / (p - 1))
  np.fill_diagonal(base, np.nan)
  rule = estimate.PortChange(None, p, threshold=0.25, patience=2)
  for _ in range(300):  # 8% noise per pair, and pairs that were not observed at all
    noisy = base * rng.lognormal(0, 0.08, (p, p))
    noisy[rng.random((p, p)) < 0.2] = np.nan
    assert rule.update(noisy) == []
  slow = base.copy()
  slow[5, :] /= 2  # rank 5's NIC at half rate, both ways
  slow[:, 5] /= 2
  assert rule.update(slow) == []
  changed = rule.update(slow)
  assert {(port, rank) for _, port, rank, _ in changed} == {("send", 5), ("recv", 5)}
  assert all(0.4 < score < 0.6 for *_, score in changed)


def test_ports_are_scored_inside_and_across_clusters_apart():
  p = 6
  cluster = (0, 0, 0, 1, 1, 1)
  same = np.equal.outer(cluster, cluster)
  base = np.where(same, 25e6, 2.5e6)
  np.fill_diagonal(base, np.nan)
  rule = estimate.PortChange(cluster, p, patience=1, warmup=1)
  rule.update(base)
  slower = base.copy()
  slower[4, :3] /= 2  # rank 4's cross-cluster send port
  assert [(level, port, rank) for level, port, rank, _ in rule.update(slower)] == [
      ("inter", "send", 4)]


def test_snap_plans_an_equal_network_as_equal_and_ignores_noise_after():
  rng = np.random.default_rng(1)
  measured = jaxcc.Topology.from_bandwidths(25e6 * rng.uniform(0.97, 1.03, 8), latency=1e-4)
  first = snap(measured, None, 0.125)
  assert len(set(first.send_bandwidth + first.recv_bandwidth)) == 1
  again = snap(jaxcc.Topology.from_bandwidths(25e6 * rng.uniform(0.95, 1.05, 8), latency=1.4e-4),
               first, 0.125)
  assert again == first and hash(again) == hash(first)
  halved = snap(jaxcc.Topology.from_bandwidths(25e6 * rng.uniform(0.97, 1.03, 8), latency=8e-5)
                .with_straggler(5, 0.5), first, 0.125)
  assert halved != first and halved.send_bandwidth[5] < 0.6 * first.send_bandwidth[5]
  assert halved.send_bandwidth[:5] == first.send_bandwidth[:5]
