"""The planner: from (collective, size, topology, algorithm) to the Schedule executors run.

It sits above the algorithms and the IR (``jaxcc.schedules``) and the
simulator (``jaxcc.sim``): ``algorithm="auto"`` is the candidate of
``AUTO_CANDIDATES`` with the smallest ``price``: simulated for small tables,
modelled in closed form for large ones. ``schedule`` is the one
way to get a schedule; ``plan`` is it in bytes (the public ``jaxcc.plan``);
``rank_schedule`` its part for the ranks of one process, planned without the whole table
where the algorithm allows.
Every error names ``api``, the public function the user called.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib

import numpy as np

from jaxcc import sim
from jaxcc.schedules.depth import depth_limit
from jaxcc.schedules.direct import direct, direct_broadcast
from jaxcc.schedules.hierarchical import hierarchical
from jaxcc.schedules.ir import TABLE_VERSION, RankSchedule, Schedule, check_perm
from jaxcc.schedules.optcc import messages_per_chunk, optcc, orderings
from jaxcc.schedules.permute import permute
from jaxcc.schedules.r2ccl import r2ccl
from jaxcc.schedules.ring import chain_broadcast, ring
from jaxcc.sim.model import MODELLED, model_time, optcc_min_owners, pipeline_time
from jaxcc.topology import Topology

ALGORITHMS = {
    "all_reduce": ("ring", "direct", "optcc", "r2ccl", "hierarchical"),
    "reduce_scatter": ("ring", "direct", "hierarchical"),
    "all_gather": ("ring", "direct", "hierarchical"),
    "broadcast": ("ring", "direct"),
    "ppermute": ("direct",),
}
# What "auto" chooses among: every algorithm but the baselines kept for comparison (each
# with a closed form, so that large ones are priced without a table), and "hierarchical"
# where the topology has several clusters (``candidates``).
AUTO_CANDIDATES = MODELLED
# "auto" simulates candidates of at most this many transfers; larger ones it models.
SIMULATED_TRANSFERS = 1 << 14
# OptCC's orderings (``optcc.orderings``) are simulated for tables of at most this many rows.
PRICED_ORDERINGS = 1 << 19
# The algorithms whose builders plan some ranks' rows without the whole table (flat topologies).
LOCAL = {"all_reduce": ("ring", "direct", "optcc"), "reduce_scatter": ("ring", "direct"),
         "all_gather": ("ring", "direct")}


def plan(collective: str, nbytes: int, topology: Topology, algorithm: str = "auto", *,
         itemsize: int = 4, root: int = 0, chunks: int | None = None, perm=None,
         api: str = "jaxcc.plan") -> Schedule:
  """The schedule of ``collective`` on ``nbytes`` per rank over ``topology``.

  Args:
    collective: "all_reduce", "reduce_scatter", "all_gather", "broadcast" or
      "ppermute".
    nbytes: bytes of each rank's buffer (the full, unscattered buffer); for a
      ppermute, of the array each source sends (the schedule's buffer holds
      it and the one received: ``2 nbytes``).
    topology: the ranks and their bandwidths.
    algorithm: one of ``ALGORITHMS[collective]``, or "auto" for the candidate
      with the smallest price (``price``).
    itemsize: bytes per element; ``nbytes`` must be a multiple of it.
    root: the source rank of a broadcast.
    chunks: pipeline depth; by default from the cost model (``depth``).
    perm: the ``(src, dst)`` pairs of a ppermute (required for it).
    api: the public function the error messages name.

  Returns:
    The Schedule (cached: equal arguments give the same object).
  """
  _check_itemsize(itemsize, api)
  if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0 or nbytes % itemsize:
    raise ValueError(
        f"{api}: nbytes must be a non-negative multiple of itemsize={itemsize}, got {nbytes!r}")
  return schedule(collective, nbytes // itemsize, itemsize, topology, algorithm, root=root,
                  chunks=chunks, perm=perm, api=api)


def schedule(collective: str, length: int, itemsize: int, topology: Topology, algorithm: str,
             *, root: int = 0, chunks: int | None = None, perm=None,
             api: str = "jaxcc.plan") -> Schedule:
  """``plan`` in elements: the validated schedule for ``length`` elements per rank, cached.

  ``chunks=None`` is the depth ``depth`` picks for the algorithm (the
  pipelined schedule), ``chunks=1`` one chunk. "auto" is resolved at the depth
  asked for (``auto_algorithm``).
  """
  root, chunks, perm = _arguments(collective, length, itemsize, topology, algorithm, root,
                                  chunks, perm, api)
  if algorithm == "auto":
    algorithm = _pick(collective, length, itemsize, topology, root, chunks, perm, api)
  chunks = chunks or depth(collective, length, itemsize, topology, algorithm, root=root,
                           perm=perm)
  return _build(collective, length, itemsize, topology, algorithm, root, chunks,
                perm).validate(api)


def rank_schedule(collective: str, length: int, itemsize: int, topology: Topology,
                  algorithm: str, ranks, *, root: int = 0, chunks: int | None = None, perm=None,
                  api: str = "jaxcc.plan") -> RankSchedule:
  """The part of ``schedule``'s schedule that ``ranks`` send or receive: what a process holding
  them runs (``RankSchedule``, cached).

  Ring, direct and OptCC on a flat topology plan those rows only, in time and memory that grow
  with them and p, not with the whole table (``LOCAL``); the other algorithms, and every one
  when ``ranks`` holds every rank, cut the validated whole schedule. Its ``digest`` hashes the
  planning arguments, so every process has the same one whichever part it planned.
  """
  root, chunks, perm = _arguments(collective, length, itemsize, topology, algorithm, root,
                                  chunks, perm, api)
  ranks = _check_ranks(ranks, topology.size, api)
  if algorithm == "auto":
    algorithm = _pick(collective, length, itemsize, topology, root, chunks, perm, api)
  chunks = chunks or depth(collective, length, itemsize, topology, algorithm, root=root,
                           perm=perm)
  if not _plans_part(collective, algorithm, topology, ranks):
    _build(collective, length, itemsize, topology, algorithm, root, chunks, perm).validate(api)
  return _part(collective, length, itemsize, topology, algorithm, root, chunks, perm, ranks)


def auto_algorithm(collective: str, length: int, itemsize: int, topology: Topology, *,
                   root: int = 0, perm=None, chunks: int | None = None,
                   api: str = "jaxcc.plan") -> str:
  """The algorithm "auto" stands for: the candidate with the smallest ``price``.

  The candidates (``candidates``) are priced at depth ``chunks`` (None: each
  at the depth ``depth`` picks for it, as the Tcp transport runs them); ties
  go to the first.
  """
  root, chunks, perm = _arguments(collective, length, itemsize, topology, "auto", root,
                                  chunks, perm, api)
  return _pick(collective, length, itemsize, topology, root, chunks, perm, api)


def depth(collective: str, length: int, itemsize: int, topology: Topology, algorithm: str, *,
          root: int = 0, perm=None) -> int:
  """The pipeline depth of ``algorithm``'s schedule, a power of two within ``depth_limit``.

  The depth of the least modelled time (``sim.model.pipeline_time``), which
  trades the pipeline's fill against the topology's message costs
  (``jaxcc.schedules.depth``); without message costs the limit. Where the
  tables are small (``SIMULATED_TRANSFERS``) the simulator has the last
  word: from the modelled depth the depth moves to a neighbour as long as the
  simulator times that faster. Cached.
  """
  return _depth(collective, length, itemsize, topology, algorithm, root,
                None if perm is None else tuple(map(tuple, perm)))


@functools.lru_cache(maxsize=1024)
def _depth(collective, length, itemsize, topology, algorithm, root, perm) -> int:
  if collective == "broadcast" and algorithm == "direct":
    return 1  # one whole copy per rank: nothing to pipeline
  rank = None
  if algorithm == "optcc":
    owners = optcc_min_owners(length * itemsize, topology)
    rank = 2 * int(messages_per_chunk(topology.bandwidth, owners).max())
  limit = depth_limit(collective, length, topology.size, rank)
  depths = [1 << i for i in range(limit.bit_length())]
  i = min(range(len(depths)), key=lambda i: pipeline_time(
      collective, algorithm, length * itemsize, topology, depths[i], root=root, perm=perm or ()))

  @functools.cache
  def simulated(k):
    if _rows(collective, algorithm, topology.size, k) > SIMULATED_TRANSFERS:
      return float("inf")
    sched = _build(collective, length, itemsize, topology, algorithm, root, k, perm)
    return sim.simulate(sched, topology).time

  for step in (-1, 1):  # a depth whose table is too large to simulate stays the model's
    while (0 <= i + step < len(depths)
           and simulated(depths[i + step]) < simulated(depths[i]) < float("inf")):
      i += step
  return depths[i]


def candidates(collective: str, topology: Topology) -> tuple[str, ...]:
  """The algorithms "auto" prices for ``collective`` on ``topology``."""
  names = AUTO_CANDIDATES[collective]
  if topology.num_clusters > 1 and "hierarchical" in ALGORITHMS[collective]:
    names += ("hierarchical",)
  return names


def check_algorithm(collective: str, algorithm: str, api: str) -> None:
  """Raise a ValueError naming ``api`` and the choices if ``algorithm`` does not fit."""
  if collective not in ALGORITHMS:
    raise ValueError(f"{api}: unknown collective {collective!r}; expected one of "
                     f"{tuple(ALGORITHMS)}")
  if algorithm != "auto" and algorithm not in ALGORITHMS[collective]:
    others = [c for c, algs in ALGORITHMS.items() if algorithm in algs]
    hint = f" ({algorithm!r} is for {', '.join(others)} only)" if others else ""
    raise ValueError(
        f"{api}: unsupported algorithm {algorithm!r} for {collective}{hint}; "
        f"expected one of {('auto',) + ALGORITHMS[collective]}")


def _check_itemsize(itemsize, api: str) -> None:
  if isinstance(itemsize, bool) or not isinstance(itemsize, int) or itemsize < 1:
    raise ValueError(f"{api}: itemsize must be a positive integer, got {itemsize!r}")


def _arguments(collective, length, itemsize, topology, algorithm, root, chunks, perm, api):
  """Validates the arguments; returns ``(root, chunks, perm)`` as the cache keys them
  (``chunks`` None: each algorithm's own ``depth``)."""
  if not isinstance(topology, Topology):
    raise TypeError(f"{api}: topology must be a jaxcc.Topology, got {type(topology).__name__}")
  check_algorithm(collective, algorithm, api)
  _check_itemsize(itemsize, api)
  if isinstance(length, bool) or not isinstance(length, int) or length < 0:
    raise ValueError(f"{api}: the buffer must have a non-negative integer number of elements, "
                     f"got {length!r}")
  p = topology.size
  if collective == "ppermute":
    perm = check_perm(perm, p, api)
  elif perm is not None:
    raise ValueError(f"{api}: perm is for ppermute only, not {collective!r}")
  if collective in ("reduce_scatter", "all_gather") and length % p:
    raise ValueError(
        f"{api}: the buffer of {length} elements does not split into {p} equal shards; "
        f"the scattered/gathered dimension must be divisible by the axis size {p}")
  if collective != "broadcast":
    root = 0
  elif isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < p:
    raise ValueError(f"{api}: root must be a rank in [0, {p}), got {root!r}")
  if chunks is not None and (isinstance(chunks, bool) or not isinstance(chunks, int)
                             or chunks < 1):
    raise ValueError(f"{api}: chunks must be a positive integer, got {chunks!r}")
  return root, chunks, perm


def price(collective: str, length: int, itemsize: int, topology: Topology, algorithm: str, *,
          root: int = 0, chunks: int, perm=()) -> float:
  """The time "auto" ranks ``algorithm`` by, in seconds: simulated (``sim.simulate``) while
  its table has at most ``SIMULATED_TRANSFERS`` rows or the topology has clusters, else
  modelled in closed form (``sim.model.model_time``) without building the table."""
  if _modelled(collective, algorithm, topology, chunks):
    return model_time(collective, algorithm, length * itemsize, topology, chunks, root=root,
                      perm=perm or ())
  sched = _build(collective, length, itemsize, topology, algorithm, root, chunks, perm)
  return sim.simulate(sched, topology).time


def _modelled(collective: str, algorithm: str, topology: Topology, chunks: int) -> bool:
  """Whether ``price`` models the schedule: a flat topology and a table of more than
  ``SIMULATED_TRANSFERS`` rows."""
  return (topology.cluster is None
          and _rows(collective, algorithm, topology.size, chunks) > SIMULATED_TRANSFERS)


@functools.lru_cache(maxsize=256)
def _optcc_lags(length: int, itemsize: int, topology: Topology, chunks: int):
  """OptCC's ordering (``optcc.orderings``) that the simulator times fastest on ``topology``
  (ties: the first) where its table has at most ``PRICED_ORDERINGS`` rows, else the first."""
  bw, owners = topology.bandwidth, optcc_min_owners(length * itemsize, topology)
  lags = orderings(bw, owners)
  if len(lags) == 1 or int(messages_per_chunk(bw, owners).sum()) * chunks > PRICED_ORDERINGS:
    return lags[0]
  return min(lags, key=lambda lag: sim.simulate(
      optcc(length, topology.size, itemsize, chunks, bw, lags=lag, min_owners=owners),
      topology).time)


def _rows(collective: str, algorithm: str, p: int, chunks: int) -> int:
  """The transfers of a schedule, counted without building it (the direct form's)."""
  if collective == "ppermute":
    return p * chunks
  if collective == "broadcast":
    return (p - 1) * (chunks if algorithm == "ring" else 1)
  return (2 if collective == "all_reduce" else 1) * p * (p - 1) * chunks


def _pick(collective, length, itemsize, topology, root, chunks, perm, api) -> str:
  names = candidates(collective, topology)
  if len(names) == 1:
    return names[0]
  for name in names:  # what is simulated is built and validated here, so errors name `api`
    k = chunks or depth(collective, length, itemsize, topology, name, root=root, perm=perm)
    if not _modelled(collective, name, topology, k):
      _build(collective, length, itemsize, topology, name, root, k, perm).validate(api)
  return _cheapest(collective, length, itemsize, topology, root, chunks, perm)


@functools.lru_cache(maxsize=256)
def _cheapest(collective, length, itemsize, topology, root, chunks, perm) -> str:
  times = [price(collective, length, itemsize, topology, name, root=root,
                 chunks=chunks or depth(collective, length, itemsize, topology, name, root=root,
                                        perm=perm), perm=perm)
           for name in candidates(collective, topology)]
  return candidates(collective, topology)[times.index(min(times))]


def _check_ranks(ranks, p: int, api: str) -> tuple[int, ...]:
  """``ranks`` sorted, each once, as the cache keys them."""
  try:
    out = tuple(sorted({int(r) for r in np.asarray(ranks).reshape(-1)}))
  except (TypeError, ValueError):
    raise ValueError(f"{api}: ranks must be integers, got {ranks!r}") from None
  if not out or out[0] < 0 or out[-1] >= p:
    raise ValueError(f"{api}: ranks must be ranks in [0, {p}), at least one, got {ranks!r}")
  return out


def _plans_part(collective: str, algorithm: str, topology: Topology, ranks) -> bool:
  """Whether ``rank_schedule`` plans the rows of ``ranks`` without the whole table."""
  return (len(ranks) < topology.size and topology.cluster is None
          and algorithm in LOCAL.get(collective, ()))


@functools.lru_cache(maxsize=64)
def _part(collective, length, itemsize, topology, algorithm, root, chunks, perm,
          ranks) -> RankSchedule:
  """``rank_schedule``'s part, from validated arguments."""
  key = (TABLE_VERSION, collective, length, itemsize, topology, algorithm, root, chunks, perm)
  digest = hashlib.sha256(repr(key).encode()).hexdigest()
  if not _plans_part(collective, algorithm, topology, ranks):
    return RankSchedule.of(_build(collective, length, itemsize, topology, algorithm, root,
                                  chunks, perm), ranks, digest, topology.cluster)
  p = topology.size
  if algorithm == "ring":
    part = ring(collective, length, p, itemsize, chunks, ranks)
  elif algorithm == "direct":
    part = direct(collective, length, p, itemsize, chunks, ranks)
  else:
    part = optcc(length, p, itemsize, chunks, topology.bandwidth, ranks,
                 _optcc_lags(length, itemsize, topology, chunks),
                 optcc_min_owners(length * itemsize, topology))
  return dataclasses.replace(part, digest=digest)


@functools.lru_cache(maxsize=256)
def _build(collective, length, itemsize, topology, algorithm, root, chunks, perm) -> Schedule:
  """The schedule of a named algorithm, from validated arguments."""
  p = topology.size
  if collective == "ppermute":
    return permute(perm, length, p, itemsize, chunks)
  if collective == "broadcast":
    if algorithm == "direct":
      return direct_broadcast(length, p, itemsize, root)
    return chain_broadcast(length, p, itemsize, chunks, root)
  if algorithm == "ring":
    return ring(collective, length, p, itemsize, chunks)
  if algorithm == "direct":
    return direct(collective, length, p, itemsize, chunks)
  if algorithm == "hierarchical":
    return hierarchical(collective, length, itemsize, chunks, topology)
  if algorithm == "optcc":
    return optcc(length, p, itemsize, chunks, topology.bandwidth,
                 lags=_optcc_lags(length, itemsize, topology, chunks),
                 min_owners=optcc_min_owners(length * itemsize, topology))
  return r2ccl(length, p, itemsize, chunks, topology.bandwidth)
