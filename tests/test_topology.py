"""Topology: constructors, stragglers, validation."""

import pytest

from jaxcc import Topology


def test_uniform_and_straggler():
  t = Topology.uniform(4, 10.0, latency=1e-6).with_straggler(2, 0.5)
  assert t.size == 4
  assert t.bandwidth == (10.0, 10.0, 5.0, 10.0)
  assert t.send_bandwidth == t.recv_bandwidth
  assert t.latency == (1e-6,) * 4
  assert t.stragglers() == {2: 0.5}


def test_several_stragglers_and_repeats():
  t = Topology.uniform(8, 1.0).with_straggler(1, 0.5).with_straggler(6, 0.75)
  assert t.stragglers() == {1: 0.5, 6: 0.75}
  assert Topology.uniform(2, 1.0).with_straggler(0, 0.5).with_straggler(0, 0.5).bandwidth[0] == 0.25


def test_from_bandwidths_and_clusters():
  t = Topology.from_bandwidths([1.0, 2.0], recv_bandwidths=[3.0, 4.0])
  assert t.bandwidth == (1.0, 2.0)
  c = Topology.clusters([2, 3], intra_bandwidth=[5.0, 7.0], inter_bandwidth=1.0)
  assert c.cluster == (0, 0, 1, 1, 1)
  assert c.bandwidth == (5.0, 5.0, 7.0, 7.0, 7.0)
  assert c.inter_bandwidth == (1.0,) * 5


def test_hashable_and_equal():
  a = Topology.uniform(3, 1.0).with_straggler(0, 0.5)
  b = Topology.from_bandwidths([0.5, 1.0, 1.0])
  assert a == b and hash(a) == hash(b)
  assert len({a, b}) == 1


@pytest.mark.parametrize("make, match", [
    (lambda: Topology.uniform(0, 1.0),
     "^jaxcc.Topology.uniform: number of ranks must be an integer >= 1, got 0"),
    (lambda: Topology.uniform(2, 0.0),
     r"^jaxcc.Topology.uniform: bandwidth must be a finite number > 0 \(bytes/s\), got 0.0"),
    (lambda: Topology.uniform(2, -1.0), "got -1.0"),
    (lambda: Topology.uniform(2, 1.0, latency=-1),
     r"^jaxcc.Topology.uniform: latency must be a finite number >= 0"),
    (lambda: Topology.uniform(2, 1.0).with_straggler(0, 0.0),
     r"^jaxcc.Topology.with_straggler: fraction must be in \(0, 1\]"),
    (lambda: Topology.uniform(2, 1.0).with_straggler(0, 1.5), "got 1.5"),
    (lambda: Topology.uniform(2, 1.0).with_straggler(2, 0.5),
     r"^jaxcc.Topology.with_straggler: rank must be in \[0, 2\)"),
    (lambda: Topology.from_bandwidths([1.0, float("nan")]),
     r"^jaxcc.Topology.from_bandwidths: send_bandwidth\[1\] must be a finite number > 0"),
    (lambda: Topology.from_bandwidths([1.0, 2.0], recv_bandwidths=[1.0]),
     "^jaxcc.Topology.from_bandwidths: send_bandwidth, recv_bandwidth and latency need one entry"),
    (lambda: Topology.clusters([2, 0], 1.0, 1.0), "^jaxcc.Topology.clusters: number of ranks"),
    (lambda: Topology.clusters([2, 2], [1.0, "fast"], 1.0),
     r"^jaxcc.Topology.clusters: intra_bandwidth\[1\] must be a finite number > 0"),
    (lambda: Topology.clusters([2, 2], [1.0], 1.0), "^jaxcc.Topology.clusters: 2 clusters but 1"),
    (lambda: Topology((1.0,), (1.0,), (-1.0,)), r"^jaxcc.Topology: latency\[0\] must be"),
    (lambda: Topology((), (), ()), "^jaxcc.Topology: needs at least one rank"),
])
def test_validation(make, match):
  with pytest.raises(ValueError, match=match):
    make()
