"""The pipeline depth cost model: how many chunks a schedule is cut into."""

from __future__ import annotations

# Pipeline depth: at most MAX_CHUNKS chunks, pieces of at least MIN_PIECE_BYTES, and at most
# MAX_RANK_TRANSFERS transfers that one rank sends or receives (its executor's rows).
MIN_PIECE_BYTES = 64 << 10
MAX_CHUNKS = 1024
MAX_RANK_TRANSFERS = 1 << 16


def choose_chunks(collective: str, nbytes: int, p: int) -> int:
  """Pipeline depth K: the largest power of two within the limits above.

  The cost model: pipeline fill and drain cost about one chunk's share of the
  busiest port, ``T_bw * c / K`` with c of order 1 (measured in the
  simulator, ``jaxcc.sim.model.FILL``), so deeper is better until pieces
  (``nbytes / (p K)`` bytes, or ``nbytes / K`` for a broadcast chain and a
  ppermute) get so small that per-message costs dominate, or a rank's part of
  the schedule (``4 (p-1)`` transfers sent or received per chunk for an
  all_reduce, ``2 (p-1)`` for reduce_scatter and all_gather, 2 for a chain
  and a ppermute) too long. The limit is per rank, as each rank's executor
  reads only its own transfers: it does not tighten as p grows beyond what
  the rank itself moves.
  """
  p = max(p, 1)
  whole = collective in ("broadcast", "ppermute")
  per_chunk = nbytes if whole else nbytes / p
  rows = 2 if whole else (4 if collective == "all_reduce" else 2) * max(p - 1, 1)
  k = 1
  while (2 * k <= MAX_CHUNKS and per_chunk / (2 * k) >= MIN_PIECE_BYTES
         and 2 * k * rows <= MAX_RANK_TRANSFERS):
    k *= 2
  return k
