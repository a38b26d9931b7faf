"""The cost model behind ``algorithm="auto"``'s choice of engine (``dispatch``).

Each native engine is compared with XLA's own collective at the size of the
call, from times measured side by side on the machines jaxcc runs on: the
byte ranges (per rank, as ``jaxcc bench sweep`` counts them: the full buffer,
all_gather's output) in which the native engine was faster. Within one
process that is the in-process path (``local_executor``) against XLA:CPU's
collective (``benchmarks/local_collectives.py``), per jax: on jax 0.10 the
path pays the program-order effect (about 0.2 ms per execution, and
synchronous dispatch), from 0.11 nothing beside the call. Across CPU
processes it is the native interpreter over TCP against gloo on equal ports
(``jaxcc bench sweep --nproc 4``). Unequal ports are the native engine's whole point: there the
planner prices its schedules (``dispatch``, ``planner.price``).
"""

from __future__ import annotations

from jaxcc._src import compat

_NEVER = (0, 0)
_ALWAYS = (0, float("inf"))

# [lo, hi) bytes per rank where the in-process path beat XLA's in-process collective (8 virtual
# CPU devices on 2 cores, benchmarks/local_collectives_<jax version>.json). Broadcast has no XLA
# collective: XLA's is an all_gather and a slice, or an all-reduce of the root's bits.
# jax >= 0.11: 0.66-0.90x XLA's time up to 4 MiB; from 16 MiB all_gather loses (1.04-1.37x),
# ppermute and all_reduce tie (0.83-1.18x in repeated runs).
LOCAL_RANGE = {
    "all_reduce": (0, 8 << 20),
    "reduce_scatter": _ALWAYS,
    "all_gather": (0, 8 << 20),
    "broadcast": _ALWAYS,
    "ppermute": (0, 8 << 20),
}
LOCAL_RANGE_WITH_EFFECT = {  # jax 0.10: the program-order effect's cost outweighs the gain
    "all_reduce": _NEVER,
    "reduce_scatter": (32 << 20, float("inf")),
    "all_gather": _NEVER,
    "broadcast": (1 << 20, float("inf")),
    "ppermute": _NEVER,
}
# [lo, hi) bytes per rank where the Tcp transport beat gloo on equal ports (4 processes on
# loopback, executor="native" against gloo): gloo's reduce_scatter and broadcast are slow at every
# size; its ring all_reduce ties or wins from 4 MiB, its all_gather from 16 MiB, its ppermute
# everywhere.
TCP_RANGE = {
    "all_reduce": (0, 2 << 20),
    "reduce_scatter": _ALWAYS,
    "all_gather": (0, 8 << 20),
    "broadcast": _ALWAYS,
    "ppermute": _NEVER,
}
# On the GPU a schedule must be priced below this fraction of XLA's NCCL ring to run natively.
NCCL_MARGIN = 0.95
# Bytes/s below which a measured network's slowest port, not the CPU, bounds a TCP collective:
# there the native engine moves what gloo moves, as fast or faster (8 testbed hosts at 200 Mbit/s,
# the char transformer's 6.5 MB of gradients: native 1.41 s a step, gloo's psum 1.67 s), and its
# own timings keep the measured network current between spot checks.
NETWORK_BOUND = 100e6


def local_beats_xla(collective: str, nbytes: int) -> bool:
  lo, hi = (LOCAL_RANGE_WITH_EFFECT if compat.EXECUTIONS_OVERLAP else LOCAL_RANGE)[collective]
  return lo <= nbytes < hi


def tcp_beats_xla(collective: str, nbytes: int) -> bool:
  lo, hi = TCP_RANGE[collective]
  return lo <= nbytes < hi


def network_bound(slowest_port: float) -> bool:
  return slowest_port < NETWORK_BOUND
