"""Topology: the ranks of one mesh axis and the network each rank sits behind.

Each rank has a full-duplex port to a non-blocking switch: it sends at
``send_bandwidth[i]`` and receives at ``recv_bandwidth[i]`` bytes/s at the
same time. A message from ``i`` to ``j`` arrives ``max(latency[i],
latency[j])`` seconds after its last byte left the switch. Ranks may belong to
clusters (consecutive groups of ranks with a fabric of their own): then each
rank has a second port, across clusters, and messages between clusters go
through the cross-cluster ports of both ends (``Topology.clusters``).

Every message also holds each port it passes for a fixed time beside its
bytes, ``message_cost[i]`` seconds at rank ``i``'s ports: the per-message work
of the transport (a system call, a frame, a wake-up of the progress thread),
which a deeper pipeline pays once more per piece (``MESSAGE_COST``).

A Topology is immutable and hashable: it is static at trace time, so a changed
network means one re-trace.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

# Seconds a message holds each port it passes beside its bytes, by default: jaxcc's TCP
# transport's (benchmarks/message_cost.py). 0 is the fluid model (only bytes and latency).
MESSAGE_COST = 30e-6


@dataclasses.dataclass(frozen=True)
class Topology:
  """Per-rank bandwidth (bytes/s), latency (s), message cost (s) and optional clusters.

  Build one with ``uniform``, ``from_bandwidths`` or ``clusters``, then mark
  slow ranks with ``with_straggler``. ``message_cost`` is per rank, for its
  ports at every level (None: ``MESSAGE_COST`` for every rank). In a topology of clusters
  ``send_bandwidth``, ``recv_bandwidth`` and ``latency`` are the ports inside a
  rank's cluster and ``inter_*`` its cross-cluster port (0: no cross-cluster
  NIC; a border rank of its cluster relays its cross-cluster traffic,
  ``relay``). Flat topologies have ``cluster`` and the ``inter_*`` fields None.
  """

  send_bandwidth: tuple[float, ...]
  recv_bandwidth: tuple[float, ...]
  latency: tuple[float, ...]
  cluster: tuple[int, ...] | None = None
  inter_send_bandwidth: tuple[float, ...] | None = None
  inter_recv_bandwidth: tuple[float, ...] | None = None
  inter_latency: tuple[float, ...] | None = None
  message_cost: tuple[float, ...] | None = None

  def __post_init__(self):
    names = ("send_bandwidth", "recv_bandwidth", "latency", "cluster", "inter_send_bandwidth",
             "inter_recv_bandwidth", "inter_latency")
    fields = _fields("jaxcc.Topology", *(getattr(self, n) for n in names))
    for name, value in zip(names, fields):
      object.__setattr__(self, name, value)
    object.__setattr__(self, "message_cost",
                       _message_cost("jaxcc.Topology", self.message_cost, self.size))

  @classmethod
  def uniform(cls, p: int, bandwidth: float, latency: float = 0.0,
              message_cost: float = MESSAGE_COST) -> Topology:
    """``p`` ranks, each with ``bandwidth`` bytes/s both ways, ``latency`` s and
    ``message_cost`` s per message."""
    api = "jaxcc.Topology.uniform"
    p = _check_size(api, p)
    bandwidth = _bandwidth(api, "bandwidth", bandwidth)
    latency = _latency(api, "latency", latency)
    return cls((bandwidth,) * p, (bandwidth,) * p, (latency,) * p,
               message_cost=_message_cost(api, message_cost, p))

  @classmethod
  def from_bandwidths(cls, bandwidths: Sequence[float], latency: float = 0.0,
                      recv_bandwidths: Sequence[float] | None = None,
                      message_cost: float | Sequence[float] = MESSAGE_COST) -> Topology:
    """One rank per entry of ``bandwidths`` (send; receive too unless given); ``message_cost``
    one number or one per rank."""
    api = "jaxcc.Topology.from_bandwidths"
    bandwidths = tuple(bandwidths)
    recv = bandwidths if recv_bandwidths is None else tuple(recv_bandwidths)
    latency = _latency(api, "latency", latency)
    return cls(*_fields(api, bandwidths, recv, (latency,) * len(bandwidths), None, None, None,
                        None), message_cost=_message_cost(api, message_cost, len(bandwidths)))

  @classmethod
  def clusters(cls, sizes: Sequence[int], intra_bandwidth: float | Sequence[float],
               inter_bandwidth: float | Sequence[float], latency: float = 0.0,
               inter_latency: float | None = None,
               message_cost: float = MESSAGE_COST) -> Topology:
    """Ranks in consecutive clusters of ``sizes``, with a port inside and one across clusters.

    Args:
      sizes: ranks per cluster, consecutive along the axis (any sizes >= 1).
      intra_bandwidth: bytes/s of each rank's port inside its cluster: one
        number, or one per cluster.
      inter_bandwidth: bytes/s of each rank's cross-cluster port: one number,
        one per cluster or one per rank; 0 for a rank without a cross-cluster
        NIC (a border rank of its cluster relays for it). Every cluster needs
        a border rank (inter_bandwidth > 0) when there are several clusters.
      latency: seconds from port to port inside a cluster.
      inter_latency: seconds across clusters (default ``latency``).
      message_cost: seconds a message holds each port it passes, at every level.
    """
    api = "jaxcc.Topology.clusters"
    sizes = [_check_size(api, s) for s in _sequence(api, "sizes", sizes)]
    if not sizes:
      raise ValueError(f"{api}: sizes must name at least one cluster, got {sizes!r}")
    p = sum(sizes)
    ids = [c for c, s in enumerate(sizes) for _ in range(s)]
    intra = _per_rank(api, "intra_bandwidth", intra_bandwidth, sizes, ids, per_rank=False)
    intra = [_bandwidth(api, name, v) for name, v in intra]
    inter = _per_rank(api, "inter_bandwidth", inter_bandwidth, sizes, ids, per_rank=True)
    inter = [_port(api, name, v) for name, v in inter]
    latency = _latency(api, "latency", latency)
    inter_latency = latency if inter_latency is None else _latency(api, "inter_latency",
                                                                   inter_latency)
    return cls(tuple(intra), tuple(intra), (latency,) * p, tuple(ids), tuple(inter),
               tuple(inter), (inter_latency,) * p, _message_cost(api, message_cost, p))

  def with_straggler(self, rank: int, fraction: float, level: str = "both") -> Topology:
    """This topology with ``rank``'s port at ``fraction`` of its bandwidth both ways.

    Repeatable: each call marks one more straggler (or slows one further).
    ``level`` picks the port in a topology of clusters: "intra" (inside the
    cluster), "inter" (across clusters) or "both".
    """
    api = "jaxcc.Topology.with_straggler"
    if not isinstance(rank, int) or not 0 <= rank < self.size:
      raise ValueError(f"{api}: rank must be in [0, {self.size}), got {rank!r}")
    if not (isinstance(fraction, (int, float)) and 0 < fraction <= 1):
      raise ValueError(f"{api}: fraction must be in (0, 1], got {fraction!r}")
    if level not in ("intra", "inter", "both"):
      raise ValueError(f"{api}: level must be 'intra', 'inter' or 'both', got {level!r}")
    if level == "inter" and self.cluster is None:
      raise ValueError(f"{api}: level='inter' needs a topology of clusters "
                       f"(jaxcc.Topology.clusters); this one is flat")
    if level == "inter" and self.inter_bandwidth[rank] == 0:
      raise ValueError(f"{api}: rank {rank} has no cross-cluster port to slow (its "
                       f"inter_bandwidth is 0)")
    changes = {}
    names = (("send_bandwidth", "recv_bandwidth") if level != "inter" else ())
    if level != "intra" and self.cluster is not None:
      names += ("inter_send_bandwidth", "inter_recv_bandwidth")
    for name in names:
      values = list(getattr(self, name))
      values[rank] *= fraction
      changes[name] = tuple(values)
    return dataclasses.replace(self, **changes)

  @property
  def size(self) -> int:
    return len(self.send_bandwidth)

  @property
  def bandwidth(self) -> tuple[float, ...]:
    """Per-rank port bandwidth (inside its cluster): the smaller of send and receive."""
    return tuple(min(s, r) for s, r in zip(self.send_bandwidth, self.recv_bandwidth))

  @property
  def inter_bandwidth(self) -> tuple[float, ...] | None:
    """Per-rank cross-cluster port: the smaller of send and receive (0: none); None if flat."""
    if self.cluster is None:
      return None
    return tuple(min(s, r) for s, r in zip(self.inter_send_bandwidth, self.inter_recv_bandwidth))

  @property
  def ports(self) -> tuple[float, ...]:
    """Every port a schedule may move bytes through: each rank's send and receive port, and
    across clusters its cross-cluster ones (those of rate 0 left out)."""
    ports = self.send_bandwidth + self.recv_bandwidth
    if self.cluster is not None:
      ports += tuple(b for b in self.inter_send_bandwidth + self.inter_recv_bandwidth if b > 0)
    return ports

  @property
  def num_clusters(self) -> int:
    return 1 if self.cluster is None else self.cluster[-1] + 1

  def cluster_ranks(self, c: int) -> tuple[int, ...]:
    """The ranks of cluster ``c`` (all ranks in a flat topology)."""
    if self.cluster is None:
      return tuple(range(self.size))
    return tuple(r for r, k in enumerate(self.cluster) if k == c)

  def border_ranks(self, c: int) -> tuple[int, ...]:
    """The ranks of cluster ``c`` with a cross-cluster port."""
    if self.cluster is None:
      return self.cluster_ranks(c)
    return tuple(r for r in self.cluster_ranks(c) if self.inter_bandwidth[r] > 0)

  def same_cluster(self, src: int, dst: int) -> bool:
    return self.cluster is None or self.cluster[src] == self.cluster[dst]

  def relay(self, rank: int) -> int:
    """The border rank that carries ``rank``'s cross-cluster traffic (itself if it has a port).

    The ranks of a cluster without a port go to its border ranks in turn: the
    k-th of them to border ``k mod (number of borders)``.
    """
    if self.num_clusters == 1 or self.inter_bandwidth[rank] > 0:
      return rank  # nothing crosses, or the rank has its own port
    c = self.cluster[rank]
    borders = self.border_ranks(c)
    portless = [r for r in self.cluster_ranks(c) if self.inter_bandwidth[r] == 0]
    return borders[portless.index(rank) % len(borders)]

  def message_latency(self, src: int, dst: int) -> float:
    if self.same_cluster(src, dst):
      return max(self.latency[src], self.latency[dst])
    return max(self.inter_latency[src], self.inter_latency[dst])

  def stragglers(self) -> dict[int, float]:
    """Ranks slower than the fastest, as rank -> fraction of the fastest port."""
    bw = self.bandwidth
    top = max(bw)
    return {i: b / top for i, b in enumerate(bw) if b < top}


def _fields(api: str, send, recv, latency, cluster, inter_send, inter_recv, inter_latency):
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
  inter = (inter_send, inter_recv, inter_latency)
  if cluster is None:
    if any(v is not None for v in inter):
      raise ValueError(f"{api}: cross-cluster ports (inter_*) need cluster ids")
    return send, recv, latency, None, None, None, None
  if any(v is None for v in inter):
    raise ValueError(f"{api}: a topology of clusters needs inter_send_bandwidth, "
                     f"inter_recv_bandwidth and inter_latency (jaxcc.Topology.clusters)")
  cluster = tuple(int(c) for c in cluster)
  p = len(send)
  if len(cluster) != p:
    raise ValueError(f"{api}: cluster needs one id per rank ({p}), got {len(cluster)}")
  if cluster[0] != 0 or any(b - a not in (0, 1) for a, b in zip(cluster, cluster[1:])):
    raise ValueError(f"{api}: cluster ids must number consecutive clusters 0, 1, ... along "
                     f"the axis, got {cluster}")
  inter_send = tuple(_port(api, f"inter_send_bandwidth[{i}]", v) for i, v in enumerate(inter_send))
  inter_recv = tuple(_port(api, f"inter_recv_bandwidth[{i}]", v) for i, v in enumerate(inter_recv))
  inter_latency = tuple(_latency(api, f"inter_latency[{i}]", v)
                        for i, v in enumerate(inter_latency))
  if not len(inter_send) == len(inter_recv) == len(inter_latency) == p:
    raise ValueError(f"{api}: inter_send_bandwidth, inter_recv_bandwidth and inter_latency "
                     f"need one entry per rank ({p})")
  for r in range(p):
    if (inter_send[r] == 0) != (inter_recv[r] == 0):
      raise ValueError(f"{api}: rank {r} has a cross-cluster port one way only "
                       f"(inter_send_bandwidth {inter_send[r]}, inter_recv_bandwidth "
                       f"{inter_recv[r]}); give both or neither")
  if cluster[-1] > 0:
    for c in range(cluster[-1] + 1):
      if not any(inter_send[r] > 0 for r in range(p) if cluster[r] == c):
        raise ValueError(f"{api}: cluster {c} has no border rank: every rank of it has "
                         f"inter_bandwidth 0, so nothing can leave it; give at least one "
                         f"of its ranks a cross-cluster port")
  return send, recv, latency, cluster, inter_send, inter_recv, inter_latency


def _per_rank(api, name, value, sizes, ids, per_rank):
  """``value`` (one number, one per cluster, or one per rank if ``per_rank``) per rank, each
  with the name an error gives it."""
  if isinstance(value, (int, float)) and not isinstance(value, bool):
    return [(name, value)] * len(ids)
  values = _sequence(api, name, value)
  if len(values) == len(sizes):
    return [(f"{name}[{c}]", values[c]) for c in ids]
  if per_rank and len(values) == len(ids):
    return [(f"{name}[{r}]", v) for r, v in enumerate(values)]
  expected = (f"one per cluster ({len(sizes)}) or one per rank ({len(ids)})" if per_rank
              else f"one per cluster ({len(sizes)})")
  raise ValueError(f"{api}: {len(sizes)} clusters but {len(values)} values of {name}; "
                   f"give one number or {expected}")


def _sequence(api, name, value) -> list:
  try:
    return list(value)
  except TypeError:
    raise ValueError(f"{api}: {name} must be a number or a sequence, got {value!r}") from None


def _port(api: str, name: str, value) -> float:
  """A cross-cluster port: bytes/s > 0, or 0 for none."""
  v = _as_float(value)
  if v == 0:
    return 0.0
  return _bandwidth(api, name, value)


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


def _message_cost(api: str, value, p: int) -> tuple[float, ...]:
  """Per rank seconds >= 0: ``value`` one number (None: ``MESSAGE_COST``) or one per rank."""
  if value is None:
    value = MESSAGE_COST
  if isinstance(value, (int, float)) and not isinstance(value, bool):
    value = (value,) * p
  values = _sequence(api, "message_cost", value)
  if len(values) != p:
    raise ValueError(f"{api}: message_cost needs one number or one per rank ({p}), got "
                     f"{len(values)}")
  return tuple(_latency(api, f"message_cost[{i}]", v) for i, v in enumerate(values))


def _check_size(api: str, p) -> int:
  if not isinstance(p, int) or isinstance(p, bool) or p < 1:
    raise ValueError(f"{api}: number of ranks must be an integer >= 1, got {p!r}")
  return p
