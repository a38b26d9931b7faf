"""Topology: the ranks of one mesh axis and the network each rank sits behind.

Each rank has a full-duplex port to a non-blocking switch: it sends at
``send_bandwidth[i]`` and receives at ``recv_bandwidth[i]`` bytes/s at the
same time. A message from ``i`` to ``j`` arrives ``max(latency[i],
latency[j])`` seconds after its last byte left the switch. Ranks may belong to
clusters (groups of ranks with a fast fabric between them).

A Topology is immutable and hashable: it is static at trace time, so a changed
network means one re-trace.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence


def _check_positive(name: str, values: Sequence[float]) -> tuple[float, ...]:
  out = tuple(float(v) for v in values)
  for i, v in enumerate(out):
    if not math.isfinite(v) or v <= 0:
      raise ValueError(f"Topology: {name}[{i}] must be a finite number > 0 (bytes/s), got {v!r}")
  return out


@dataclasses.dataclass(frozen=True)
class Topology:
  """Per-rank bandwidth (bytes/s), latency (s) and optional cluster ids.

  Build one with ``uniform``, ``from_bandwidths`` or ``clusters``, then mark
  slow ranks with ``with_straggler``.
  """

  send_bandwidth: tuple[float, ...]
  recv_bandwidth: tuple[float, ...]
  latency: tuple[float, ...]
  cluster: tuple[int, ...] | None = None

  def __post_init__(self):
    send = _check_positive("send_bandwidth", self.send_bandwidth)
    recv = _check_positive("recv_bandwidth", self.recv_bandwidth)
    lat = tuple(float(v) for v in self.latency)
    if len(send) < 1:
      raise ValueError("Topology: needs at least one rank (p >= 1), got 0")
    if not len(send) == len(recv) == len(lat):
      raise ValueError(
          f"Topology: send_bandwidth, recv_bandwidth and latency need one entry per rank, "
          f"got {len(send)}, {len(recv)} and {len(lat)}")
    for i, v in enumerate(lat):
      if not math.isfinite(v) or v < 0:
        raise ValueError(f"Topology: latency[{i}] must be a finite number >= 0 (seconds), got {v!r}")
    cluster = self.cluster
    if cluster is not None:
      cluster = tuple(int(c) for c in cluster)
      if len(cluster) != len(send):
        raise ValueError(f"Topology: cluster needs one id per rank ({len(send)}), got {len(cluster)}")
    object.__setattr__(self, "send_bandwidth", send)
    object.__setattr__(self, "recv_bandwidth", recv)
    object.__setattr__(self, "latency", lat)
    object.__setattr__(self, "cluster", cluster)

  @classmethod
  def uniform(cls, p: int, bandwidth: float, latency: float = 0.0) -> Topology:
    """``p`` ranks, each with ``bandwidth`` bytes/s both ways and ``latency`` s."""
    p = _check_size(p)
    return cls((bandwidth,) * p, (bandwidth,) * p, (latency,) * p)

  @classmethod
  def from_bandwidths(cls, bandwidths: Sequence[float], latency: float = 0.0,
                      recv_bandwidths: Sequence[float] | None = None) -> Topology:
    """One rank per entry of ``bandwidths`` (send; receive too unless given)."""
    bandwidths = tuple(bandwidths)
    recv = bandwidths if recv_bandwidths is None else tuple(recv_bandwidths)
    return cls(bandwidths, recv, (latency,) * len(bandwidths))

  @classmethod
  def clusters(cls, sizes: Sequence[int], bandwidth: float | Sequence[float],
               latency: float = 0.0) -> Topology:
    """Ranks in consecutive clusters of ``sizes``; ``bandwidth`` per cluster or shared."""
    sizes = [_check_size(s) for s in sizes]
    bws = [bandwidth] * len(sizes) if isinstance(bandwidth, (int, float)) else list(bandwidth)
    if len(bws) != len(sizes):
      raise ValueError(f"Topology.clusters: {len(sizes)} clusters but {len(bws)} bandwidths")
    per_rank = [bw for bw, s in zip(bws, sizes) for _ in range(s)]
    ids = [c for c, s in enumerate(sizes) for _ in range(s)]
    return cls(tuple(per_rank), tuple(per_rank), (latency,) * len(per_rank), tuple(ids))

  def with_straggler(self, rank: int, fraction: float) -> Topology:
    """This topology with ``rank``'s port at ``fraction`` of its bandwidth both ways.

    Repeatable: each call marks one more straggler (or slows one further).
    """
    if not isinstance(rank, int) or not 0 <= rank < self.size:
      raise ValueError(f"Topology.with_straggler: rank must be in [0, {self.size}), got {rank!r}")
    if not (isinstance(fraction, (int, float)) and 0 < fraction <= 1):
      raise ValueError(f"Topology.with_straggler: fraction must be in (0, 1], got {fraction!r}")
    send = list(self.send_bandwidth)
    recv = list(self.recv_bandwidth)
    send[rank] *= fraction
    recv[rank] *= fraction
    return dataclasses.replace(self, send_bandwidth=tuple(send), recv_bandwidth=tuple(recv))

  @property
  def size(self) -> int:
    return len(self.send_bandwidth)

  @property
  def bandwidth(self) -> tuple[float, ...]:
    """Per-rank port bandwidth: the smaller of send and receive."""
    return tuple(min(s, r) for s, r in zip(self.send_bandwidth, self.recv_bandwidth))

  def message_latency(self, src: int, dst: int) -> float:
    return max(self.latency[src], self.latency[dst])

  def stragglers(self) -> dict[int, float]:
    """Ranks slower than the fastest, as rank -> fraction of the fastest port."""
    bw = self.bandwidth
    top = max(bw)
    return {i: b / top for i, b in enumerate(bw) if b < top}


def _check_size(p) -> int:
  if not isinstance(p, int) or isinstance(p, bool) or p < 1:
    raise ValueError(f"Topology: number of ranks must be an integer >= 1, got {p!r}")
  return p
