"""Schedules without devices: symbolic proof, event-driven timing, lower bounds."""

from jaxcc.schedules.ir import ScheduleError
from jaxcc.sim.bounds import lower_bound
from jaxcc.sim.check import check
from jaxcc.sim.simulate import SimResult, simulate

__all__ = ["check", "simulate", "lower_bound", "SimResult", "ScheduleError"]
