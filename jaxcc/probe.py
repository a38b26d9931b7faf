"""Topology measured from the network: per-pair rates over jaxcc's TCP transport, then clusters.

``probe_topology`` times transfers between the ranks of one mesh axis (one
rank per process, as on a cluster of hosts) with the native executor, the
transport jaxcc's collectives run on:

1. Rounds (``matchings``): every ordered pair once, in about ``2(p-1)``
   rounds in which each rank only sends or only receives, one schedule step
   each. A send returns once its bytes are in the socket's buffer, so a
   receiver's call time is its receive's alone.
2. Rates: each round's call runs once to compile, then back to back; the
   receiver's mean gap between the ends of its later calls times ``L`` bytes
   of a flow already running, which leaves out latency, TCP's start and a
   token bucket's burst (the calls that carried a pair's first 512 KiB). A
   first pass with ``nbytes`` per pair sizes the second, whose pairs carry
   ``seconds`` of their first-pass rate each; a pair whose gaps still come
   out under ``seconds / 2`` is measured again, sized by its latest rate.
3. Clusters: ranks joined by a pair rate above the widest gap (a factor of
   at least ``cluster_gap``) in the sorted pair rates form a cluster, each
   rate taken over the fastest pair of its slower end, so that a straggler
   stays in its cluster; no such gap: one flat cluster.
4. Ports: a rank's send (receive) rate inside its cluster is the fastest
   rate it reached to (from) a rank of its cluster, and likewise across
   clusters (a pair runs at the slower of its sender's and receiver's ports).

Bytes sent per rank: to each peer, ``nbytes`` times 2 + 512 KiB / ``nbytes`` + 4
in the first pass, and about 5 times ``seconds`` of its rate plus 1 MiB in the
second (and in each repeat of a short pair). On 8 testbed hosts at
200 Mbit/s inside two clusters and 20 Mbit/s across, 18-22 seconds.
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import multihost_utils
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from jaxcc._src import native_executor
from jaxcc.schedules.ir import COPY, Schedule, TableBuilder
from jaxcc.topology import Topology

_API = "jaxcc.probe_topology"
_ITEM = 4  # float32 elements
_SETTLE_BYTES = 512 << 10  # a pair's first bytes of a round, left out of its time
_GAPS = 4  # gaps between call ends timed per pair and round, at least
_PASSES = 3  # passes after the first: all pairs, then those whose gaps were too short
_GROWTH = 64  # the second pass sends at most this many times the first pass' bytes per pair


def probe_topology(mesh: Mesh, axis_name: str, *, nbytes: int = 64 << 10,
                   seconds: float = 0.08, cluster_gap: float = 2.0) -> Topology:
  """Measure the network between the ranks of ``axis_name`` and return it as a Topology.

  Every process must call it (it runs collectives). Call it again after the
  network changed: a new Topology passed to jaxcc's collectives re-plans them
  (one re-trace).

  Args:
    mesh: the mesh whose axis to probe; its other axes must have size 1, and
      every rank of the axis must live in its own process.
    axis_name: the axis.
    nbytes: bytes per pair in the first pass (sizes the second).
    seconds: the time each pair transfers for in the second pass.
    cluster_gap: the least ratio between the slowest rate inside clusters and
      the fastest across them for the ranks to count as clusters.

  Returns:
    A flat Topology (send and receive bandwidth per rank, bytes/s) or one of
    consecutive clusters, with latencies 0.
  """
  _check(mesh, axis_name, nbytes, seconds, cluster_gap)
  p = mesh.shape[axis_name]
  lengths = np.full((p, p), nbytes // _ITEM, np.int64)
  np.fill_diagonal(lengths, 0)
  rates = lengths * _ITEM / measure_times(mesh, axis_name, lengths)
  short = np.ones((p, p), bool)
  np.fill_diagonal(short, False)
  for _ in range(_PASSES):  # re-measure the pairs whose gaps came out short of `seconds` / 2
    lengths = np.where(short, np.clip(np.nan_to_num(rates) * seconds / _ITEM, nbytes // _ITEM,
                                      _GROWTH * nbytes // _ITEM), 0).astype(np.int64)
    times = measure_times(mesh, axis_name, lengths)
    rates = np.where(short, lengths * _ITEM / times, rates)
    short = short & (times < seconds / 2)
    if not short.any():
      break
  return topology_from_rates(rates, cluster_gap)


def measure_times(mesh: Mesh, axis_name: str, lengths: np.ndarray) -> np.ndarray:
  """Seconds pair ``[i, j]`` took for ``lengths[i, j]`` float32 elements (NaN on the diagonal
  and where ``lengths`` is 0), at the receiver.

  Each round's call runs once to compile, then back to back; a receiver
  leaves out the ends of the calls that carried its first ``_SETTLE_BYTES``
  (what a token bucket lets through at once, TCP's start) and takes the mean
  gap between the ends of the later ones (at least ``_GAPS``).

  Args:
    mesh: as for ``probe_topology``.
    axis_name: the axis.
    lengths: ``[i, j]``: float32 elements i sends j (``L``).
  """
  p = mesh.shape[axis_name]
  line_up, token = _line_up(mesh, axis_name)
  me = _my_rank(mesh, axis_name)
  skip = np.maximum(2, -(-_SETTLE_BYTES // np.maximum(lengths * _ITEM, 1)))
  mine = np.full((p, p), np.nan)  # [i, me]: this rank's receive time from i
  for pairs in matchings(lengths):
    run, x = _round(mesh, axis_name, pairs, lengths)
    calls = int(max(skip[s, d] for s, d in pairs)) + _GAPS
    run(x).block_until_ready()  # compiles, connects
    line_up(token).block_until_ready()
    done = []
    for _ in range(calls):  # back to back: a sender's next call starts as its bytes are queued
      run(x).block_until_ready()
      done.append(time.perf_counter())
    for src, dst in pairs:
      if dst == me:
        first = int(skip[src, dst]) - 1
        mine[src, me] = (done[-1] - done[first]) / (calls - 1 - first)
  gathered = np.asarray(multihost_utils.process_allgather(mine[None])).reshape(-1, p, p)
  return np.fmax.reduce(gathered)  # each process filled its own column, NaN elsewhere


def matchings(lengths: np.ndarray) -> list[list[tuple[int, int]]]:
  """The pairs with ``lengths > 0`` in rounds where each rank sends or receives, not both.

  A rank that only receives in a round times its receive alone; the senders'
  calls return once their bytes are in the socket. About ``2 (p - 1)`` rounds
  for all pairs, filled greedily by shift (``i -> i + k``).
  """
  p = len(lengths)
  todo = [(i, (i + k) % p) for k in range(1, p) for i in range(p) if lengths[i, (i + k) % p]]
  rounds = []
  while todo:
    busy, now, rest = set(), [], []
    for src, dst in todo:
      if src in busy or dst in busy:
        rest.append((src, dst))
      else:
        busy |= {src, dst}
        now.append((src, dst))
    rounds.append(now)
    todo = rest
  return rounds


@functools.cache
def _line_up(mesh: Mesh, axis_name: str):
  """A barrier over the axis (a psum, compiled once per mesh) and its input."""
  line_up = jax.jit(jax.shard_map(lambda b: lax.psum(b, axis_name), mesh=mesh,
                                  in_specs=P(axis_name), out_specs=P(axis_name)))
  token = jnp.zeros((mesh.shape[axis_name],), jnp.float32,
                    device=jax.sharding.NamedSharding(mesh, P(axis_name)))
  return line_up, token


def topology_from_rates(rates: np.ndarray, cluster_gap: float = 2.0) -> Topology:
  """The Topology of a measured ``[src, dst]`` rate matrix (bytes/s, diagonal ignored).

  Clusters: ranks joined by a pair above the widest gap (at least
  ``cluster_gap``) in the sorted pair rates, each over the fastest pair of
  its slower end (so that a straggler's slow port does not cut it off); each
  rank's ports: its fastest rate to and from its cluster, and across.

  Raises:
    ValueError: a cluster's ranks are not consecutive along the axis (the
      mesh puts the ranks of one fabric apart: order its devices by host).
  """
  rates = np.asarray(rates, float)
  p = rates.shape[0]
  off = ~np.eye(p, dtype=bool)
  if p == 1:
    return Topology.uniform(1, 1.0)
  pair = np.fmax(rates, rates.T)  # a pair belongs together if either direction is fast
  fastest = np.max(np.where(off, pair, -np.inf), axis=1)
  # Over the slower end's fastest pair: a straggler's own slow port leaves it in its cluster.
  relative = pair / np.minimum.outer(fastest, fastest)
  values = np.sort(relative[off])
  ratios = values[1:] / values[:-1]
  cut = int(np.argmax(ratios))
  if ratios[cut] < cluster_gap:
    return Topology.from_bandwidths(_port_rate(rates, off, 1),
                                    recv_bandwidths=_port_rate(rates, off, 0))
  cluster = _components(relative > values[cut], p)
  if any(b < a for a, b in zip(cluster, cluster[1:])):
    raise ValueError(f"{_API}: the measured clusters {cluster} are not consecutive along the "
                     "axis; build the mesh with the devices of each cluster next to each other")
  same = np.equal.outer(cluster, cluster) & off
  cross = ~np.equal.outer(cluster, cluster)
  return Topology(_port_rate(rates, same, 1), _port_rate(rates, same, 0), (0.0,) * p,
                  tuple(cluster), _port_rate(rates, cross, 1), _port_rate(rates, cross, 0),
                  (0.0,) * p)


def _port_rate(rates: np.ndarray, mask: np.ndarray, axis: int) -> np.ndarray:
  """Per rank the fastest rate of ``mask``'s pairs (sends: axis 1, receives: axis 0).

  A pair runs at its slower end, so a rank's port is its fastest pair. Every
  rank has a pair in its cluster: its fastest pair is never cut off.
  """
  return np.max(np.where(mask, rates, -np.inf), axis=axis)


def _components(adjacent: np.ndarray, p: int) -> list[int]:
  """Cluster ids (numbered in rank order) of the connected components of ``adjacent``."""
  ids = [-1] * p
  count = 0
  for start in range(p):
    if ids[start] >= 0:
      continue
    stack, ids[start] = [start], count
    while stack:
      r = stack.pop()
      for q in np.flatnonzero(adjacent[r]):
        if ids[q] < 0:
          ids[q] = count
          stack.append(q)
    count += 1
  return ids


def _round(mesh: Mesh, axis_name: str, pairs, lengths: np.ndarray):
  """A round's jitted call and its input: each ``(src, dst)`` moves ``lengths[src, dst]``."""
  p = len(lengths)
  room = int(max(lengths[s, d] for s, d in pairs))
  tb = TableBuilder()
  for src, dst in pairs:
    tb.add(0, src, dst, 0, room, int(lengths[src, dst]), COPY)
  schedule: Schedule = tb.build("ppermute", p, 2 * room, _ITEM, "direct", perm=tuple(pairs))
  group_axes = tuple((a, mesh.shape[a]) for a in mesh.axis_names if a != axis_name)
  procs = np.array([d.process_index for d in mesh.devices.reshape(-1)], np.int64)

  def body(b):
    return native_executor.run_schedule(b, schedule, axis_name, group_axes, procs)

  sharding = jax.sharding.NamedSharding(mesh, P(axis_name))
  x = jnp.zeros((p * 2 * room,), jnp.float32, device=sharding)
  return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(axis_name), out_specs=P(axis_name))), x


