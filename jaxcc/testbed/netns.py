"""An emulated cluster on one Linux host: a network namespace per rank, shaped by ``tc``.

Each rank ``i`` gets namespace ``jaxcc-<tag>-<i>`` with ``eth0`` at
``10.77.0.<i+1>/24``, the other end of its veth pair on one bridge. The ranks
may form clusters (consecutive groups along the axis); then each rank has two
ports on its one veth: an HTB qdisc with two classes that never borrow, one
for the rank's own cluster and one for the others, chosen by one ``u32``
filter per address of another cluster. The egress (namespace side, by
destination) and the ingress (bridge side, by source) are shaped alike, so a
rank sends and receives at ``rate`` inside its cluster and at ``inter_rate``
across, both at once; each class counts its bytes (``level_bytes``). A flat
cluster sends everything through the first class. ``latency`` adds a one-way
netem delay to every egress.

Every namespace's default congestion control is cubic where the kernel has
it, so that XLA's gloo sockets behave like jaxcc's (research/testbed.md: BBR
shares a slow rank's link badly); a namespace may only default to an
algorithm the host allows, so cubic is added to the host's
``tcp_allowed_congestion_control`` (and left there: it only lets unprivileged
sockets pick it). Needs root and iproute2 (``ip``, ``tc``).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import subprocess
from collections.abc import Mapping, Sequence

from jaxcc.topology import Topology

PREFIX = "jaxcc-"
SUBNET = "10.77.0"
NETNS_ETC = "/etc/netns"
_CONGESTION = "/proc/sys/net/ipv4/tcp_congestion_control"  # a namespace's default
_CONGESTION_LIST = "/proc/sys/net/ipv4/tcp_{}_congestion_control"  # available, allowed
_BURST = "256kb"  # measured in testbed.md: smaller bursts cost CPU, larger ones skew short runs
_CLASSES = {"intra": "1:10", "inter": "1:20"}  # the HTB classes of the two ports
_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}


def parse_rate(rate: str | float) -> float:
  """Bits per second of a ``tc`` rate such as ``"200mbit"``, or of a number (bit/s)."""
  if isinstance(rate, (int, float)):
    bits = float(rate)
  else:
    m = re.fullmatch(r"\s*([\d.]+)\s*([kmg]?)bit\s*", rate.lower())
    if not m:
      raise ValueError(f"testbed: rate must look like '200mbit' or be bit/s, got {rate!r}")
    bits = float(m.group(1)) * _UNITS[m.group(2)]
  if not bits > 0:
    raise ValueError(f"testbed: rate must be positive, got {rate!r}")
  return bits


def require_privileges() -> None:
  """Raise RuntimeError naming what is missing when the testbed cannot be built here."""
  missing = [f"the '{tool}' command (iproute2)" for tool in ("ip", "tc") if not shutil.which(tool)]
  if os.geteuid() != 0:
    missing.insert(0, "root (network namespaces need CAP_NET_ADMIN and CAP_SYS_ADMIN)")
  if missing:
    raise RuntimeError("jaxcc.testbed needs " + " and ".join(missing))


def _run(*cmd: str, netns: str | None = None) -> str:
  if netns is not None:
    cmd = ("ip", "netns", "exec", netns, *cmd)
  done = subprocess.run(cmd, capture_output=True, text=True, check=False)
  if done.returncode:
    raise RuntimeError(f"testbed: `{' '.join(cmd)}` failed ({done.returncode}): "
                       f"{done.stderr.strip()}")
  return done.stdout


def _names() -> tuple[list[str], list[str]]:
  """Namespaces and host links named jaxcc-*."""
  spaces = [line.split()[0] for line in _run("ip", "netns", "list").splitlines() if line.strip()]
  links = [line.split(":")[1].strip().split("@")[0]
           for line in _run("ip", "-o", "link", "show").splitlines()]
  return [s for s in spaces if s.startswith(PREFIX)], [k for k in links if k.startswith(PREFIX)]


def cleanup_stale() -> list[str]:
  """Remove every namespace, link and /etc/netns entry named jaxcc-*; return their names.

  Meant for leftovers of crashed runs: it also removes a cluster still in use.
  """
  require_privileges()
  spaces, links = _names()
  etc = [e for e in os.listdir(NETNS_ETC) if e.startswith(PREFIX)] if os.path.isdir(NETNS_ETC) else []
  for s in spaces:
    subprocess.run(["ip", "netns", "delete", s], capture_output=True, check=False)
  for link in links:
    subprocess.run(["ip", "link", "delete", link], capture_output=True, check=False)
  for e in etc:
    shutil.rmtree(os.path.join(NETNS_ETC, e), ignore_errors=True)
  return sorted(set(spaces + links + etc))


class Cluster:
  """``n`` emulated hosts on one bridge, as a context manager that always tears down.

  Args:
    n: number of hosts (ranks), at most 254.
    rate: each host's link rate both ways (inside its cluster), a ``tc`` rate
      (``"200mbit"``) or bit/s.
    stragglers: ``{rank: fraction}``: those hosts get ``fraction`` of ``rate``.
    latency: optional one-way delay added to each host's egress, a ``tc`` time (``"5ms"``).
    mtu: MTU of the veths and the bridge.
    clusters: sizes of consecutive clusters along the ranks (summing to ``n``);
      None: one flat cluster.
    inter_rate: each host's rate both ways to hosts of other clusters (with
      ``clusters``; default ``rate``).
    inter_stragglers: ``{rank: fraction}``: those hosts' cross-cluster rate at
      ``fraction`` of ``inter_rate``.

  Example:
    with Cluster(8, clusters=(4, 4), inter_rate="20mbit", inter_stragglers={4: 0.5}) as c:
      processes = jaxcc.launcher.launch("worker.py", cluster=c, timeout_s=120)
      tx, rx = c.level_bytes(4)["inter"]
  """

  def __init__(self, n: int, rate: str | float = "200mbit",
               stragglers: Mapping[int, float] | None = None,
               latency: str | None = None, mtu: int = 9000,
               clusters: Sequence[int] | None = None, inter_rate: str | float | None = None,
               inter_stragglers: Mapping[int, float] | None = None):
    if not 1 <= n <= 254:
      raise ValueError(f"testbed: n must be in [1, 254], got {n}")
    stragglers, inter_stragglers = dict(stragglers or {}), dict(inter_stragglers or {})
    for r, f in [*stragglers.items(), *inter_stragglers.items()]:
      if not 0 <= r < n or not 0 < f <= 1:
        raise ValueError(f"testbed: straggler {r}: {f} needs a rank in [0, {n}) and a "
                         "fraction in (0, 1]")
    if clusters is not None:
      clusters = tuple(clusters)
      if not clusters or any(not isinstance(s, int) or s < 1 for s in clusters) or \
          sum(clusters) != n:
        raise ValueError(f"testbed: clusters must be sizes >= 1 that sum to n = {n}, "
                         f"got {clusters!r}")
    elif inter_rate is not None or inter_stragglers:
      raise ValueError("testbed: inter_rate and inter_stragglers need clusters (their sizes)")
    self.n, self.latency, self.mtu, self.clusters = n, latency, mtu, clusters
    self.rates = tuple(parse_rate(rate) * stragglers.get(i, 1.0) for i in range(n))
    inter = parse_rate(rate if inter_rate is None else inter_rate)
    self.inter_rates = None if clusters is None else tuple(
        inter * inter_stragglers.get(i, 1.0) for i in range(n))
    self.cluster_of = tuple(c for c, size in enumerate(clusters or (n,)) for _ in range(size))
    self.tag = secrets.token_hex(2)
    self.bridge = f"{PREFIX}{self.tag}-br"

  def netns(self, rank: int) -> str:
    """The namespace of host ``rank``."""
    return f"{PREFIX}{self.tag}-{rank}"

  def address(self, rank: int) -> str:
    """The IPv4 address of host ``rank``."""
    return f"{SUBNET}.{rank + 1}"

  def _veth(self, rank: int) -> str:
    return f"{self.netns(rank)}v"  # the bridge-side end; the namespace side is eth0

  @property
  def topology(self) -> Topology:
    """The cluster as a ``jaxcc.Topology`` (bytes/s per rank)."""
    if self.clusters is None:
      return Topology.from_bandwidths([r / 8 for r in self.rates])
    intra, inter = tuple(r / 8 for r in self.rates), tuple(r / 8 for r in self.inter_rates)
    return Topology(intra, intra, (0.0,) * self.n, self.cluster_of, inter, inter, (0.0,) * self.n)

  def link_rate(self, src: int, dst: int) -> float:
    """Bit/s from host ``src`` to host ``dst``: the slower of their ports on that level."""
    if self.cluster_of[src] == self.cluster_of[dst]:
      return min(self.rates[src], self.rates[dst])
    return min(self.inter_rates[src], self.inter_rates[dst])

  def bytes(self, rank: int) -> tuple[int, int]:
    """(sent, received) bytes of host ``rank`` so far, headers included, from kernel counters."""
    stats = f"/sys/class/net/{self._veth(rank)}/statistics"
    counts = []
    for name in ("rx_bytes", "tx_bytes"):  # the bridge side sees the host's traffic mirrored
      with open(f"{stats}/{name}") as f:
        counts.append(int(f.read()))
    return counts[0], counts[1]

  def level_bytes(self, rank: int) -> dict[str, tuple[int, int]]:
    """``{"intra": (sent, received), "inter": (sent, received)}`` bytes of host ``rank`` so far.

    Frames as the kernel's qdiscs counted them (headers and ACKs included);
    "inter" is traffic to and from other clusters, (0, 0) in a flat cluster.
    """
    sent = band_bytes("eth0", netns=self.netns(rank))
    received = band_bytes(self._veth(rank))
    return {level: (sent[level], received[level]) for level in _CLASSES}

  def __enter__(self) -> Cluster:
    require_privileges()
    try:
      self._build()
    except BaseException:
      self.close()
      raise
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def _shape(self, dev: str, rank: int, netns: str | None) -> None:
    """Two classes on ``dev``: its cluster at ``rates[rank]``, the others at ``inter_rates[rank]``.

    ``netns`` None is the bridge side, which classifies by source address.
    """
    _run("tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10",
         netns=netns)
    inter = self.rates[rank] if self.inter_rates is None else self.inter_rates[rank]
    for level, rate in (("intra", self.rates[rank]), ("inter", inter)):
      _run("tc", "class", "add", "dev", dev, "parent", "1:", "classid", _CLASSES[level],
           *_htb(rate), netns=netns)
      if self.latency is not None and netns is not None:
        try:
          _run("tc", "qdisc", "add", "dev", dev, "parent", _CLASSES[level], "netem", "delay",
               self.latency, netns=netns)
        except RuntimeError as e:
          raise RuntimeError(
              f"testbed: latency needs the kernel's netem qdisc (sch_netem): {e}") from e
    side = "dst" if netns is not None else "src"
    for other in range(self.n):
      if self.cluster_of[other] != self.cluster_of[rank]:
        _run("tc", "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1",
             "u32", "match", "ip", side, f"{self.address(other)}/32", "flowid",
             _CLASSES["inter"], netns=netns)

  def _build(self) -> None:
    mtu = str(self.mtu)
    cubic = _allow_cubic()
    _run("ip", "link", "add", self.bridge, "type", "bridge")
    hostname = socket.gethostname()
    for i in range(self.n):
      ns, veth = self.netns(i), self._veth(i)
      # gloo advertises the address the hostname resolves to: make it this host's.
      os.makedirs(os.path.join(NETNS_ETC, ns), exist_ok=True)
      with open(os.path.join(NETNS_ETC, ns, "hosts"), "w") as f:
        f.write(f"127.0.0.1 localhost\n{self.address(i)} {hostname}\n")
      _run("ip", "netns", "add", ns)
      _run("ip", "link", "add", veth, "mtu", mtu, "type", "veth", "peer", "name", "eth0",
           "mtu", mtu, "netns", ns)
      # One frame per skb: the token buckets charge whole GSO super-packets (up to 64 KB),
      # which makes a port's rate over a tenth of a second up to 10% off.
      _run("ip", "link", "set", veth, "gso_max_size", mtu)
      _run("ip", "link", "set", "eth0", "gso_max_size", mtu, netns=ns)
      _run("ip", "link", "set", veth, "master", self.bridge, "up")
      _run("ip", "link", "set", "lo", "up", netns=ns)
      if cubic:
        _run("sh", "-c", f"echo cubic > {_CONGESTION}", netns=ns)
      _run("ip", "addr", "add", f"{self.address(i)}/24", "dev", "eth0", netns=ns)
      _run("ip", "link", "set", "eth0", "up", netns=ns)
      self._shape("eth0", i, ns)
      self._shape(veth, i, None)
    _run("ip", "link", "set", self.bridge, "mtu", mtu, "up")

  def set_rate(self, rank: int, rate: str | float, level: str = "intra") -> None:
    """Change host ``rank``'s rate (both ways) on ``level`` ("intra" or "inter") while it runs."""
    if level not in ("intra", "inter") or (level == "inter" and self.inter_rates is None):
      raise ValueError(f"testbed: level must be 'intra' or, with clusters, 'inter'; got {level!r}")
    bits = parse_rate(rate)
    for dev, netns in (("eth0", self.netns(rank)), (self._veth(rank), None)):
      _run("tc", "class", "change", "dev", dev, "parent", "1:", "classid", _CLASSES[level],
           *_htb(bits), netns=netns)
    name = "rates" if level == "intra" else "inter_rates"
    values = list(getattr(self, name))
    values[rank] = bits
    setattr(self, name, tuple(values))

  def close(self) -> None:
    """Remove this cluster's namespaces, bridge and /etc/netns entries (idempotent)."""
    for i in range(self.n):  # the veth first: a namespace's devices go asynchronously
      subprocess.run(["ip", "link", "delete", self._veth(i)], capture_output=True, check=False)
      subprocess.run(["ip", "netns", "delete", self.netns(i)], capture_output=True, check=False)
      shutil.rmtree(os.path.join(NETNS_ETC, self.netns(i)), ignore_errors=True)
    subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True, check=False)


