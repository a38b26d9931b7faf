"""Hierarchical (HetCCL) all_reduce, reduce_scatter and all_gather over clusters of ranks.

Research/hetccl.md §6. The buffer is cut into segments; in every cluster one
border rank (a rank with a cross-cluster port) owns each segment, and one
cluster is the segment's cross owner. Per chunk, in this order of steps:

1. intra reduce (all_reduce, reduce_scatter): in each cluster every rank sends
   each segment to the segment's owner there, which sums them;
2. cross reduce: the owners of the other clusters send their cluster's sum
   to the cross owner's owner, which adds them (reduce_scatter: then copies
   the result to the tile's rank if that rank has no cross-cluster port);
3. cross gather (all_reduce, all_gather): the cross owner's owner sends the
   result to the owner in every other cluster (all_gather: after the tile's
   rank handed it to a border rank if it has no port);
4. intra gather (all_reduce, all_gather): each owner sends its segments to
   every rank of its cluster.

Only owners cross clusters, each segment once each way, so the bytes between
clusters are the minimum: ``2(C-1) N`` in total for an all_reduce of N bytes
per rank over C clusters, ``(C-1) N`` for reduce_scatter and all_gather.

Shares. In all_reduce, cluster c is the cross owner of a fraction ``f_c`` of
every segment, chosen so that every cluster's cross-cluster ports finish
together: cluster c sends and receives ``(1 + (C-2) f_c) N``, so
``f_c = (tau sigma_c - 1) / (C - 2)`` with ``sigma_c`` its summed cross-cluster
bandwidth and ``tau`` the time that makes the shares sum to one (clusters
whose share would be negative own none). In reduce_scatter and all_gather the
cross owner is the cluster of the tile's rank; a cluster of the same size
whose ranks own equal shares takes each of its tiles whole, at the rank of
the tile's index in its cluster. Inside a cluster the owned bytes are spread
over its border ranks so that the busiest port of each (intra or
cross-cluster, send or receive) finishes at the same time.

Summation order (every sum, on every engine): an element is first summed in
each cluster at its owner ``o`` over the cluster's ranks in ascending
``(o - r) mod p``, then at the cross owner's owner ``o_g`` over the clusters'
sums in ascending ``(o_g - o_c) mod p``; each step is one ``jaxcc_reduce``
(fp32 accumulation of 16-bit floats, rounded once). The segments, their
owners and cross owners are cut from the whole buffer before the chunks, so
the result does not depend on the pipeline depth either.

Steps: per chunk, each phase takes as many steps as one rank has segments to
reduce into (or pieces to send to one peer) in it: ``2C + 2`` per chunk for
an all_reduce over clusters of equal sizes and ports.
"""

from __future__ import annotations

import numpy as np

from jaxcc.schedules.ir import COPY, REDUCE, Schedule, TableBuilder, split_weighted
from jaxcc.schedules.pieces import piece_grid
from jaxcc.topology import Topology


def hierarchical(collective: str, length: int, itemsize: int, chunks: int,
                 topology: Topology) -> Schedule:
  """The hierarchical ``collective`` ("all_reduce", "reduce_scatter", "all_gather").

  Bytes sent per rank inside its cluster: about ``2(n_c-1)/n_c N`` for an
  all_reduce (``(n_c-1)/n_c N`` for the others) with equal shares; across
  clusters, per cluster, ``(1 + (C-2) f_c) N`` for an all_reduce.
  """
  p = topology.size
  clusters = [topology.cluster_ranks(c) for c in range(topology.num_clusters)]
  cluster_of = np.asarray(topology.cluster if topology.cluster is not None else [0] * p)
  segments = _segments(collective, length, topology, clusters, cluster_of)
  tb = TableBuilder()
  step = 0
  phases = {"all_reduce": (_intra_reduce, _cross_reduce, _cross_gather, _intra_gather),
            "reduce_scatter": (_intra_reduce, _cross_reduce, _to_tile_rank),
            "all_gather": (_from_tile_rank, _cross_gather, _intra_gather)}[collective]
  for k in range(chunks):
    atoms = _atoms(segments, k, chunks)
    for phase in phases:
      step += _add_in_slots(tb, phase(atoms, clusters, p, len(clusters)), step)
  return tb.build(collective, p, length, itemsize, "hierarchical", chunks=chunks)


def cross_bandwidths(topology: Topology) -> list[float]:
  """``sigma_c``: each cluster's summed cross-cluster bandwidth, the weights of the cross
  shares (the border executor prices its outer axis on these same numbers)."""
  return [sum(topology.inter_bandwidth[r] for r in topology.cluster_ranks(c))
          for c in range(topology.num_clusters)]


def cross_cluster_bytes(collective: str, nbytes: int, num_clusters: int) -> int:
  """The bytes a hierarchical ``collective`` moves between clusters, in total."""
  factor = 2 if collective == "all_reduce" else 1
  return factor * (num_clusters - 1) * nbytes


