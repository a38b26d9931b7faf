"""Event-driven timing of a Schedule over per-rank ports (optcc.md §9).

Every rank has a send (tx) port of ``topology.send_bandwidth[i]`` and a
receive (rx) port of ``topology.recv_bandwidth[i]`` bytes/s. A transfer of
``size = length * itemsize`` bytes is store-and-forward: it holds the sender's
tx port for ``o_src + size / B_tx``, then waits for and holds the receiver's rx
port for ``o_dst + size / B_rx`` (``o = topology.message_cost``), and is
delivered ``topology.message_latency(src, dst)`` later (with
``port_blocking_latency`` the rx port is held through the latency too).

In a topology of clusters each rank has a second pair of ports, across
clusters: a transfer inside a cluster uses the intra ports, one between
clusters the cross-cluster ports of both ends. A rank without a cross-cluster
port sends (receives) through its relay (``Topology.relay``): the transfer
then takes up to three hops, intra to the relay, across, intra from the
relay, each store-and-forward with its own latency.
A port serves one message at a time: whenever it is free it takes, among the
messages ready for it, the one of the smallest ``(step, row)`` in the table.
All events of one instant are handled before a free port chooses, so messages
that become ready at the same time are ordered by priority, not by event order.

The program runs as dataflow over the ranges of the schedule, overlapping steps
where the data allows; the data it computes equals the step-by-step (BSP) run:

* a transfer of step ``t`` is ready for its tx port once every write of an
  earlier step into the range it sends is applied (read after write);
* a write (one COPY transfer, or a REDUCE group: the transfers of one step into
  one rank) is applied once it is delivered (all of the group), once every
  transfer that sends an overlapping range from that rank at a step ``<= t`` has
  left the tx port (write after read), and once every earlier overlapping write
  into that rank is applied (write after write).

The completion time is the last time a write is applied. The hops, the
dependencies and the event loop run in the CPU module (``_jaxcc_cpu.simulate``)
where it is built, else in Python (``_timing``); both give the same numbers,
bit for bit.
"""

from __future__ import annotations

import gc
import heapq
from typing import NamedTuple

import numpy as np

from jaxcc._src import ffi
from jaxcc.schedules.ir import REDUCE, Schedule
from jaxcc.schedules.tables import starts, unique
from jaxcc.topology import Topology

API = "jaxcc.sim.simulate"


class SimResult(NamedTuple):
  """What ``simulate`` measured.

  Attributes:
    time: completion in seconds (the last write applied); 0.0 for an empty schedule.
    tx_busy: seconds each rank's send port was busy, shape ``(p,)``.
    rx_busy: seconds each rank's receive port was busy (latency included when
      it blocks the port), shape ``(p,)``.
    bytes_sent: bytes each rank sent, shape ``(p,)``.
    bytes_received: bytes each rank received, shape ``(p,)``.
    num_messages: number of transfers.
    inter_tx_busy: seconds each rank's cross-cluster send port was busy
      (zeros in a flat topology), shape ``(p,)``.
    inter_rx_busy: the same for the cross-cluster receive ports.
    inter_bytes: bytes that crossed between clusters, in total.
  """

  time: float
  tx_busy: np.ndarray
  rx_busy: np.ndarray
  bytes_sent: np.ndarray
  bytes_received: np.ndarray
  num_messages: int
  inter_tx_busy: np.ndarray
  inter_rx_busy: np.ndarray
  inter_bytes: float


def simulate(schedule: Schedule, topology: Topology, *,
             port_blocking_latency: bool = False) -> SimResult:
  """Times ``schedule`` on ``topology`` with per-rank send and receive queues.

  Args:
    schedule: the schedule (``Schedule.validate`` checks its structure, ``check`` proves it
      correct).
    topology: one entry per rank of the schedule.
    port_blocking_latency: hold the receive port through the message latency
      (a per-message overhead) instead of treating latency as pure delay.

  Returns:
    A ``SimResult``.
  """
  p = schedule.nranks
  if topology.size != p:
    raise ValueError(f"{API}: topology has {topology.size} ranks but the schedule has {p}")
  table = schedule.validate(API).table
  native = ffi.cpu_module_or_none()
  if native is not None:
    time, unapplied, busy_tx, busy_rx, sent, received = native.simulate(
        table, float(schedule.itemsize), p, schedule.length, schedule.num_steps,
        *_ports(topology), port_blocking_latency)
  else:
    time, unapplied, busy_tx, busy_rx, sent, received = _timing(schedule, topology,
                                                                port_blocking_latency)
  if unapplied:
    raise RuntimeError(f"{API}: {unapplied} writes never applied (a dependency cycle)")
  busy_tx, busy_rx = np.asarray(busy_tx), np.asarray(busy_rx)
  inter_bytes = 0.0
  if topology.cluster is not None:
    _, src, dst, _, _, n, _ = table.T
    cluster = np.asarray(topology.cluster)
    inter_bytes = float((n * float(schedule.itemsize))[cluster[src] != cluster[dst]].sum())
  return SimResult(
      time=time,
      tx_busy=busy_tx[:p],
      rx_busy=busy_rx[:p],
      bytes_sent=np.asarray(sent),
      bytes_received=np.asarray(received),
      num_messages=len(table),
      inter_tx_busy=busy_tx[p:],
      inter_rx_busy=busy_rx[p:],
      inter_bytes=inter_bytes)