def band_bytes(dev: str = "eth0", netns: str | None = None) -> dict[str, int]:
  """``{"intra": bytes, "inter": bytes}`` that left ``dev`` to the own and to other clusters.

  ``netns`` None reads the current network namespace: a worker inside a
  testbed host counts its own sends with ``band_bytes()``.
  """
  text = _run("tc", "-s", "class", "show", "dev", dev, netns=netns)
  sent = dict(re.findall(r"class htb (\S+) .*\n\s*Sent (\d+) bytes", text))
  return {level: int(sent.get(classid, 0)) for level, classid in _CLASSES.items()}


def _htb(rate: float) -> tuple[str, ...]:
  """An HTB class at ``rate`` bit/s that never borrows (rate = ceil)."""
  bits = f"{int(rate)}bit"
  return ("htb", "rate", bits, "ceil", bits, "burst", _BURST, "cburst", _BURST,
          "quantum", "60000")


def _allow_cubic() -> bool:
  """Whether namespaces may default to cubic, adding it to the host's allowed list if needed."""
  def read(kind):
    with open(_CONGESTION_LIST.format(kind)) as f:
      return f.read().split()
  if "cubic" not in read("available"):
    return False
  allowed = read("allowed")
  if "cubic" not in allowed:
    with open(_CONGESTION_LIST.format("allowed"), "w") as f:
      f.write(" ".join(allowed + ["cubic"]))
  return True
