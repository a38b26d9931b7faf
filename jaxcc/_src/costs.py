"""The cost model behind ``algorithm="auto"``'s choice of engine (``dispatch``).

Each native engine is compared with XLA's own collective at the size of the
call, from constants measured side by side on the machines jaxcc runs on
(``jaxcc bench sweep``): within one process the crossover size above which
the native in-process path (``local_executor``) is faster than XLA:CPU's
collective; across CPU processes the size above which the native
interpreter over TCP is faster than gloo on equal ports (unequal ports are
the native engine's whole point: its schedules are priced by the simulator).
"""

from __future__ import annotations

# Bytes per rank at and above which the native in-process path beats XLA's in-process collective
# (benchmarks/local_collectives.py, 8 virtual CPU devices on 2 cores: its call plus the
# program-order token it needs, about 0.2 ms per execution, against XLA's collective; inf where it
# never won by more than the noise). Broadcast has no XLA collective: an all_gather and a slice.
LOCAL_MIN_BYTES = {
    "all_reduce": float("inf"),
    "reduce_scatter": 16 << 20,
    "all_gather": float("inf"),
    "broadcast": 64 << 10,
    "ppermute": float("inf"),
}
# Bytes per rank at and above which the Tcp transport beats gloo on equal ports.
TCP_MIN_BYTES = {
    "all_reduce": 0,
    "reduce_scatter": 0,
    "all_gather": 0,
    "broadcast": 0,
    "ppermute": 0,
}
# On the GPU a schedule must be priced below this fraction of XLA's NCCL ring to run natively.
NCCL_MARGIN = 0.95


def local_beats_xla(collective: str, nbytes: int) -> bool:
  return nbytes >= LOCAL_MIN_BYTES[collective]


def tcp_beats_xla(collective: str, nbytes: int) -> bool:
  return nbytes >= TCP_MIN_BYTES[collective]
