"""Schedules: collectives as data (steps of transfers), the algorithms that make them and the
limits of the pipeline depth they are cut to (``jaxcc.planner`` chooses among them)."""

from jaxcc.schedules.depth import depth_limit
from jaxcc.schedules.ir import COPY, REDUCE, Schedule, ScheduleError, Transfer
from jaxcc.schedules.optcc import optimal_shares

__all__ = ["COPY", "REDUCE", "Schedule", "ScheduleError", "Transfer", "depth_limit",
           "optimal_shares"]
