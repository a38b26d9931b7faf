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

Two modes build the same cluster (``mode``; ``JAXCC_TESTBED_MODE`` forces
one):

* "root": in the host's network namespace, as root.
* "rootless": for any user, inside an unprivileged user + network + mount
  namespace that a holder process (``unshare``) keeps alive; every command
  enters it with ``nsenter``, and it vanishes, with everything in it, when the
  holder is killed. ``/run/netns`` is a tmpfs of its own there.

A program runs as host ``i`` under ``command(i)``: in a mount namespace of its
own where ``/etc/hosts`` maps this host's name to the host's address (gloo
advertises the address the hostname resolves to), inside the host's network
namespace.

Every namespace's default congestion control is cubic where the kernel has
it, so that XLA's gloo sockets behave like jaxcc's (research/testbed.md: BBR
shares a slow rank's link badly); a namespace may only default to an
algorithm the host allows, so as root cubic is added to the host's
``tcp_allowed_congestion_control`` (and left there: it only lets unprivileged
sockets pick it). Needs iproute2 (``ip``, ``tc``) and util-linux
(``unshare``, ``nsenter``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Mapping, Sequence

from jaxcc._src import config
from jaxcc.topology import Topology

logger = logging.getLogger("jaxcc")

PREFIX = "jaxcc-"
SUBNET = "10.77.0"
_TOOLS = {"ip": "iproute2", "tc": "iproute2", "unshare": "util-linux", "nsenter": "util-linux"}
_SBIN = ("/usr/sbin", "/sbin")  # where iproute2 lives, outside a user's PATH on some systems
# Makes /run/netns a tmpfs of the namespace's own (over /run where it is missing), then waits.
_HOLD = ("mount -t tmpfs tmpfs /run/netns 2>/dev/null || "
         "{ mount -t tmpfs tmpfs /run && mkdir /run/netns; } && echo ready && exec sleep infinity")
# Runs "$@" in network namespace $2 with the hosts file $1 over /etc/hosts.
_AS_HOST = (f'PATH="$PATH:{":".join(_SBIN)}" && mount --bind "$1" /etc/hosts && ns=$2 && '
            'shift 2 && exec ip netns exec "$ns" "$@"')


def _environ() -> dict[str, str]:
  """This process' environment with the sbin directories at the end of PATH."""
  return dict(os.environ, PATH=os.pathsep.join([os.environ.get("PATH", ""), *_SBIN]))
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


def mode() -> str:
  """The mode a cluster is built in here: "root" or "rootless".

  Raises:
    RuntimeError: in one line, why neither works here and how to make it work.
  """
  path = _environ()["PATH"]
  missing = [f"'{tool}' ({package})" for tool, package in _TOOLS.items()
             if not shutil.which(tool, path=path)]
  if missing:
    raise RuntimeError("jaxcc.testbed needs the commands " + ", ".join(missing) +
                       ": install iproute2 and util-linux")
  wanted = config.testbed_mode()
  if wanted == "root" or (wanted == "auto" and os.geteuid() == 0):
    if os.geteuid() != 0:
      raise RuntimeError("jaxcc.testbed: JAXCC_TESTBED_MODE=root needs root; unset it to run "
                         "rootless")
    return "root"
  probe = subprocess.run(["unshare", "--user", "--map-root-user", "--net", "--mount", "true"],
                         capture_output=True, text=True, check=False)
  if probe.returncode:
    raise RuntimeError(
        "jaxcc.testbed needs root or unprivileged user namespaces, and `unshare --user "
        f"--map-root-user --net --mount true` fails here ({probe.stderr.strip()}): run as root, "
        "or enable them with `sysctl -w kernel.unprivileged_userns_clone=1 "
        "user.max_user_namespaces=15000` (and, where AppArmor restricts them, "
        "`sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`)")
  return "rootless"


def require_privileges() -> None:
  """Raise RuntimeError naming what is missing when the testbed cannot be built here."""
  mode()


def _run(*cmd: str, netns: str | None = None, enter: Sequence[str] = ()) -> str:
  """Run ``cmd`` (in ``netns``), entering the rootless namespace with ``enter``; its stdout."""
  if netns is not None:
    cmd = ("ip", "netns", "exec", netns, *cmd)
  cmd = (*enter, *cmd)
  done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=_environ())
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
  """Remove every namespace and host link named jaxcc-*; return their names.

  Meant for leftovers of crashed runs as root: it also removes a cluster
  still in use. Rootless clusters leave nothing behind (they vanish with
  their holder process), so without root there is nothing to remove.
  """
  if mode() != "root":
    return []
  spaces, links = _names()
  for s in spaces:
    subprocess.run(["ip", "netns", "delete", s], capture_output=True, check=False, env=_environ())
  for link in links:
    subprocess.run(["ip", "link", "delete", link], capture_output=True, check=False,
                   env=_environ())
  return sorted(set(spaces + links))


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
    self.mode: str | None = None  # "root" or "rootless" once entered
    self._holder: subprocess.Popen | None = None
    self._enter: tuple[str, ...] = ()  # the command prefix that enters the rootless namespace
    self._hosts: str | None = None  # the directory of the hosts' /etc/hosts files

  def netns(self, rank: int) -> str:
    """The namespace of host ``rank``."""
    return f"{PREFIX}{self.tag}-{rank}"

  def address(self, rank: int) -> str:
    """The IPv4 address of host ``rank``."""
    return f"{SUBNET}.{rank + 1}"

  def _veth(self, rank: int) -> str:
    return f"{self.netns(rank)}v"  # the bridge-side end; the namespace side is eth0

  def command(self, rank: int) -> list[str]:
    """The prefix that runs a command as host ``rank`` (``[*command(rank), "python", ...]``)."""
    return [*self._enter, "unshare", "--mount", "sh", "-c", _AS_HOST, "sh",
            os.path.join(self._hosts, f"{rank}"), self.netns(rank)]

  def namespaces(self) -> list[str]:
    """The network namespaces of this cluster that exist now."""
    listed = _run("ip", "netns", "list", enter=self._enter) if self.mode else ""
    mine = f"{PREFIX}{self.tag}-"
    return [line.split()[0] for line in listed.splitlines() if line.startswith(mine)]

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
    link, = json.loads(_run("ip", "-j", "-s", "link", "show", "dev", self._veth(rank),
                            enter=self._enter))
    stats = link["stats64"]  # the bridge side sees the host's traffic mirrored
    return stats["rx"]["bytes"], stats["tx"]["bytes"]

  def level_bytes(self, rank: int) -> dict[str, tuple[int, int]]:
    """``{"intra": (sent, received), "inter": (sent, received)}`` bytes of host ``rank`` so far.

    Frames as the kernel's qdiscs counted them (headers and ACKs included);
    "inter" is traffic to and from other clusters, (0, 0) in a flat cluster.
    """
    sent = band_bytes("eth0", netns=self.netns(rank), enter=self._enter)
    received = band_bytes(self._veth(rank), enter=self._enter)
    return {level: (sent[level], received[level]) for level in _CLASSES}

  def __enter__(self) -> Cluster:
    self.mode = mode()
    try:
      if self.mode == "rootless":
        self._hold()
      self._build()
    except BaseException:
      self.close()
      raise
    logger.info("jaxcc.testbed: %d hosts built %s", self.n,
                "as root" if self.mode == "root" else "in an unprivileged user namespace")
    return self

  def _hold(self) -> None:
    """Start the process that holds the rootless user + network + mount namespace."""
    self._holder = subprocess.Popen(
        ["unshare", "--user", "--map-root-user", "--net", "--mount", "sh", "-c", _HOLD],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_environ())
    if self._holder.stdout.readline().strip() != "ready":
      self._holder.wait(10)
      raise RuntimeError("testbed: the rootless namespace did not start: "
                         f"{self._holder.stderr.read().strip()}")
    self._enter = ("nsenter", "--target", str(self._holder.pid), "--user", "--net", "--mount",
                   "--preserve-credentials")

  def __exit__(self, *exc) -> None:
    self.close()

  def _shape(self, dev: str, rank: int, netns: str | None) -> None:
    """Two classes on ``dev``: its cluster at ``rates[rank]``, the others at ``inter_rates[rank]``.

    ``netns`` None is the bridge side, which classifies by source address.
    """
    _run("tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10",
         netns=netns, enter=self._enter)
    inter = self.rates[rank] if self.inter_rates is None else self.inter_rates[rank]
    for level, rate in (("intra", self.rates[rank]), ("inter", inter)):
      _run("tc", "class", "add", "dev", dev, "parent", "1:", "classid", _CLASSES[level],
           *_htb(rate), netns=netns, enter=self._enter)
      if self.latency is not None and netns is not None:
        try:
          _run("tc", "qdisc", "add", "dev", dev, "parent", _CLASSES[level], "netem", "delay",
               self.latency, netns=netns, enter=self._enter)
        except RuntimeError as e:
          raise RuntimeError(
              f"testbed: latency needs the kernel's netem qdisc (sch_netem): {e}") from e
    side = "dst" if netns is not None else "src"
    for other in range(self.n):
      if self.cluster_of[other] != self.cluster_of[rank]:
        _run("tc", "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1",
             "u32", "match", "ip", side, f"{self.address(other)}/32", "flowid",
             _CLASSES["inter"], netns=netns, enter=self._enter)

  def _build(self) -> None:
    mtu, enter = str(self.mtu), self._enter
    cubic = _allow_cubic(widen=self.mode == "root")
    self._hosts = tempfile.mkdtemp(prefix=f"{PREFIX}{self.tag}-hosts-")
    _run("ip", "link", "add", self.bridge, "type", "bridge", enter=enter)
    hostname = socket.gethostname()
    for i in range(self.n):
      ns, veth = self.netns(i), self._veth(i)
      with open(os.path.join(self._hosts, f"{i}"), "w") as f:
        f.write(f"127.0.0.1 localhost\n{self.address(i)} {hostname}\n")
      os.chmod(os.path.join(self._hosts, f"{i}"), 0o644)
      _run("ip", "netns", "add", ns, enter=enter)
      _run("ip", "link", "add", veth, "mtu", mtu, "type", "veth", "peer", "name", "eth0",
           "mtu", mtu, "netns", ns, enter=enter)
      # One frame per skb: the token buckets charge whole GSO super-packets (up to 64 KB),
      # which makes a port's rate over a tenth of a second up to 10% off.
      _run("ip", "link", "set", veth, "gso_max_size", mtu, enter=enter)
      _run("ip", "link", "set", "eth0", "gso_max_size", mtu, netns=ns, enter=enter)
      _run("ip", "link", "set", veth, "master", self.bridge, "up", enter=enter)
      _run("ip", "link", "set", "lo", "up", netns=ns, enter=enter)
      if cubic:
        _run("sh", "-c", f"echo cubic > {_CONGESTION}", netns=ns, enter=enter)
      _run("ip", "addr", "add", f"{self.address(i)}/24", "dev", "eth0", netns=ns, enter=enter)
      _run("ip", "link", "set", "eth0", "up", netns=ns, enter=enter)
      self._shape("eth0", i, ns)
      self._shape(veth, i, None)
    _run("ip", "link", "set", self.bridge, "mtu", mtu, "up", enter=enter)

  def set_rate(self, rank: int, rate: str | float, level: str = "intra") -> None:
    """Change host ``rank``'s rate (both ways) on ``level`` ("intra" or "inter") while it runs."""
    if level not in ("intra", "inter") or (level == "inter" and self.inter_rates is None):
      raise ValueError(f"testbed: level must be 'intra' or, with clusters, 'inter'; got {level!r}")
    bits = parse_rate(rate)
    for dev, netns in (("eth0", self.netns(rank)), (self._veth(rank), None)):
      _run("tc", "class", "change", "dev", dev, "parent", "1:", "classid", _CLASSES[level],
           *_htb(bits), netns=netns, enter=self._enter)
    name = "rates" if level == "intra" else "inter_rates"
    values = list(getattr(self, name))
    values[rank] = bits
    setattr(self, name, tuple(values))

  def close(self) -> None:
    """Remove this cluster's namespaces, bridge and hosts files (idempotent)."""
    if self._holder is not None:  # the rootless namespace goes with everything in it
      self._holder.kill()
      self._holder.wait()
      self._holder, self._enter = None, ()
    elif self.mode == "root":
      env = _environ()
      for i in range(self.n):  # the veth first: a namespace's devices go asynchronously
        for what, name in (("link", self._veth(i)), ("netns", self.netns(i))):
          subprocess.run(["ip", what, "delete", name], capture_output=True, check=False, env=env)
      subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True, check=False,
                     env=env)
    if self._hosts is not None:
      shutil.rmtree(self._hosts, ignore_errors=True)
      self._hosts = None