# A segment: (start, stop, owners (one rank per cluster), cross owner cluster, the tile's rank
# or -1).
def _segments(collective, length, topology, clusters, cluster_of):
  """The segments of the whole buffer, their owners, cross owners and tile ranks.

  all_reduce cuts every range with one owner per cluster into one piece per
  cross owner cluster, in the fractions ``_cross_fractions``.
  """
  p, num = topology.size, len(clusters)
  fractions = _cross_fractions(topology, clusters)
  weights = [_owner_weights(collective, topology, clusters, c, fractions[c]) for c in range(num)]
  if collective == "all_reduce":
    units = [(0, length, -1, -1)]
  else:
    tile = length // p
    units = [(i * tile, (i + 1) * tile, int(cluster_of[i]), i) for i in range(p)]
  out = []
  for lo, hi, g, rank in units:
    partitions = []
    for c in range(num):
      if rank >= 0 and c == g and _has_port(topology, rank):
        owners, w = [rank], [1.0]
      elif rank >= 0 and _aligned(clusters, weights, c, g):
        owners, w = [clusters[c][clusters[g].index(rank)]], [1.0]
      else:
        owners, w = list(weights[c]), list(weights[c].values())
      bounds = split_weighted(hi - lo, w) + lo
      partitions.append((owners, bounds))
    cuts = np.unique(np.concatenate([b for _, b in partitions]))
    for a, b in zip(cuts[:-1], cuts[1:]):
      owners = tuple(own[int(np.searchsorted(bounds, a, side="right")) - 1]
                     for own, bounds in partitions)
      if g >= 0:
        out.append((int(a), int(b), owners, g, rank))
        continue
      pieces = split_weighted(int(b - a), fractions) + a
      out.extend((int(pieces[c]), int(pieces[c + 1]), owners, c, rank) for c in range(num)
                 if pieces[c + 1] > pieces[c])
  return out


def _aligned(clusters, weights, c, g) -> bool:
  """Whether cluster c takes each tile of cluster g whole, at the rank of the tile's index:
  clusters of one size whose ranks all own equal shares (the border executor's layout)."""
  w = list(weights[c].values())
  return (len(clusters[c]) == len(clusters[g]) == len(w)
          and all(v == w[0] for v in w))


def _atoms(segments, k, chunks):
  """Chunk ``k`` of every segment."""
  out = []
  for lo, hi, owners, g, rank in segments:
    (a, b), = piece_grid(np.array([lo, hi]), chunks)[:, k]
    if b > a:
      out.append((int(a), int(b), owners, g, rank))
  return out


def _has_port(topology: Topology, rank: int) -> bool:
  """Whether ``rank`` may own segments: it has a cross-cluster port, or nothing crosses."""
  return topology.num_clusters == 1 or topology.inter_bandwidth[rank] > 0


# Each phase returns groups (dst, start, stop, sources, op, rounds): one reduce group or one
# copy per source; ``rounds`` orders the rows of a step (no port gets two pieces at once).
def _intra_reduce(atoms, clusters, p, num):
  groups = []
  for c, ranks in enumerate(clusters):
    for lo, hi, owners, g, rank in _merged(atoms, lambda a, c=c: a[2][c]):
      o = owners[c]
      srcs = [r for r in ranks if r != o]
      groups.append((o, lo, hi, srcs, REDUCE, [(o - r) % p for r in srcs]))
  return groups


def _cross_reduce(atoms, clusters, p, num):
  groups = []
  for lo, hi, owners, g, rank in _merged(atoms, lambda a: (a[2], a[3])):
    o = owners[g]
    srcs = [owners[c] for c in range(num) if c != g]
    groups.append((o, lo, hi, srcs, REDUCE, [(g - c) % num for c in range(num) if c != g]))
  return groups


def _cross_gather(atoms, clusters, p, num):
  groups = []
  for lo, hi, owners, g, rank in _merged(atoms, lambda a: (a[2], a[3])):
    for c in range(num):
      if c != g:
        groups.append((owners[c], lo, hi, [owners[g]], COPY, [(c - g) % num]))
  return groups


def _intra_gather(atoms, clusters, p, num):
  groups = []
  for c, ranks in enumerate(clusters):
    for lo, hi, owners, g, rank in _merged(atoms, lambda a, c=c: (a[2][c], a[4])):
      o = owners[c]
      for r in ranks:
        if r != o and r != rank:  # the tile's rank holds its tile already
          groups.append((r, lo, hi, [o], COPY, [(r - o) % p]))
  return groups


def _to_tile_rank(atoms, clusters, p, num):
  """reduce_scatter: the cross owner's owner hands the result to a tile rank without a port."""
  return [(rank, lo, hi, [owners[g]], COPY, [0])
          for lo, hi, owners, g, rank in _merged(atoms, lambda a: (a[2], a[3], a[4]))
          if owners[g] != rank]


