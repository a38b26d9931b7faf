"""Schedules: collectives as data (steps of transfers) and the algorithms that make them."""

from jaxcc.schedules.ir import COPY, REDUCE, Schedule, Transfer
from jaxcc.schedules.optcc import optimal_shares
from jaxcc.schedules.planner import ALGORITHMS, plan

__all__ = ["ALGORITHMS", "COPY", "REDUCE", "Schedule", "Transfer", "optimal_shares", "plan"]
