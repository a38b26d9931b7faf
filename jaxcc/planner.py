"""The planner: from (collective, size, topology, algorithm) to the Schedule executors run.

It sits above the algorithms and the IR (``jaxcc.schedules``) and the
simulator (``jaxcc.sim``): ``algorithm="auto"`` is the candidate of
``AUTO_CANDIDATES`` with the smallest ``price``: simulated for small tables,
modelled in closed form for large ones. ``schedule`` is the one
way to get a schedule; ``plan`` is it in bytes (the public ``jaxcc.plan``).
Every error names ``api``, the public function the user called.
"""

from __future__ import annotations

import functools

from jaxcc import sim
from jaxcc.schedules.depth import MIN_PIECE_BYTES, choose_chunks
from jaxcc.schedules.direct import direct, direct_broadcast
from jaxcc.schedules.hierarchical import hierarchical
from jaxcc.schedules.ir import Schedule, check_perm
from jaxcc.schedules.optcc import optcc, transfers_per_chunk
from jaxcc.schedules.permute import permute
from jaxcc.schedules.r2ccl import r2ccl
from jaxcc.schedules.ring import chain_broadcast, ring
from jaxcc.sim.model import MODELLED, model_time
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
  chunks = chunks or depth(collective, length, itemsize, topology, algorithm)
  return _build(collective, length, itemsize, topology, algorithm, root, chunks,
                perm).validate(api)


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
          min_piece_bytes: int = MIN_PIECE_BYTES) -> int:
  """The pipeline depth of ``algorithm``'s schedule (``choose_chunks``): OptCC's grid form
  moves fewer transfers per chunk than the direct and ring forms, so it may go deeper.
  ``min_piece_bytes=0`` is the fluid model's depth (no per-message cost)."""
  transfers = transfers_per_chunk(topology.bandwidth) if algorithm == "optcc" else None
  return choose_chunks(collective, length * itemsize, topology.size, transfers=transfers,
                       min_piece_bytes=min_piece_bytes)


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
  ``SIMULATED_TRANSFERS`` rows (counted without building it)."""
  p = topology.size
  if collective == "ppermute":
    rows = p * chunks
  elif collective == "broadcast":
    rows = (p - 1) * (chunks if algorithm == "ring" else 1)
  else:
    rows = (2 if collective == "all_reduce" else 1) * p * (p - 1) * chunks
  return topology.cluster is None and rows > SIMULATED_TRANSFERS


def _pick(collective, length, itemsize, topology, root, chunks, perm, api) -> str:
  names = candidates(collective, topology)
  if len(names) == 1:
    return names[0]
  for name in names:  # what is simulated is built and validated here, so errors name `api`
    k = chunks or depth(collective, length, itemsize, topology, name)
    if not _modelled(collective, name, topology, k):
      _build(collective, length, itemsize, topology, name, root, k, perm).validate(api)
  return _cheapest(collective, length, itemsize, topology, root, chunks, perm)


@functools.lru_cache(maxsize=256)
def _cheapest(collective, length, itemsize, topology, root, chunks, perm) -> str:
  times = [price(collective, length, itemsize, topology, name, root=root,
                 chunks=chunks or depth(collective, length, itemsize, topology, name), perm=perm)
           for name in candidates(collective, topology)]
  return candidates(collective, topology)[times.index(min(times))]


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
    return optcc(length, p, itemsize, chunks, topology.bandwidth)
  return r2ccl(length, p, itemsize, chunks, topology.bandwidth)
