"""jaxcc: collective communication for JAX that stays fast on real, imperfect networks."""

from jaxcc import codec, network, optim, schedules, sim
from jaxcc.collectives import (all_gather, all_reduce, broadcast, pbroadcast, pmax, pmean,
                               pmin, ppermute, psum, psum_scatter, recover, reduce_scatter)
from jaxcc.planner import plan
from jaxcc.probe import probe_topology
from jaxcc.schedules import Schedule
from jaxcc.topology import Topology

__version__ = "0.1.0"

__all__ = [
    "Schedule",
    "Topology",
    "all_gather",
    "all_reduce",
    "broadcast",
    "codec",
    "network",
    "optim",
    "pbroadcast",
    "plan",
    "pmax",
    "pmean",
    "pmin",
    "ppermute",
    "probe_topology",
    "psum",
    "psum_scatter",
    "recover",
    "reduce_scatter",
    "schedules",
    "sim",
]
