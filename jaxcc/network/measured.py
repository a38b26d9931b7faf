"""The network of one mesh axis as the job measures it while it trains.

``MeasuredNetwork(mesh, "x")`` probes the axis' processes at start (the
native probe, ``jaxcc.probe_topology``), and ``net.jit(step)`` is ``jax.jit``
whose collectives with ``topology=None`` plan on ``net.topology``: one
program per network state (a Topology is hashable), so a change costs one
trace and a switch back none. After each call it observes:

1. Every process reads the frames its transport timed since the last call
   (``host.FrameLog``, ``estimate.received_rates``) and all processes gather
   them (``host.allgather``: ``16 p + 16`` bytes from each to each), so every
   process decides on the same data, at the same call.
2. Where native collectives ran, ``estimate.PortChange`` compares the pair
   rates with those the current plan gave at its start; a port off by more
   than ``threshold`` for ``patience`` observations triggers a probe.
3. A spot check (the pairs ``i -> i + 1``, and across clusters ``i -> i +
   p/2``, unpaced, timed as the probe times a pair) runs once the last
   one's duration over ``budget`` passed since the last check or probe, so
   that checking costs about ``budget`` of the run; a pair off the topology
   by more than ``threshold`` triggers a probe. It finds what frames cannot
   show: a change while XLA's collective runs (no frames), and a port that
   got faster (a paced plan does not show it). On a network whose slowest
   port is under ``costs.NETWORK_BOUND`` the collectives run natively (as
   fast as XLA's there), so their own frames keep it current between
   checks.
4. A probe (after the last call's results are ready, so that it times an
   idle network) gives the new topology; ports within ``threshold / 2`` of
   the current ones keep their values (no re-trace on noise), and at the
   first probe ports within that of each other take their median, so an
   equal network is planned as equal. A changed topology is logged (logger
   "jaxcc") and kept in ``events``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import struct
import time
from collections.abc import Callable

import jax
import numpy as np
from jax.sharding import Mesh

from jaxcc import probe as probe_lib
from jaxcc.network import active, estimate, host
from jaxcc.network import native_probe
from jaxcc.topology import Topology

_API = "jaxcc.network.MeasuredNetwork"
logger = logging.getLogger("jaxcc")
_BANDWIDTHS = ("send_bandwidth", "recv_bandwidth", "inter_send_bandwidth",
               "inter_recv_bandwidth")
_PER_MESSAGE = ("latency", "inter_latency", "message_cost")  # seconds per message
_SPOT_SECONDS = 0.1  # what a spot check takes, until one was timed


@dataclasses.dataclass(frozen=True)
class Event:
  """What the measured network did at a call: ``kind`` is "probe" (at start or after a
  change), "spot" (a spot check) or "change" (a new topology in use from call ``step`` + 1)."""
  step: int
  kind: str
  seconds: float
  topology: Topology
  why: str = ""


class MeasuredNetwork:
  """The current Topology of ``axis_name``, measured at start and kept current (module doc).

  Every process must make one with the same arguments and run the same calls.

  Args:
    mesh: the mesh; its other axes must have size 1 and every rank of the
      axis must live in its own process (as for ``jaxcc.probe_topology``).
    axis_name: the axis.
    threshold: the fraction by which a port must move to count as changed.
    patience: consecutive observations a port must be off.
    budget: the fraction of the run that spot checks may take.
    cluster_gap: as for ``jaxcc.probe_topology``.
  """

  def __init__(self, mesh: Mesh, axis_name: str, *, threshold: float = 0.25,
               patience: int = 2, budget: float = 0.02, cluster_gap: float = 2.0):
    probe_lib.check_mesh(_API, mesh, axis_name)
    if not 0 < threshold < 1 or patience < 1 or not 0 < budget < 1:
      raise ValueError(f"{_API}: threshold and budget must be in (0, 1) and patience >= 1; got "
                       f"{threshold}, {budget}, {patience}")
    self.axis_name = axis_name
    self.threshold, self.budget = threshold, budget
    self._patience, self._cluster_gap = patience, cluster_gap
    self._procs = probe_lib.process_of_ranks(mesh)
    self._me, self._nproc = host.start()
    self.events: list[Event] = []
    self.steps = 0
    self.watch_seconds = 0.0  # time in observe(), its spot checks and probes included
    self._last_out = None
    self._log = host.FrameLog()
    self.topology = self._probe(None, "start")
    self._change = estimate.PortChange(self.topology.cluster, len(self._procs),
                                       threshold=threshold, patience=patience)
    self._checked_at = time.monotonic()  # the last spot check or probe ended
    self._spot_cost = 0.0

  def jit(self, fun: Callable, **jit_kwargs) -> Callable:
    """``jax.jit(fun, **jit_kwargs)`` planned on this network; observes after each call."""
    programs: dict[Topology, Callable] = {}

    def planned_on(topology: Topology) -> Callable:
      # A function of its own per topology: jax caches traces by function, so one shared
      # function would run the first topology's program for every later one.
      @functools.wraps(fun)
      def traced(*args, **kwargs):
        with active.using(self.axis_name, topology):
          return fun(*args, **kwargs)
      return jax.jit(traced, **jit_kwargs)

    def call(*args, **kwargs):
      topology = self.topology
      program = programs.get(topology)
      if program is None:
        program = programs[topology] = planned_on(topology)
      out = program(*args, **kwargs)
      self._last_out = out
      self.observe()
      return out

    return call

  def observe(self) -> bool:
    """Take what the transport timed since the last call; True if the topology changed (every
    process must call it at the same calls; ``jit``'s wrapper does)."""
    began = time.monotonic()
    try:
      return self._observe()
    finally:
      self.watch_seconds += time.monotonic() - began

  def _observe(self) -> bool:
    self.steps += 1
    mine = estimate.received_rates(self._log.read(), self._nproc)
    since = time.monotonic() - self._checked_at
    rows = host.allgather(struct.pack(f"<{2 * self._nproc + 2}d", *mine.bytes, *mine.seconds,
                                      since, self._spot_cost))
    got = np.array([struct.unpack(f"<{2 * self._nproc + 2}d", r) for r in rows])
    n = self._nproc
    rates = estimate.rate_matrix([estimate.Received(g[:n], g[n:2 * n]) for g in got])
    rates = rates[np.ix_(self._procs, self._procs)]
    since, spot_cost = got[:, -2].max(), got[:, -1].max()  # the same on every process
    changed = self._change.update(rates)
    if changed:
      level, port, rank, score = changed[0]
      return self._reprobe(f"rank {rank}'s {level} {port} port at {score:.2f}x its rate "
                           f"under the current plan")
    if since < max(spot_cost, _SPOT_SECONDS) / self.budget:
      return False
    return self._spot_check()

  def _spot_check(self) -> bool:
    """Time a few pairs against the topology; probe if one is off by more than ``threshold``."""
    self._quiet()
    host.allgather(b"")
    start = time.monotonic()
    t = self.topology
    shifts = (1,) if t.cluster is None else (1, len(self._procs) // 2)
    expected = _pair_rates(t)
    rates = native_probe.spot_check(expected[np.ix_(self._inverse(), self._inverse())],
                                    tuple(shifts))
    rates = rates[np.ix_(self._procs, self._procs)]
    self._spot_cost = time.monotonic() - start
    self._checked_at = time.monotonic()
    self.events.append(Event(self.steps, "spot", self._spot_cost, t))
    with np.errstate(invalid="ignore", divide="ignore"):
      off = np.abs(np.log(rates / expected)) > np.log1p(self.threshold)
    if not off.any():
      return False
    src, dst = map(int, np.argwhere(off)[0])
    return self._reprobe(f"pair {src} -> {dst} at {rates[src, dst] / expected[src, dst]:.2f}x "
                         "the topology's rate")

  def _reprobe(self, why: str) -> bool:
    self._quiet()
    topology = self._probe(self.topology, why)
    self._checked_at = time.monotonic()
    self._change = estimate.PortChange(topology.cluster, len(self._procs),
                                       threshold=self.threshold, patience=self._patience)
    if topology == self.topology:
      return False
    self.topology = topology
    self.events.append(Event(self.steps, "change", 0.0, topology, why))
    logger.info("jaxcc: the network of %r changed (%s): planning on %s from call %d",
                self.axis_name, why, topology, self.steps + 1)
    return True

  def _probe(self, current: Topology | None, why: str) -> Topology:
    host.allgather(b"")  # every process is here, none computing: the probe times the network
    start = time.monotonic()
    m = native_probe.probe()
    rates, one_way, cost = (a[np.ix_(self._procs, self._procs)]
                            for a in (m.rates, m.one_way, m.message_cost))
    try:
      measured = probe_lib.topology_from_rates(rates, self._cluster_gap, one_way, cost)
    except ValueError as e:  # clusters apart along the axis: planned as one flat network
      logger.warning("jaxcc: %s; planning on a flat network", e)
      measured = probe_lib.topology_from_rates(rates, np.inf, one_way, cost)
    topology = snap(measured, current, self.threshold / 2)
    self.events.append(Event(self.steps, "probe", time.monotonic() - start, topology, why))
    return topology

  def _quiet(self) -> None:
    """Wait for the last call's results: a measurement times an idle network."""
    if self._last_out is not None:
      jax.block_until_ready(self._last_out)

  def _inverse(self) -> np.ndarray:
    """The rank of each process."""
    inverse = np.empty(len(self._procs), np.int64)
    inverse[self._procs] = np.arange(len(self._procs))
    return inverse


def snap(measured: Topology, current: Topology | None, tolerance: float) -> Topology:
  """``measured`` with each port within ``tolerance`` of ``current``'s kept at that value (same
  clusters); without a current one, ports within ``tolerance`` of each other take their
  median; latencies and message costs: the median of each, in whole microseconds, kept at
  ``current``'s unless it halved or doubled."""
  fields = {}
  same = current is not None and current.cluster == measured.cluster
  for name in _BANDWIDTHS:
    new = getattr(measured, name)
    if new is None:
      continue
    new = np.asarray(new, float)
    if same:
      old = np.asarray(getattr(current, name), float)
      near = np.abs(new / old - 1) <= tolerance
      fields[name] = tuple(np.where(near, old, new))
    else:
      fields[name] = tuple(_grouped(new, tolerance))
  for name in _PER_MESSAGE:
    values = getattr(measured, name)
    if values is None:
      continue
    level = round(float(np.median(values)), 6)
    if same and getattr(current, name) is not None:
      old = getattr(current, name)[0]
      if old == level or old > 0 and level > 0 and abs(np.log(level / old)) <= np.log(2):
        level = old  # timed through Python's wake-ups: only a doubling counts
    fields[name] = (level,) * len(values)
  return dataclasses.replace(measured, **fields)


def _grouped(values: np.ndarray, tolerance: float) -> np.ndarray:
  """Values sorted into runs whose neighbours lie within ``tolerance``; each run's median."""
  order = np.argsort(values)
  out = np.empty_like(values)
  run = [order[0]]
  for i in order[1:]:
    if values[i] <= values[run[0]] * (1 + tolerance):
      run.append(i)
    else:
      out[run] = np.median(values[run])
      run = [i]
  out[run] = np.median(values[run])
  return out


def _pair_rates(t: Topology) -> np.ndarray:
  """``[src, dst]``: the slower of the two ports on the pair's level (NaN on the diagonal)."""
  send, recv = np.asarray(t.send_bandwidth), np.asarray(t.recv_bandwidth)
  rates = np.minimum.outer(send, recv)
  if t.cluster is not None:
    cross = ~np.equal.outer(t.cluster, t.cluster)
    inter = np.minimum.outer(np.asarray(t.inter_send_bandwidth),
                             np.asarray(t.inter_recv_bandwidth))
    rates = np.where(cross, inter, rates)
  np.fill_diagonal(rates, np.nan)
  return rates
