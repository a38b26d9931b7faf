"""plan(): from (collective, size, topology, algorithm) to a Schedule."""

from __future__ import annotations

import functools

from jaxcc.schedules.direct import direct, direct_broadcast
from jaxcc.schedules.ir import Schedule
from jaxcc.schedules.optcc import optcc
from jaxcc.schedules.permute import check_perm, permute
from jaxcc.schedules.r2ccl import r2ccl
from jaxcc.schedules.ring import chain_broadcast, ring
from jaxcc.topology import Topology

ALGORITHMS = {
    "all_reduce": ("ring", "direct", "optcc", "r2ccl"),
    "reduce_scatter": ("ring", "direct"),
    "all_gather": ("ring", "direct"),
    "broadcast": ("ring", "direct"),
    "ppermute": ("direct",),
}
# What "auto" chooses among: every algorithm but the baselines kept for comparison.
AUTO_CANDIDATES = {
    "all_reduce": ("ring", "direct", "optcc"),
    "reduce_scatter": ("ring", "direct"),
    "all_gather": ("ring", "direct"),
    "broadcast": ("ring", "direct"),
    "ppermute": ("direct",),
}
# Pipeline depth: at most MAX_CHUNKS chunks, pieces of at least MIN_PIECE_BYTES, at most
# MAX_MESSAGES transfers in a schedule.
MIN_PIECE_BYTES = 64 << 10
MAX_CHUNKS = 1024
MAX_MESSAGES = 1 << 20


def plan(collective: str, nbytes: int, topology: Topology, algorithm: str = "auto", *,
         itemsize: int = 4, root: int = 0, chunks: int | None = None,
         perm=None) -> Schedule:
  """The schedule of ``collective`` on ``nbytes`` per rank over ``topology``.

  Args:
    collective: "all_reduce", "reduce_scatter", "all_gather", "broadcast" or
      "ppermute".
    nbytes: bytes of each rank's buffer (the full, unscattered buffer); for a
      ppermute, of the array each source sends (the schedule's buffer holds
      it and the one received: ``2 nbytes``).
    topology: the ranks and their bandwidths.
    algorithm: one of ``ALGORITHMS[collective]``, or "auto" for the candidate
      with the smallest simulated time.
    itemsize: bytes per element; ``nbytes`` must be a multiple of it.
    root: the source rank of a broadcast.
    chunks: pipeline depth; by default from the cost model (``choose_chunks``).
    perm: the ``(src, dst)`` pairs of a ppermute (required for it).

  Returns:
    The Schedule (cached: equal arguments give the same object).
  """
  if not isinstance(topology, Topology):
    raise TypeError(f"plan: topology must be a jaxcc.Topology, got {type(topology).__name__}")
  if not isinstance(itemsize, int) or itemsize < 1:
    raise ValueError(f"plan: itemsize must be a positive integer, got {itemsize!r}")
  if not isinstance(nbytes, int) or nbytes < 0 or nbytes % itemsize:
    raise ValueError(
        f"plan: nbytes must be a non-negative multiple of itemsize={itemsize}, got {nbytes!r}")
  if collective == "ppermute":  # hashable for the cache
    perm = check_perm(perm, topology.size, "plan")
  elif perm is not None:
    raise ValueError(f"plan: perm is for ppermute only, not {collective!r}")
  return schedule_for(collective, nbytes // itemsize, itemsize, topology, algorithm, root, chunks,
                      perm)


