"""The native probe: every ordered pair of processes timed on jaxcc's TCP transport, no JAX program.

The pairs go in rounds (``pair_rounds``) in which each process sends at most
once and receives at most once, so each send port and each receive port
carries one flow (ports are full duplex): every ordered pair in the ``p - 1``
shift rounds (``i`` sends to ``i + k``), the pairs inside clusters of
consecutive processes in one round fewer than the largest cluster. Each round:

1. A handshake keeps the ports quiet: ``i`` waits until its last round's
   receiver has its bytes and its next receiver has finished its own last
   round (host messages ``done`` and ``ready``).
2. Latency: ``pings`` one-byte ping-pongs with the receiver; the pair's
   one-way time is half the shortest round trip.
3. Message cost: ``burst`` one-byte messages sent back to back, answered
   once the last is in. A process sends its burst and takes in its sender's,
   one message at a time, so beyond a round trip the time ``T`` from its
   first send to the answer is ``burst`` messages' work per role it has in
   the round (sender, receiver): the pair's message cost is
   ``(T - 2 one_way) / (roles * burst)``.
4. Rate: a settle message (``settle_bytes``: a token bucket's burst and TCP's
   start) and straight after it a timed one on the same connection; the
   receiver's transport times both by the kernel's receive stamps
   (``host.FrameLog``), and the rate is the timed frame's bytes over the time
   between the two frames' last bytes.

A first pass sends ``first_bytes`` per pair; pairs whose timed frame took
under ``seconds / 2`` are timed again with about ``seconds`` of their first rate
(at most 64 times ``first_bytes``). The rates are gathered to every process
(``host.allgather``). Bytes sent per process: ``(p - 1) (settle_bytes +
first_bytes)`` plus ``settle_bytes + rate * seconds`` per short pair in the
second pass, and small handshakes. A shaper's release is clumpy over
milliseconds: ``seconds`` of 0.08 times a pair within 1-2%. On 8 testbed hosts: see ``jaxcc bench
probe``.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np

from jaxcc._src import config, ffi
from jaxcc.network import host

_GROWTH = 64  # the second pass sends at most this many times first_bytes per pair
_TOKEN = b"\0"


class Measurement(NamedTuple):
  """What a probe measured, the same on every process.

  Attributes:
    rates: ``[src, dst]`` bytes/s (NaN on the diagonal).
    one_way: ``[src, dst]`` seconds, half the shortest round trip (NaN on
      the diagonal, or where ``pings`` was 0).
    message_cost: ``[src, dst]`` seconds of work per message at the pair's
      ends (NaN on the diagonal, or where ``pings`` or ``burst`` was 0).
    seconds: the probe's wall time on this process.
  """
  rates: np.ndarray
  one_way: np.ndarray
  message_cost: np.ndarray
  seconds: float


def probe(*, settle_bytes: int = 512 << 10, first_bytes: int = 128 << 10,
          seconds: float = 0.08, pings: int = 3, burst: int = 16,
          timeout_s: float | None = None) -> Measurement:
  """Time every ordered pair of the job's processes (every process must call it).

  Args:
    settle_bytes: bytes sent before each timed message, left out of its time.
    first_bytes: timed bytes per pair in the first pass.
    seconds: the time a pair's timed messages should take; shorter ones are
      timed again, sized by their first rate.
    pings: round trips per pair for its latency (0: none).
    burst: messages per pair sent back to back for its message cost (0: none).
    timeout_s: the limit of each wait (default ``JAXCC_TIMEOUT_S``).

  Raises:
    ValueError: an argument out of range.
    RuntimeError: a process did not answer in time or its connection was lost.
  """
  if settle_bytes < 1 or first_bytes < 1 or not seconds > 0 or pings < 0 or burst < 0:
    raise ValueError("jaxcc.network.probe: settle_bytes and first_bytes must be >= 1, seconds "
                     "> 0, pings and burst >= 0; got "
                     f"{settle_bytes}, {first_bytes}, {seconds}, {pings}, {burst}")
  me, p = host.start()
  timeout_s = config.timeout_s() if timeout_s is None else timeout_s
  start = host.now_ns()
  cpu = ffi.load().cpu
  cpu.tcp_unpace()
  sizes = np.full((p, p), first_bytes, np.int64)
  np.fill_diagonal(sizes, 0)
  rates, one_way, cost = _rounds(me, p, sizes, settle_bytes, pings, burst if pings else 0,
                                 timeout_s)
  rates, one_way, cost = _gather(rates, one_way, cost)
  short = (sizes > 0) & ~(sizes / rates >= seconds / 2)
  if short.any():
    sizes = np.where(short, np.clip(np.nan_to_num(rates) * seconds, first_bytes,
                                    _GROWTH * first_bytes), 0).astype(np.int64)
    again = _rounds(me, p, sizes, settle_bytes, 0, 0, timeout_s)[0]
    rates = np.where(short, _gather(again)[0], rates)
  return Measurement(rates, one_way, cost, (host.now_ns() - start) / 1e9)


def pair_rounds(pairs: np.ndarray) -> list[np.ndarray]:
  """The ``[src, dst]`` pairs where ``pairs`` is True in rounds: each round an array ``dst`` per
  sending process (-1: none), every process sending at most once and receiving at most once.
  Pairs are placed in order of their shift ``dst - src`` (mod p), each in the first round
  where both ports are free: all pairs in ``p - 1`` shift rounds, the pairs inside clusters
  of consecutive processes in one round fewer than the largest cluster."""
  p = len(pairs)
  src, dst = np.nonzero(pairs)
  order = np.lexsort((src, (dst - src) % p))
  rounds: list[np.ndarray] = []
  receiving: list[np.ndarray] = []
  for i, j in zip(src[order], dst[order]):
    for to, busy in zip(rounds, receiving):
      if to[i] < 0 and not busy[j]:
        break
    else:
      to, busy = np.full(p, -1), np.zeros(p, bool)
      rounds.append(to)
      receiving.append(busy)
    to[i], busy[j] = j, True
  return rounds


def _rounds(me: int, p: int, sizes: np.ndarray, settle_bytes: int, pings: int, burst: int,
            timeout_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """This process' receive rates ``[src]``, one-way times ``[dst]`` and message costs
  ``[dst]`` over the pairs where ``sizes`` is above 0, in ``pair_rounds``."""
  cpu = ffi.load().cpu
  log = host.FrameLog()
  rates = np.full(p, np.nan)
  one_way = np.full(p, np.nan)
  cost = np.full(p, np.nan)
  rounds = pair_rounds(sizes > 0)
  per_round = 5 + 2 * pings + burst
  first = host.Tags.take(per_round * len(rounds))
  records = []
  last_dst, last_round = None, 0  # the receiver of this process' last data, not yet done

  def recv(q, tag, size=1):
    return cpu.tcp_recv_bytes(q, tag, size, timeout_s)

  for i, to in enumerate(rounds):
    dst = int(to[me]) if to[me] >= 0 else None
    senders = np.flatnonzero(to == me)
    src = int(senders[0]) if len(senders) else None
    ready, done, ping, pong, settle, timed, volley, answer = _round_tags(first + i * per_round,
                                                                          pings, burst)
    if last_dst is not None:  # the last receiver has every byte this process sent it
      recv(last_dst, _round_tags(first + last_round * per_round, pings, burst)[1])
      last_dst = None
    if src is not None:
      cpu.tcp_send_bytes(src, ready, _TOKEN)
    if dst is not None:
      recv(dst, ready)
    for r in range(pings):
      began = host.now_ns()
      if dst is not None:
        cpu.tcp_send_bytes(dst, ping + r, _TOKEN)
      if src is not None:
        recv(src, ping + r)
        cpu.tcp_send_bytes(src, pong + r, _TOKEN)
      if dst is not None:
        recv(dst, pong + r)
        one_way[dst] = np.fmin(one_way[dst], (host.now_ns() - began) / 2e9)
    if burst:
      began = host.now_ns()
      if dst is not None:
        for r in range(burst):
          cpu.tcp_send_bytes(dst, volley + r, _TOKEN)
      if src is not None:
        for r in range(burst):
          recv(src, volley + r)
        cpu.tcp_send_bytes(src, answer, _TOKEN)
      if dst is not None:
        recv(dst, answer)
        beyond = (host.now_ns() - began) / 1e9 - 2 * one_way[dst]
        cost[dst] = max(beyond, 0.0) / ((1 + (src is not None)) * burst)
    if dst is not None:  # built first, then queued back to back: no gap between the frames
      payload = bytes(int(sizes[me, dst]))
      cpu.tcp_send_bytes(dst, settle, bytes(settle_bytes))
      cpu.tcp_send_bytes(dst, timed, payload)
      last_dst, last_round = dst, i
    if src is not None:
      recv(src, settle, settle_bytes)
      recv(src, timed, int(sizes[src, me]))
      cpu.tcp_send_bytes(src, done, _TOKEN)
      records.append(log.read())
      rates[src] = _rate(np.concatenate(records), src, settle, timed)
  if last_dst is not None:
    recv(last_dst, _round_tags(first + last_round * per_round, pings, burst)[1])
  return rates, one_way, cost


def spot_check(expected: np.ndarray, shifts: tuple[int, ...], *, settle_bytes: int = 512 << 10,
               seconds: float = 0.08, timeout_s: float | None = None) -> np.ndarray:
  """The rates of the pairs ``(i, i + k)`` for ``k`` in ``shifts``, sized by ``expected``
  (``[src, dst]`` bytes/s: about ``seconds`` each, at least 128 KiB), gathered to every process;
  NaN elsewhere. One pass, no pings, timed as ``probe`` times a pair: what a measured network
  runs where no traffic showed."""
  me, p = host.start()
  timeout_s = config.timeout_s() if timeout_s is None else timeout_s
  ffi.load().cpu.tcp_unpace()
  on = np.zeros((p, p), bool)
  for k in shifts:
    on[np.arange(p), (np.arange(p) + k) % p] = True
  sizes = np.where(on, np.maximum(np.nan_to_num(expected) * seconds, 128 << 10), 0).astype(
      np.int64)
  rates = _rounds(me, p, sizes, settle_bytes, 0, 0, timeout_s)[0]
  return np.where(on, _gather(rates)[0], np.nan)


def _round_tags(base: int, pings: int, burst: int) -> tuple[int, ...]:
  """ready, done, the first ping, the first pong, settle, timed, the burst's first message
  and its answer."""
  after = base + 4 + 2 * pings
  return (base, base + 1, base + 2, base + 2 + pings, after - 2, after - 1, after,
          after + burst)


def _rate(records: np.ndarray, src: int, settle: int, timed: int) -> float:
  """The timed frame's bytes over the time from the settle frame's last byte to its own."""
  mine = records[(records["direction"] == host.RECEIVED) & (records["op"] == host.HOST_OP) &
                 (records["peer"] == src)]
  ends = {int(r["instance"]): r for r in mine if r["instance"] in (settle, timed)}
  if settle not in ends or timed not in ends:
    return float("nan")  # the records ring overflowed meanwhile
  gap = (int(ends[timed]["last_ns"]) - int(ends[settle]["last_ns"])) / 1e9
  return float(ends[timed]["bytes"]) / gap if gap > 0 else float("nan")


def _gather(rates: np.ndarray, *rows: np.ndarray) -> tuple[np.ndarray, ...]:
  """Every process' column of rates (its receives) and ``rows`` (per destination), as
  ``[src, dst]`` matrices."""
  p = len(rates)
  values = np.concatenate([rates, *rows])
  got = np.array([struct.unpack(f"<{len(values)}d", r)
                  for r in host.allgather(struct.pack(f"<{len(values)}d", *values))])
  return (got[:, :p].T.copy(),) + tuple(got[:, p * (k + 1):p * (k + 2)].copy()
                                        for k in range(len(rows)))