def _timing(schedule: Schedule, topology: Topology, port_blocking_latency: bool):
  """``_jaxcc_cpu.simulate`` in Python: (time, writes never applied, tx and rx busy seconds per
  port, bytes sent and received per rank)."""
  table, p = schedule.table, schedule.nranks
  _, src, dst, _, _, n, _ = table.T
  size = n * float(schedule.itemsize)
  hops = _hops(src, dst, size, topology, port_blocking_latency)
  time, unapplied = 0.0, 0
  if len(table):
    # Millions of small lists and tuples: the cyclic GC only costs time here.
    enabled = gc.isenabled()
    gc.disable()
    try:
      time, unapplied = _run(hops, *_dependencies(schedule), 2 * p)
    finally:
      if enabled:
        gc.enable()
  busy_tx = np.zeros(2 * p)
  busy_rx = np.zeros(2 * p)
  for txp, rxp, tx, rx, _ in hops:
    on = txp >= 0
    busy_tx += np.bincount(txp[on], weights=tx[on], minlength=2 * p)
    busy_rx += np.bincount(rxp[on], weights=rx[on], minlength=2 * p)
  return (time, unapplied, busy_tx, busy_rx, np.bincount(src, weights=size, minlength=p),
          np.bincount(dst, weights=size, minlength=p))


def _ports(topology: Topology):
  """The ports of ``topology`` as arrays: send, recv, latency and message cost per rank, and
  for clusters (else None) cluster, relay (``Topology.relay``), inter_send, inter_recv and
  inter_latency per rank."""
  ports = (np.asarray(topology.send_bandwidth), np.asarray(topology.recv_bandwidth),
           np.asarray(topology.latency), np.asarray(topology.message_cost))
  if topology.cluster is None:
    return (*ports, None)
  relay = np.array([topology.relay(r) for r in range(topology.size)])
  return (*ports, (np.asarray(topology.cluster), relay,
                   np.asarray(topology.inter_send_bandwidth),
                   np.asarray(topology.inter_recv_bandwidth), np.asarray(topology.inter_latency)))


def _hops(src, dst, size, topology: Topology, port_blocking_latency: bool):
  """The hops of every transfer: a list of ``(tx_port, rx_port, tx_s, rx_s, delay_s)`` arrays.

  Ports ``0..p-1`` are the ranks' intra (or only) ports, ``p..2p-1`` their
  cross-cluster ports; a hop holds each of its ports for the port's rank's message cost
  beside its bytes. Hop ``h`` of a transfer that takes fewer hops has ``tx_port == -1``.
  """
  p = topology.size
  send, recv, latency, cost, clusters = _ports(topology)
  if clusters is None:
    hops = [(src, dst, size / send[src], size / recv[dst], np.maximum(latency[src], latency[dst]))]
  else:
    cluster, relay, isend, irecv, ilat = clusters
    cross = cluster[src] != cluster[dst]
    a, b = np.where(cross, relay[src], src), np.where(cross, relay[dst], dst)

    def intra(frm, to, on):
      return (np.where(on, frm, -1), np.where(on, to, -1), size / send[frm], size / recv[to],
              np.maximum(latency[frm], latency[to]))

    first = intra(src, a, cross & (a != src))
    middle = (np.where(cross, a + p, src), np.where(cross, b + p, dst),
              size / np.where(cross, isend[a], send[src]),
              size / np.where(cross, irecv[b], recv[dst]),
              np.where(cross, np.maximum(ilat[a], ilat[b]), np.maximum(latency[src], latency[dst])))
    last = intra(b, dst, cross & (b != dst))
    hops = [h for h in (first, middle, last) if (h[0] >= 0).any()]
  hops = [(txp, rxp, cost[txp % p] + tx, cost[rxp % p] + rx, delay)
          for txp, rxp, tx, rx, delay in hops]
  if port_blocking_latency:
    hops = [(txp, rxp, tx, rx + delay, np.zeros_like(delay)) for txp, rxp, tx, rx, delay in hops]
  return hops


