"""What the measured network reads and sends on jaxcc's TCP transport, outside any collective.

* ``FrameLog``: the frames the transport's progress thread timed (one record
  per frame, each direction): the passive measurement. The engine keeps the
  newest 65,536 frames; recording costs two clock reads and a 48-byte store
  per frame.
* ``allgather``: host messages (``tcp_send_bytes``) from every process to
  every other one; each process sends its payload ``nproc - 1`` times.
* ``Tags``: host-message tags in a range of their own (``TAG_BASE`` on);
  every process takes them in the same order, so one call's tags match. A
  receiver waiting for a tag admits one sender under it: a tag names one
  (sender, receiver) message or a set of them with distinct receivers.
"""

from __future__ import annotations

import time

import jax
import numpy as np

from jaxcc._src import config, ffi, tcp_bootstrap

# A frame as the engine records it (xla_ffi/cpu/tcp.h: FrameRecord).
RECORD = np.dtype([("peer", "<i4"), ("direction", "<i4"), ("op", "<i8"), ("instance", "<i8"),
                   ("first_ns", "<i8"), ("last_ns", "<i8"), ("bytes", "<u8")])
RECEIVED, SENT = 0, 1
HOST_OP = -1  # the op id of host messages; collectives' call sites are > 0
TAG_BASE = 1 << 48  # host-message tags of the measured network; the gossip rejoin's are small
_MAX_GATHER_BYTES = 1 << 20


def start() -> tuple[int, int]:
  """Start the TCP transport (every process must call it); return (this process, processes)."""
  tcp_bootstrap.ensure_started()
  return jax.process_index(), jax.process_count()


class FrameLog:
  """The frames timed since the log was made (or last read)."""

  def __init__(self):
    self._cpu = ffi.load().cpu
    self._next, _ = self._cpu.tcp_records(1 << 62)  # from now on

  def read(self) -> np.ndarray:
    """The records timed since the last read, oldest first (``RECORD``)."""
    self._next, raw = self._cpu.tcp_records(self._next)
    return np.frombuffer(raw, RECORD)


class Tags:
  """Consecutive host-message tags from ``TAG_BASE``; every process draws the same sequence."""

  _next = 0

  @classmethod
  def take(cls, n: int) -> int:
    """The first of ``n`` fresh tags (at least one is taken)."""
    first = cls._next
    cls._next += max(n, 1)
    return TAG_BASE + first


def allgather(payload: bytes, timeout_s: float | None = None) -> list[bytes]:
  """Every process' ``payload``, in process order (every process must call it).

  Raises:
    RuntimeError: a process' message did not come within ``timeout_s``
      (default ``JAXCC_TIMEOUT_S``) or its connection was lost (named).
  """
  me, n = start()
  cpu = ffi.load().cpu
  first = Tags.take(n)  # one per sender: a receiver's wait for a tag admits one sender only
  timeout_s = config.timeout_s() if timeout_s is None else timeout_s
  for q in range(n):
    if q != me:
      cpu.tcp_send_bytes(q, first + me, payload)
  return [payload if q == me else cpu.tcp_recv_bytes(q, first + q, _MAX_GATHER_BYTES, timeout_s)
          for q in range(n)]


def now_ns() -> int:
  """A monotonic clock for the probe's own timings (the records' clock is CLOCK_REALTIME)."""
  return time.monotonic_ns()