def _from_tile_rank(atoms, clusters, p, num):
  """all_gather: a tile rank without a port hands its tile to the cross owner's owner."""
  return [(owners[g], lo, hi, [rank], COPY, [0])
          for lo, hi, owners, g, rank in _merged(atoms, lambda a: (a[2], a[3], a[4]))
          if owners[g] != rank]


def _merged(atoms, key):
  """Atoms with equal ``key`` that touch, merged into one (in order of position)."""
  out = []
  for atom in sorted(atoms, key=lambda a: a[0]):
    if out and out[-1][1] == atom[0] and key(out[-1]) == key(atom):
      out[-1] = (out[-1][0], atom[1]) + out[-1][2:]
    else:
      out.append(atom)
  return out


def _add_in_slots(tb: TableBuilder, groups, step0: int) -> int:
  """Adds ``groups`` in as few steps as the IR allows; returns the number of steps used.

  A step takes one reduce group per destination and one transfer per ordered
  pair; a group goes to the first step where it fits.
  """
  slots = []  # per step: (reducing destinations, pairs, rows)
  for dst, lo, hi, srcs, op, rounds in groups:
    pairs = {(s, dst) for s in srcs}
    for slot in slots:
      if not (op == REDUCE and dst in slot[0]) and not (pairs & slot[1]):
        break
    else:
      slot = (set(), set(), [])
      slots.append(slot)
    if op == REDUCE:
      slot[0].add(dst)
    slot[1].update(pairs)
    slot[2].extend((rnd, s, dst, lo, hi, op) for s, rnd in zip(srcs, rounds))
  for j, (_, _, rows) in enumerate(slots):
    for _, s, dst, lo, hi, op in sorted(rows, key=lambda row: row[0]):
      tb.add(step0 + j, s, dst, lo, lo, hi - lo, op)
  return len(slots)


def _cross_fractions(topology: Topology, clusters) -> list[float]:
  """``f_c``: the fraction of every segment whose cross owner is cluster c (module docstring)."""
  num = len(clusters)
  if num == 1:
    return [1.0]
  sigma = np.array(cross_bandwidths(topology))
  if num == 2:
    return list(sigma / sigma.sum())
  active = np.ones(num, bool)
  while True:
    tau = (num - 2 + active.sum()) / sigma[active].sum()
    f = np.where(active, (tau * sigma - 1) / (num - 2), 0.0)
    if (f >= 0).all():
      return list(f / f.sum())
    active &= f > 0


def _owner_weights(collective, topology: Topology, clusters, c, fraction) -> dict[int, float]:
  """How much of what cluster c owns each of its border ranks takes (fractions summing to 1).

  Each port's load is linear in a rank's fraction ``a``: ``base + slope * a``
  (bytes, per unit of the buffer); the fractions are those of the smallest
  time ``T`` at which the ranks' largest fractions within ``T`` sum to one.
  """
  ranks = clusters[c]
  borders = [r for r in ranks if _has_port(topology, r)]
  if len(borders) == 1:
    return {borders[0]: 1.0}
  n, p, num = len(ranks), topology.size, len(clusters)
  clustered = topology.cluster is not None and num > 1
  f = fraction if collective == "all_reduce" else 0.0  # c's cross share (all_reduce)
  portless = n - len(borders)
  ports = []  # per border: (bandwidth, base, slope) of each port, in units of the buffer
  for r in borders:
    send, recv = topology.send_bandwidth[r], topology.recv_bandwidth[r]
    if collective == "all_reduce":
      out = inward = (1.0, n - 2.0)
      cross_out = cross_in = (0.0, 1.0 + (num - 2) * f)
    else:  # reduce_scatter; all_gather is its mirror image
      own = 1.0 / p  # its own tile
      shared = (p - n + portless) / p  # the tiles it takes a share of
      out, inward = (1.0 - own, -(p - n) / p), ((n - 1) * own, (n - 1) * shared)
      cross_out, cross_in = (0.0, (p - n) / p), ((num - 1) * own, (num - 1) * portless / p)
      if collective == "all_gather":
        out, inward, cross_out, cross_in = inward, out, cross_in, cross_out
    rank_ports = [(send, *out), (recv, *inward)]
    if clustered:
      rank_ports += [(topology.inter_send_bandwidth[r], *cross_out),
                     (topology.inter_recv_bandwidth[r], *cross_in)]
    ports.append(rank_ports)

  def caps(t):
    out = []
    for rank_ports in ports:
      cap = 1.0
      for bw, base, slope in rank_ports:
        if slope > 0:
          cap = min(cap, (t * bw - base) / slope)
        elif t * bw < base:
          cap = 0.0
      out.append(max(cap, 0.0))
    return np.array(out)

  lo, hi = 0.0, 1.0
  while caps(hi).sum() < 1:
    hi *= 2
  for _ in range(60):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if caps(mid).sum() < 1 else (lo, mid)
  w = caps(hi)
  return dict(zip(borders, (w / w.sum()).tolist()))
