"""Hand-built schedules shared by the sim tests (independent of jaxcc.schedules' algorithms)."""

from jaxcc.schedules.ir import COPY, REDUCE, Schedule, TableBuilder


def ring_all_reduce(p: int, chunks: int = 1, piece: int = 1, itemsize: int = 1) -> Schedule:
  """Textbook ring all_reduce: per chunk, p - 1 reduce steps then p - 1 copy steps.

  Chunk c covers ``[c p piece, (c + 1) p piece)``; at step j rank i sends piece
  ``i - j`` of it to rank i + 1. Steps are numbered chunk-major, so the port
  priority is (chunk, step), as in optcc.md §9.
  """
  tb = TableBuilder()
  for c in range(chunks):
    for j in range(2 * (p - 1)):
      for i in range(p):
        lo = (c * p + (i - j) % p) * piece
        tb.add(c * 2 * (p - 1) + j, i, (i + 1) % p, lo, lo, piece,
               REDUCE if j < p - 1 else COPY)
  return tb.build("all_reduce", p, chunks * p * piece, itemsize, "ring", chunks=chunks)


def direct(collective: str, p: int, shard: int = 1, itemsize: int = 1) -> Schedule:
  """Direct reduce_scatter / all_gather / all_reduce: every rank to every shard owner."""
  tb = TableBuilder()
  for owner in range(p):
    for k in range(1, p):
      if collective != "all_gather":
        tb.add(0, (owner + k) % p, owner, owner * shard, owner * shard, shard, REDUCE)
      if collective != "reduce_scatter":
        tb.add(1, owner, (owner + k) % p, owner * shard, owner * shard, shard, COPY)
  return tb.build(collective, p, p * shard, itemsize, "direct")


def chain_broadcast(p: int, length: int, root: int = 0, chunks: int = 1) -> Schedule:
  """Pipelined chain root -> root + 1 -> ...: chunk c crosses hop h at step c + h."""
  tb = TableBuilder()
  bounds = [c * length // chunks for c in range(chunks + 1)]
  for c in range(chunks):
    for h in range(p - 1):
      tb.add(c + h, (root + h) % p, (root + h + 1) % p, bounds[c], bounds[c],
             bounds[c + 1] - bounds[c], COPY)
  return tb.build("broadcast", p, length, 1, "chain", root=root, chunks=chunks)


def four_stage(p: int, chunks: int, piece: int = 1, itemsize: int = 1) -> Schedule:
  """optcc.md §6 with w_s = 0: straggler ``s = p - 1`` owns nothing, healthy k owns shard k.

  Per chunk c, step 2c: S1 (s -> k) and S2 (direct reduce-scatter among the
  healthy ranks) reduce into k's shard, one reduce group; step 2c + 1: S3
  (all-gather among the healthy) and S4 (k -> s). Rows are in stage order and
  ascending ranks, so the port priority is (chunk, stage, rank).
  """
  s, m = p - 1, p - 1
  tb = TableBuilder()
  for c in range(chunks):
    lo = [(c * m + k) * piece for k in range(m)]
    for k in range(m):
      tb.add(2 * c, s, k, lo[k], lo[k], piece, REDUCE)
    for j in range(m):
      for k in range(m):
        if j != k:
          tb.add(2 * c, j, k, lo[k], lo[k], piece, REDUCE)
    for k in range(m):
      for j in range(m):
        if j != k:
          tb.add(2 * c + 1, k, j, lo[k], lo[k], piece, COPY)
    for k in range(m):
      tb.add(2 * c + 1, k, s, lo[k], lo[k], piece, COPY)
  return tb.build("all_reduce", p, chunks * m * piece, itemsize, "four_stage", chunks=chunks)


def build(collective: str, p: int, length: int, rows, root: int = 0,
          itemsize: int = 1, perm=()) -> Schedule:
  """A schedule from rows ``(step, src, dst, src_start, dst_start, length, op)``."""
  tb = TableBuilder()
  for row in rows:
    tb.add(*row)
  return tb.build(collective, p, length, itemsize, "hand", root=root, perm=perm)