def _dependencies(schedule: Schedule):
  """The dataflow graph between transfers and writes ("units").

  Returns:
    ``unit_of`` (the unit each transfer writes), ``need`` (per unit: the events
    it waits for), ``raw_need`` (per transfer: the units it waits for), and the
    adjacency lists ``raw_out`` (unit -> transfers), ``waw_out`` (unit -> units)
    and ``war_out`` (transfer -> units), all as Python lists.
  """
  table, p, length = schedule.table, schedule.nranks, schedule.length
  step, src, dst, src_start, dst_start, n, op = table.T
  num = len(table)
  rows = np.arange(num)
  # Units in (step, dst, row) order: a REDUCE group is one unit, each COPY one.
  key = (step * p + dst) * (num + 1) + np.where(op == REDUCE, 0, rows + 1)
  order = np.argsort(key)
  first = starts(key[order])
  head = order[first]
  units = len(head)
  unit_of = np.empty(num, np.int64)
  unit_of[order] = np.cumsum(first) - 1
  # Accesses: a read per transfer, then a write per unit; cut each rank's buffer into
  # elementary segments at every boundary that occurs on that rank.
  rank = np.r_[src, dst[head]]
  start = np.r_[src_start, dst_start[head]]
  end = start + np.r_[n, n[head]]
  write = np.r_[np.zeros(num, bool), np.ones(units, bool)]
  ident = np.r_[rows, np.arange(units)]
  base = rank * (length + 1)
  cuts = unique(np.r_[base + start, base + end])
  first = np.searchsorted(cuts, base + start)
  count = np.searchsorted(cuts, base + end) - first
  seg = np.repeat(first - np.cumsum(count) + count, count) + np.arange(count.sum())
  access = np.repeat(np.arange(len(rank)), count)
  # Per segment in program order; within a step the reads come first (they see the
  # pre-step state). At most one write per (segment, step), so ties are reads only.
  order = np.argsort((seg * schedule.num_steps + np.r_[step, step[head]][access]) * 2
                     + write[access])
  seg, access = seg[order], access[order]
  write, ident = write[access], ident[access]
  pos = np.arange(len(seg))
  last_write = np.maximum.accumulate(np.where(write, pos, -1))
  prev_write = np.r_[-1, last_write[:-1]]
  next_write = np.minimum.accumulate(np.where(write, pos, len(seg))[::-1])[::-1]

  def edges(at, other):
    """(ident[other], ident[at]) for the pairs in the same segment."""
    ok = (other >= 0) & (other < len(seg))
    ok[ok] = seg[other[ok]] == seg[at[ok]]
    return ident[other[ok]], ident[at[ok]]

  reads, writes = np.flatnonzero(~write), np.flatnonzero(write)
  raw = _pairs(*edges(reads, prev_write[reads]), num)        # unit -> transfer
  waw = _pairs(*edges(writes, prev_write[writes]), units)    # unit -> unit
  war = _pairs(*edges(reads, next_write[reads])[::-1], units)  # transfer -> unit
  need = (np.bincount(unit_of, minlength=units) + np.bincount(waw[1], minlength=units)
          + np.bincount(war[1], minlength=units))
  return (unit_of.tolist(), need.tolist(), np.bincount(raw[1], minlength=num).tolist(),
          _adjacency(*raw, units), _adjacency(*waw, units), _adjacency(*war, num))


def _pairs(frm, to, count):
  """The distinct pairs, sorted by ``frm``."""
  key = unique(frm * count + to)
  return key // count, key % count


def _adjacency(frm, to, count) -> list[list[int]]:
  """Per node in ``range(count)``: its targets (``frm`` sorted)."""
  targets = to.tolist()
  ends = np.cumsum(np.bincount(frm, minlength=count)).tolist()
  return [targets[s:e] for s, e in zip([0] + ends[:-1], ends)]


