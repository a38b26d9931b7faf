"""The pipeline depth cost model: how many chunks a schedule is cut into."""

from __future__ import annotations

# Pipeline depth: at most MAX_CHUNKS chunks, pieces of at least MIN_PIECE_BYTES, at most
# MAX_RANK_TRANSFERS transfers that one rank sends or receives (its executor's rows), and at
# most MAX_TABLE_TRANSFERS in the whole table (the planner builds it in every process: 2^25
# rows are 1.9 GiB).
MIN_PIECE_BYTES = 64 << 10
MAX_CHUNKS = 1024
MAX_RANK_TRANSFERS = 1 << 16
MAX_TABLE_TRANSFERS = 1 << 25


def choose_chunks(collective: str, nbytes: int, p: int, *,
                  transfers: tuple[int, int] | None = None,
                  min_piece_bytes: int = MIN_PIECE_BYTES) -> int:
  """Pipeline depth K: the largest power of two within the limits above.

  The cost model: pipeline fill and drain cost about one chunk's share of the
  busiest port, ``T_bw * c / K`` with c of order 1 (measured in the
  simulator, ``jaxcc.sim.model.FILL``), so deeper is better until pieces
  (``nbytes / (p K)`` bytes, or ``nbytes / K`` for a broadcast chain and a
  ppermute) get so small that per-message costs dominate, or a rank's part of
  the schedule too long. The limit is per rank, as each rank's executor
  reads only its own transfers: it does not tighten as p grows beyond what
  the rank itself moves.

  Args:
    collective, nbytes, p: the collective, the bytes of each rank's buffer and the ranks.
    transfers: per chunk, the transfers the busiest rank sends or receives and those of
      the whole table; by default the direct and ring forms': ``4 (p-1)`` and
      ``2 p (p-1)`` for an all_reduce, ``2 (p-1)`` and ``p (p-1)`` for reduce_scatter
      and all_gather, 2 and ``p`` for a chain and a ppermute (OptCC's grid form has
      its own, ``optcc.transfers_per_chunk``).
    min_piece_bytes: the smallest piece, for the per-message costs of real transports;
      0 in the fluid model, where only the transfer limits bound the depth.
  """
  p = max(p, 1)
  whole = collective in ("broadcast", "ppermute")
  per_chunk = nbytes if whole else nbytes / p
  if transfers is None:
    rank = 2 if whole else (4 if collective == "all_reduce" else 2) * max(p - 1, 1)
    transfers = (rank, p * rank // 2)
  rank, table = transfers
  k = 1
  while (2 * k <= MAX_CHUNKS and per_chunk / (2 * k) >= max(min_piece_bytes, 1)
         and 2 * k * rank <= MAX_RANK_TRANSFERS and 2 * k * table <= MAX_TABLE_TRANSFERS):
    k *= 2
  return k
