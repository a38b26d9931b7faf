"""The border communicator in JAX terms: a hierarchical collective whose intra-cluster phases
run on XLA's collective over the inner mesh axes and whose cross-cluster phase runs on a
native engine over the outer axis (research/hetccl.md §4).

Over ``axis_name = (outer, *inner)`` with every group of the outer axis one
cluster of ``n`` ranks (equal ports, each with a cross-cluster port), the
hierarchical schedule gives rank ``j`` of every cluster the same tile. So:

* all_reduce (N elements): ``lax.all_to_all`` over the inner axes moves each
  tile to its owner (``(n-1)/n N`` out per rank), which sums the n pieces in
  the schedule's order with ``jaxcc_reduce``; the cross phase all-reduces the
  tile over the outer axis (the hierarchical schedule of C one-rank clusters:
  ``(1 + (C-2) f_c) N / n`` out per rank); ``lax.all_gather`` over the inner
  axes returns the result (``(n-1)/n N`` out).
* reduce_scatter: the same first phase on the tiles of the ranks that share
  this rank's inner index, then a reduce_scatter of those C tiles over the
  outer axis.
* all_gather: an all_gather of this rank's tile over the outer axis, then
  over the inner axes.

The sums are those of the full hierarchical schedule, element by element and
in the same order: inside a cluster at the owner ``o`` over the ranks in
ascending ``(o - r) mod n``, then across clusters at the cross owner ``g``
over the clusters in ascending ``(g - c) mod C``, fp32 accumulation of
16-bit floats. So the bits equal the native and XLA-twin runs of the full
schedule. On the CPU the reduction after ``all_to_all`` is the
``jaxcc_reduce`` kernel; the transport is XLA's (in-process, gloo or NCCL).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxcc import planner
from jaxcc._src import native_executor
from jaxcc._src.engines import Engine
from jaxcc._src.reduce import reduce_sum
from jaxcc.schedules.hierarchical import cross_bandwidths
from jaxcc.topology import Topology


def cross_topology(topology: Topology) -> Topology:
  """The outer axis as one-rank clusters, each with its cluster's summed cross-cluster
  bandwidth (so the cross shares are the full schedule's)."""
  return Topology.clusters([1] * topology.num_clusters, 1.0, cross_bandwidths(topology), latency=0.0,
                           inter_latency=max(topology.inter_latency))


def all_reduce(buf: jax.Array, route, params: dict) -> jax.Array:
  outer, inner, n, c = _axes(params)
  pieces = lax.all_to_all(buf.reshape(n, -1), inner, 0, 0)  # row r: inner rank r's piece
  tile = _ordered_sum(pieces, inner, n)
  tile = _cross(tile, route, params, "all_reduce", outer)
  return lax.all_gather(tile, inner, tiled=True)


def reduce_scatter(buf: jax.Array, route, params: dict) -> jax.Array:
  outer, inner, n, c = _axes(params)
  # buf holds p tiles in rank order (outer major): row j of the inner split are the tiles
  # (k, j) of every cluster k.
  tiles = buf.reshape(c, n, -1).transpose(1, 0, 2).reshape(n, -1)
  partial = _ordered_sum(lax.all_to_all(tiles, inner, 0, 0), inner, n)
  full = _cross(partial, route, params, "reduce_scatter", outer)
  return lax.dynamic_slice_in_dim(full, lax.axis_index(outer) * (full.shape[0] // c),
                                  full.shape[0] // c)


def all_gather(tile: jax.Array, route, params: dict) -> jax.Array:
  outer, inner, n, c = _axes(params)
  buf = lax.dynamic_update_slice_in_dim(jnp.zeros((c * tile.shape[0],), tile.dtype), tile,
                                        lax.axis_index(outer) * tile.shape[0], 0)
  mine = _cross(buf, route, params, "all_gather", outer)  # tiles (k, j) for every k
  rows = lax.all_gather(mine.reshape(c, -1), inner)  # (n, c, t): [j, k]
  return rows.transpose(1, 0, 2).reshape(-1)


def _axes(params):
  (outer, c), *inner = params["axes"]
  names = tuple(a for a, _ in inner)
  return outer, names if len(names) > 1 else names[0], int(np.prod([s for _, s in inner])), c


def _ordered_sum(pieces: jax.Array, inner, n: int) -> jax.Array:
  """Sum of the n pieces received, own first, then from inner ranks ``j-1, j-2, ...``."""
  j = lax.axis_index(inner)
  order = (j - jnp.arange(n)) % n
  rows = jnp.take(pieces, order, axis=0)
  return reduce_sum([rows[k] for k in range(n)])


def _cross(buf, route, params, collective, outer):
  """The cross-cluster phase over the outer axis on the route's native engine."""
  topo = cross_topology(params["topology"])
  itemsize = np.dtype(buf.dtype).itemsize
  chunks = None if route.cross is Engine.TCP else 1
  group_axes = params["cross_group_axes"]
  ranks = native_executor.held_ranks(topo.size, route.procs, outer, group_axes)
  sched = planner.rank_schedule(collective, buf.shape[0], itemsize, topo, "hierarchical", ranks,
                                chunks=chunks, api=f"jaxcc.{collective}")
  if route.cross is Engine.NCCL:
    return native_executor.run_schedule_cuda(buf, sched, outer, group_axes)
  if route.cross is Engine.TCP:
    return native_executor.run_schedule(buf, sched, outer, group_axes, route.procs, topo)
  return native_executor.run_schedule(buf, sched, outer, group_axes)