def band_bytes(dev: str = "eth0", netns: str | None = None,
               enter: Sequence[str] = ()) -> dict[str, int]:
  """``{"intra": bytes, "inter": bytes}`` that left ``dev`` to the own and to other clusters.

  ``netns`` None reads the current network namespace: a worker inside a
  testbed host counts its own sends with ``band_bytes()``.
  """
  text = _run("tc", "-s", "class", "show", "dev", dev, netns=netns, enter=enter)
  sent = dict(re.findall(r"class htb (\S+) .*\n\s*Sent (\d+) bytes", text))
  return {level: int(sent.get(classid, 0)) for level, classid in _CLASSES.items()}


def _htb(rate: float) -> tuple[str, ...]:
  """An HTB class at ``rate`` bit/s that never borrows (rate = ceil)."""
  bits = f"{int(rate)}bit"
  return ("htb", "rate", bits, "ceil", bits, "burst", _BURST, "cburst", _BURST,
          "quantum", "60000")


def _allow_cubic(widen: bool) -> bool:
  """Whether namespaces may default to cubic; with ``widen`` (root) cubic is allowed if needed."""
  def read(kind):
    with open(_CONGESTION_LIST.format(kind)) as f:
      return f.read().split()
  if "cubic" not in read("available"):
    return False
  allowed = read("allowed")
  if "cubic" in allowed:
    return True
  if widen:
    with open(_CONGESTION_LIST.format("allowed"), "w") as f:
      f.write(" ".join(allowed + ["cubic"]))
  return widen
