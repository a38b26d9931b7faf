"""The pipeline depth cost model: how many chunks a schedule is cut into."""

from __future__ import annotations

# Pipeline depth: at most MAX_CHUNKS chunks, pieces of at least MIN_PIECE_BYTES, at most
# MAX_MESSAGES transfers in a schedule.
MIN_PIECE_BYTES = 64 << 10
MAX_CHUNKS = 1024
MAX_MESSAGES = 1 << 20


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
