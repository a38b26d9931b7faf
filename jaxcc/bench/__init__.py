"""Benchmarks behind ``jaxcc bench``: all_reduce, the collective sweep, calibration.

``allreduce.run`` measures algorithms under straggler configurations and
returns rows with the lower bound, the simulator's prediction and the
fault-free psum; ``sweep.run`` times every collective at every size against
its lax twin (algbw, busbw); ``calibration.calibrate`` measures a testbed's
links; ``report`` turns each into tables, JSON and a plot.
"""

from jaxcc.bench import allreduce, calibration, report, sweep

__all__ = ["allreduce", "calibration", "report", "sweep"]