def _run(hops, unit_of, need, raw_need, raw_out, waw_out, war_out, ports):
  """The event loop over ``ports`` tx and rx ports: (completion time, writes never applied)."""
  # Per transfer its current hop; the later hops of multi-hop transfers wait in `more`.
  real = np.array([h[0] >= 0 for h in hops])  # (hops, transfers)
  first = np.argmax(real, axis=0)
  txp, rxp, tx, rx, delay = (np.choose(first, [h[k] for h in hops]).tolist() for k in range(5))
  more = {}
  for x in np.flatnonzero(real.sum(0) > 1).tolist():
    more[x] = [tuple(h[k][x].item() for k in range(5)) for h in hops[::-1] if h[0][x] >= 0][:-1]
  num, num2, num3 = len(txp), 2 * len(txp), 3 * len(txp)
  empty = ()
  push, pop = heapq.heappush, heapq.heappop
  tx_queue = [[] for _ in range(ports)]  # Heaps of ready transfers (row = priority).
  rx_queue = [[] for _ in range(ports)]
  for x in range(num):
    if not raw_need[x]:
      tx_queue[txp[x]].append(x)  # Ascending, so already heaps.
  tx_idle, rx_idle = [True] * ports, [True] * ports
  tx_dirty, rx_dirty = list(range(ports)), []  # Idle ports that may start a message now.
  tx_mark, rx_mark = tx_dirty.append, rx_dirty.append
  # (time, code): code x = tx end, num + x = rx end, 2 num + x = delivery, 3 num + x = arrival
  # at a relay.
  events = []
  stack = []  # Units whose dependencies are all met.
  now = last = 0.0
  pending = len(need)
  while True:
    # Every event at `now` has been handled: the free ports with work start.
    for r in tx_dirty:
      if tx_idle[r] and tx_queue[r]:
        x = pop(tx_queue[r])
        tx_idle[r] = False
        push(events, (now + tx[x], x))
    tx_dirty.clear()
    for r in rx_dirty:
      if rx_idle[r] and rx_queue[r]:
        x = pop(rx_queue[r])
        rx_idle[r] = False
        push(events, (now + rx[x], num + x))
    rx_dirty.clear()
    if not events:
      break
    while True:
      now, code = pop(events)
      if code < num:  # Left the tx port: wait for the rx port.
        r = txp[code]
        tx_idle[r] = True
        tx_mark(r)
        r = rxp[code]
        push(rx_queue[r], code)
        if rx_idle[r]:
          rx_mark(r)
        for u in war_out[code]:  # the source's range is free once read (first hop only)
          need[u] -= 1
          if not need[u]:
            stack.append(u)
        war_out[code] = empty
      elif code < num2:  # Left the rx port: delivered (or at the relay) now or after the latency.
        x = code - num
        r = rxp[x]
        rx_idle[r] = True
        rx_mark(r)
        if delay[x]:
          push(events, (now + delay[x], code + (num2 if x in more else num)))
        elif x in more:
          _next_hop(x, more, txp, rxp, tx, rx, delay, tx_queue, tx_idle, tx_mark)
        else:
          u = unit_of[x]
          need[u] -= 1
          if not need[u]:
            stack.append(u)
      elif code >= num3:  # At a relay: on to the next hop.
        _next_hop(code - num3, more, txp, rxp, tx, rx, delay, tx_queue, tx_idle, tx_mark)
      else:  # Delivered.
        u = unit_of[code - num2]
        need[u] -= 1
        if not need[u]:
          stack.append(u)
      while stack:  # Apply writes; release their readers and later writers.
        u = stack.pop()
        pending -= 1
        last = now
        for x in raw_out[u]:
          raw_need[x] -= 1
          if not raw_need[x]:
            r = txp[x]
            push(tx_queue[r], x)
            if tx_idle[r]:
              tx_mark(r)
        for v in waw_out[u]:
          need[v] -= 1
          if not need[v]:
            stack.append(v)
      if not events or events[0][0] > now:
        break
  return last, pending


def _next_hop(x, more, txp, rxp, tx, rx, delay, tx_queue, tx_idle, tx_mark):
  """Transfer ``x`` arrived at a relay: its next hop waits for that hop's tx port."""
  path = more[x]
  txp[x], rxp[x], tx[x], rx[x], delay[x] = path.pop()
  if not path:
    del more[x]
  r = txp[x]
  heapq.heappush(tx_queue[r], x)
  if tx_idle[r]:
    tx_mark(r)
