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
    fields = _fields("jaxcc.Topology", self.send_bandwidth, self.recv_bandwidth, self.latency,
                     self.cluster)
    for name, value in zip(("send_bandwidth", "recv_bandwidth", "latency", "cluster"), fields):
      object.__setattr__(self, name, value)

  @classmethod
  def uniform(cls, p: int, bandwidth: float, latency: float = 0.0) -> Topology:
    """``p`` ranks, each with ``bandwidth`` bytes/s both ways and ``latency`` s."""
    api = "jaxcc.Topology.uniform"
    p = _check_size(api, p)
    bandwidth = _bandwidth(api, "bandwidth", bandwidth)
    latency = _latency(api, "latency", latency)
    return cls((bandwidth,) * p, (bandwidth,) * p, (latency,) * p)

  @classmethod
  def from_bandwidths(cls, bandwidths: Sequence[float], latency: float = 0.0,
                      recv_bandwidths: Sequence[float] | None = None) -> Topology:
    """One rank per entry of ``bandwidths`` (send; receive too unless given)."""
    api = "jaxcc.Topology.from_bandwidths"
    bandwidths = tuple(bandwidths)
    recv = bandwidths if recv_bandwidths is None else tuple(recv_bandwidths)
    latency = _latency(api, "latency", latency)
    return cls(*_fields(api, bandwidths, recv, (latency,) * len(bandwidths), None))

  @classmethod
  def clusters(cls, sizes: Sequence[int], bandwidth: float | Sequence[float],
               latency: float = 0.0) -> Topology:
    """Ranks in consecutive clusters of ``sizes``; ``bandwidth`` per cluster or shared."""
    api = "jaxcc.Topology.clusters"
    sizes = [_check_size(api, s) for s in sizes]
    if isinstance(bandwidth, (int, float)):
      bws = [_bandwidth(api, "bandwidth", bandwidth)] * len(sizes)
    else:
      bws = [_bandwidth(api, f"bandwidth[{c}]", bw) for c, bw in enumerate(bandwidth)]
    if len(bws) != len(sizes):
      raise ValueError(f"{api}: {len(sizes)} clusters but {len(bws)} bandwidths")
    latency = _latency(api, "latency", latency)
    per_rank = [bw for bw, s in zip(bws, sizes) for _ in range(s)]
    ids = [c for c, s in enumerate(sizes) for _ in range(s)]
    return cls(tuple(per_rank), tuple(per_rank), (latency,) * len(per_rank), tuple(ids))

  def with_straggler(self, rank: int, fraction: float) -> Topology:
    """This topology with ``rank``'s port at ``fraction`` of its bandwidth both ways.

    Repeatable: each call marks one more straggler (or slows one further).
    """
    api = "jaxcc.Topology.with_straggler"
    if not isinstance(rank, int) or not 0 <= rank < self.size:
      raise ValueError(f"{api}: rank must be in [0, {self.size}), got {rank!r}")
    if not (isinstance(fraction, (int, float)) and 0 < fraction <= 1):
      raise ValueError(f"{api}: fraction must be in (0, 1], got {fraction!r}")
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


def _fields(api: str, send, recv, latency, cluster):
  """The fields of a Topology, checked and as tuples of floats (cluster ids: ints)."""
  send = tuple(_bandwidth(api, f"send_bandwidth[{i}]", v) for i, v in enumerate(send))
  recv = tuple(_bandwidth(api, f"recv_bandwidth[{i}]", v) for i, v in enumerate(recv))
  latency = tuple(_latency(api, f"latency[{i}]", v) for i, v in enumerate(latency))
  if len(send) < 1:
    raise ValueError(f"{api}: needs at least one rank (p >= 1), got 0")
  if not len(send) == len(recv) == len(latency):
    raise ValueError(
        f"{api}: send_bandwidth, recv_bandwidth and latency need one entry per rank, "
        f"got {len(send)}, {len(recv)} and {len(latency)}")
  if cluster is not None:
    cluster = tuple(int(c) for c in cluster)
    if len(cluster) != len(send):
      raise ValueError(f"{api}: cluster needs one id per rank ({len(send)}), got {len(cluster)}")
  return send, recv, latency, cluster


def _bandwidth(api: str, name: str, value) -> float:
  v = _as_float(value)
  if not math.isfinite(v) or v <= 0:
    raise ValueError(f"{api}: {name} must be a finite number > 0 (bytes/s), got {value!r}")
  return v


def _latency(api: str, name: str, value) -> float:
  v = _as_float(value)
  if not math.isfinite(v) or v < 0:
    raise ValueError(f"{api}: {name} must be a finite number >= 0 (seconds), got {value!r}")
  return v


def _as_float(value) -> float:
  """``float(value)``, NaN for what is not a number."""
  try:
    return float(value)
  except (TypeError, ValueError):
    return math.nan


def _check_size(api: str, p) -> int:
  if not isinstance(p, int) or isinstance(p, bool) or p < 1:
    raise ValueError(f"{api}: number of ranks must be an integer >= 1, got {p!r}")
  return p