@functools.lru_cache(maxsize=256)
def schedule_for(collective: str, length: int, itemsize: int, topology: Topology,
                 algorithm: str, root: int = 0, chunks: int | None = None,
                 perm: tuple[tuple[int, int], ...] | None = None) -> Schedule:
  """``plan`` in elements (``length`` per rank as ``plan``'s ``nbytes``); validated, cached."""
  p = topology.size
  check_algorithm(collective, algorithm)
  if collective == "ppermute":
    perm = check_perm(perm, p, "ppermute")
  if collective in ("reduce_scatter", "all_gather") and length % p:
    raise ValueError(
        f"{collective}: the buffer of {length} elements does not split into {p} equal shards; "
        f"the scattered/gathered dimension must be divisible by the axis size {p}")
  if collective == "broadcast" and not (isinstance(root, int) and 0 <= root < p):
    raise ValueError(f"broadcast: root must be a rank in [0, {p}), got {root!r}")
  if algorithm == "auto":
    from jaxcc.sim import simulate  # the simulator plans with the schedules; import late
    best = None
    for name in AUTO_CANDIDATES[collective]:
      sched = schedule_for(collective, length, itemsize, topology, name, root, chunks, perm)
      t = simulate(sched, topology).time
      if best is None or t < best[0]:
        best = (t, sched)
    return best[1]
  k = chunks if chunks is not None else choose_chunks(collective, length * itemsize, p)
  if not isinstance(k, int) or k < 1:
    raise ValueError(f"plan: chunks must be a positive integer, got {k!r}")
  bw = topology.bandwidth
  if collective == "ppermute":
    return permute(perm, length, p, itemsize, k)
  if collective == "broadcast":
    if algorithm == "direct":
      return direct_broadcast(length, p, itemsize, root)
    return chain_broadcast(length, p, itemsize, k, root)
  if algorithm == "ring":
    return ring(collective, length, p, itemsize, k)
  if algorithm == "direct":
    return direct(collective, length, p, itemsize, k)
  if algorithm == "optcc":
    return optcc(length, p, itemsize, k, bw)
  return r2ccl(length, p, itemsize, k, bw)


def pipelined(schedule: Schedule, topology: Topology) -> Schedule:
  """``schedule`` planned again (collective, size, algorithm, root, perm) at the depth
  ``choose_chunks`` picks for ``topology``."""
  if schedule.collective == "ppermute":
    return schedule_for("ppermute", schedule.length // 2, schedule.itemsize, topology,
                        schedule.algorithm, perm=schedule.perm)
  return schedule_for(schedule.collective, schedule.length, schedule.itemsize, topology,
                      schedule.algorithm, schedule.root)


def check_algorithm(collective: str, algorithm: str) -> None:
  """Raise a ValueError naming the choices if ``algorithm`` does not fit ``collective``."""
  if collective not in ALGORITHMS:
    raise ValueError(f"unknown collective {collective!r}; expected one of {tuple(ALGORITHMS)}")
  if algorithm != "auto" and algorithm not in ALGORITHMS[collective]:
    others = [c for c, algs in ALGORITHMS.items() if algorithm in algs]
    hint = f" ({algorithm!r} is for {', '.join(others)} only)" if others else ""
    raise ValueError(
        f"{collective}: unsupported algorithm {algorithm!r}{hint}; "
        f"expected one of {('auto',) + ALGORITHMS[collective]}")


def choose_chunks(collective: str, nbytes: int, p: int) -> int:
  """Pipeline depth K: the largest power of two within the limits above.

  The cost model: pipeline fill and drain cost about one chunk's share of the
  busiest port, ``T_bw * c / K`` with c of order 1 (measured in the
  simulator), so deeper is better until pieces (``nbytes / (p K)`` bytes, or
  ``nbytes / K`` for a broadcast chain and a ppermute) get so small that
  per-message costs dominate, or the schedule (about ``2 p^2`` transfers per
  chunk, ``p`` for those two) too long.
  """
  p = max(p, 1)
  whole = collective in ("broadcast", "ppermute")
  per_chunk = nbytes if whole else nbytes / p
  messages = p if whole else 2 * p * p
  k = 1
  while (2 * k <= MAX_CHUNKS and per_chunk / (2 * k) >= MIN_PIECE_BYTES
         and 2 * k * messages <= MAX_MESSAGES):
    k *= 2
  return k