def _my_rank(mesh: Mesh, axis_name: str) -> int:
  ranks = [i for i, d in enumerate(mesh.devices.reshape(-1)) if d.process_index ==
           jax.process_index()]
  return ranks[0]


def _check(mesh, axis_name, nbytes, seconds, cluster_gap) -> None:
  if not isinstance(mesh, Mesh) or axis_name not in mesh.axis_names:
    raise ValueError(f"{_API}: axis_name must name an axis of the mesh; got {axis_name!r} for "
                     f"{getattr(mesh, 'axis_names', mesh)!r}")
  if any(size != 1 for name, size in mesh.shape.items() if name != axis_name):
    raise ValueError(f"{_API}: the mesh's other axes must have size 1, got {dict(mesh.shape)}")
  procs = [d.process_index for d in mesh.devices.reshape(-1)]
  if len(set(procs)) != len(procs):
    raise ValueError(f"{_API}: every rank of {axis_name!r} must live in its own process (the "
                     f"network between processes is what it measures); processes {procs}")
  if not isinstance(nbytes, int) or nbytes < 4 * _ITEM or nbytes % _ITEM:
    raise ValueError(f"{_API}: nbytes must be a multiple of 4 and at least 16, got {nbytes!r}")
  if not seconds > 0 or not cluster_gap > 1:
    raise ValueError(f"{_API}: seconds must be > 0 and cluster_gap > 1, got {seconds!r} and "
                     f"{cluster_gap!r}")
