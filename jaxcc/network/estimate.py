"""Rates from the transport's frame records, and the rule that says a port changed.

``received_rates`` turns one process' records into what it received from
each peer, timed: a peer's frames to this process form busy periods (a frame
whose first byte came more than ``gap_s`` after the last byte of the one
before starts a new period); each period's first ``settle_bytes`` are left
out (a token bucket's burst, TCP's start after idle: they come faster than
the link's rate), and so is a period whose rest took under ``min_seconds``
(short messages, whose time is latency, not rate). What is left is bytes and
seconds per peer: their quotient is the pair's rate while it was busy (a
share of the slower port where several pairs share one).

``PortChange`` compares a pair-rate matrix with the one the same plan gave
before (its baseline): a port's score is the median of its pairs' ratios (a
send port: its row; a receive port: its column; inside its cluster and
across, apart), so that one pair slowed by another port does not move it. A
port whose score is off by more than ``threshold`` in ``patience``
consecutive observations has changed: no flapping on noise.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np

from jaxcc.network import host


class Received(NamedTuple):
  """Per sending process: bytes received in timed busy periods, and their seconds."""
  bytes: np.ndarray
  seconds: np.ndarray


def received_rates(records: np.ndarray, nproc: int, *, settle_bytes: int = 256 << 10,
                   gap_s: float = 2e-3, min_seconds: float = 5e-3) -> Received:
  """What this process received from each peer in collectives' frames, timed (module doc)."""
  got, secs = np.zeros(nproc), np.zeros(nproc)
  mine = records[(records["direction"] == host.RECEIVED) & (records["op"] > 0)]
  if not len(mine):
    return Received(got, secs)
  mine = np.sort(mine, order=["peer", "first_ns"])
  peer, first, last = mine["peer"], mine["first_ns"], mine["last_ns"]
  # A period starts at a peer's first frame and after every gap over gap_s.
  starts = np.flatnonzero(np.r_[True, (peer[1:] != peer[:-1]) |
                                (first[1:] - last[:-1] > int(gap_s * 1e9))])
  ends = np.r_[starts[1:], len(mine)] - 1
  total = np.cumsum(mine["bytes"].astype(np.float64))
  done = total - np.repeat(total[starts] - mine["bytes"][starts], np.diff(np.r_[starts,
                                                                                len(mine)]))
  # The frame that ends a period's settle: its first whose bytes so far reach settle_bytes.
  index = np.where(done >= settle_bytes, np.arange(len(mine)), len(mine))
  settled = np.minimum(np.minimum.reduceat(index, starts), ends)
  seconds = (last[ends] - last[settled]) / 1e9
  timed = (settled < ends) & (seconds >= min_seconds)
  np.add.at(got, peer[starts][timed], (done[ends] - done[settled])[timed])
  np.add.at(secs, peer[starts][timed], seconds[timed])
  return Received(got, secs)


def rate_matrix(rows: list[Received]) -> np.ndarray:
  """``[src, dst]`` bytes/s from every process' ``Received`` (process ``dst``'s row); NaN where
  nothing was timed."""
  got = np.array([r.bytes for r in rows]).T
  secs = np.array([r.seconds for r in rows]).T
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.where(secs > 0, got / secs, np.nan)


class PortChange:
  """Says which ports changed against the baseline of the current plan (module doc).

  Args:
    cluster: the cluster of each rank (None: one), so that ports inside a
      cluster and across are scored apart.
    threshold: a score off by more than this fraction counts (``|log s| >
      log(1 + threshold)``).
    patience: consecutive observations off before a port has changed.
    warmup: observations whose median is the baseline.
  """

  def __init__(self, cluster: tuple[int, ...] | None, p: int, *, threshold: float = 0.25,
               patience: int = 2, warmup: int = 2):
    cluster = np.zeros(p, int) if cluster is None else np.asarray(cluster)
    self._levels = {"intra": np.equal.outer(cluster, cluster) & ~np.eye(p, dtype=bool),
                    "inter": ~np.equal.outer(cluster, cluster)}
    self._limit = np.log1p(threshold)
    self._patience, self._warmup = patience, warmup
    self.reset()

  def reset(self) -> None:
    """Forget the baseline (a new plan moves other bytes over other pairs)."""
    self._seen: list[np.ndarray] = []
    self.baseline: np.ndarray | None = None
    self._streak: dict[tuple[str, str, int], int] = {}

  def update(self, rates: np.ndarray) -> list[tuple[str, str, int, float]]:
    """Take one observation (``[src, dst]`` rates, NaN where none); return the ports that
    changed, as (level, "send" or "recv", rank, score)."""
    if np.isnan(rates).all():
      return []
    if self.baseline is None:
      self._seen.append(rates)
      if len(self._seen) >= self._warmup:
        with warnings.catch_warnings():
          warnings.simplefilter("ignore", RuntimeWarning)
          self.baseline = np.nanmedian(np.stack(self._seen), axis=0)
      return []
    with np.errstate(invalid="ignore", divide="ignore"):
      ratio = rates / self.baseline
    changed = []
    for level, mask in self._levels.items():
      scored = np.where(mask, ratio, np.nan)
      for port, axis in (("send", 1), ("recv", 0)):
        with warnings.catch_warnings():  # a port with no pair observed: NaN, no warning
          warnings.simplefilter("ignore", RuntimeWarning)
          scores = np.nanmedian(scored, axis=axis)
        for rank, score in enumerate(scores):
          key = (level, port, rank)
          if np.isnan(score):
            continue  # not observed: the streak stands
          off = abs(np.log(score)) > self._limit
          self._streak[key] = self._streak.get(key, 0) + 1 if off else 0
          if self._streak[key] >= self._patience:
            changed.append((level, port, rank, float(score)))
    return changed
