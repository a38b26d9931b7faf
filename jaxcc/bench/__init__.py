"""Benchmarks behind ``jaxcc bench``: all_reduce on virtual devices or the testbed, calibration.

``allreduce.run`` measures algorithms under straggler configurations and
returns rows with the lower bound, the simulator's prediction and the
fault-free psum; ``calibration.calibrate`` measures a testbed's links;
``report`` turns either into tables, JSON and a plot.
"""

from jaxcc.bench import allreduce, calibration, report

__all__ = ["allreduce", "calibration", "report"]
