"""The pipeline depth: how many chunks a schedule is cut into, and its limits.

A deeper pipeline fills and drains sooner but sends more messages: with ``K``
chunks a schedule whose busiest port moves its bytes in ``T`` seconds and
``m`` messages per chunk takes about ``T (1 + c / K) + K m o`` (``c`` its
fill, ``o`` the port's message cost: ``jaxcc.sim.model``), least at
``K = sqrt(c T / (m o))``. ``planner.depth`` takes the power of two of the
least modelled time within ``depth_limit``; without message costs (the fluid
model) that is the limit itself.

What that says of real transports, at the per-message costs measured by
``benchmarks/message_cost.py`` (jaxcc's TCP transport: 28-36 us a message
between 2 processes on loopback, ``topology.MESSAGE_COST`` = 30 us; the
in-process engine: 41-54 us per step on 8 virtual devices, where it runs one
chunk): with one rank at half speed, OptCC on 8 ranks of 25 GB/s at 256 MiB
per rank goes 8 deep (pieces of 4 MiB; a direct all_reduce 2 deep), on 64
such ranks 2 deep; on the testbed's 200 Mbit/s links at 8 MiB per rank 32
deep (pieces of 32 KiB). A fixed floor of 64 KiB pieces took 512, 64 and 16.
"""

from __future__ import annotations

# At most MAX_CHUNKS chunks and MAX_RANK_TRANSFERS transfers that one rank sends or receives
# (its executor's rows), with pieces of at least one element.
MAX_CHUNKS = 1024
MAX_RANK_TRANSFERS = 1 << 16


def depth_limit(collective: str, length: int, p: int, rank_transfers: int | None = None) -> int:
  """The largest power of two ``K`` within the limits above.

  Args:
    collective, length, p: the collective, the elements of each rank's buffer and the ranks;
      pieces hold ``length / (p K)`` elements, or ``length / K`` for a broadcast chain and a
      ppermute.
    rank_transfers: per chunk, the transfers the busiest rank sends or receives; by default
      the direct and ring forms': ``4 (p-1)`` for an all_reduce, ``2 (p-1)`` for
      reduce_scatter and all_gather, 2 for a chain and a ppermute.
  """
  p = max(p, 1)
  whole = collective in ("broadcast", "ppermute")
  per_chunk = length if whole else length // p
  if rank_transfers is None:
    rank_transfers = 2 if whole else (4 if collective == "all_reduce" else 2) * max(p - 1, 1)
  k = 1
  while (2 * k <= MAX_CHUNKS and per_chunk >= 2 * k
         and 2 * k * rank_transfers <= MAX_RANK_TRANSFERS):
    k *= 2
  return k
