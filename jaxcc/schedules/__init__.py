"""Schedules: collectives as data (steps of transfers), the algorithms that make them and the
pipeline depth they are cut to (``jaxcc.planner`` chooses among them)."""

from jaxcc.schedules.depth import choose_chunks
from jaxcc.schedules.ir import COPY, REDUCE, Schedule, ScheduleError, Transfer
from jaxcc.schedules.optcc import optimal_shares

__all__ = ["COPY", "REDUCE", "Schedule", "ScheduleError", "Transfer", "choose_chunks",
           "optimal_shares"]
