"""Benchmarks behind ``jaxcc bench``: one collective's algorithms, the sweep, calibration.

``collective.run`` measures a collective's algorithms under straggler
configurations, flat or in clusters, and returns rows with the lower bound,
the simulator's prediction and the fault-free lax twin; ``sweep.run`` times every collective at every size against
its lax twin (algbw, busbw); ``calibration.calibrate`` measures a testbed's
links; ``report`` turns each into tables, JSON and a plot; ``extras.require``
stops an entry point before any work when a package of an extra is missing.
"""

from jaxcc.bench import calibration, collective, extras, report, sweep

__all__ = ["calibration", "collective", "extras", "report", "sweep"]
