"""The measured network: what jaxcc's TCP transport timed, a native probe, and a training loop's
current topology.

* ``MeasuredNetwork(mesh, axis)``: the axis' Topology, probed at start and kept
  current from the transport's own timings; ``net.jit(step)`` plans every
  collective with ``topology=None`` on it (``measured``).
* ``probe()``: every pair of processes timed on the transport in seconds, no
  JAX program (``native_probe``); ``jaxcc.probe_topology`` runs on it.
* ``FrameLog``, ``received_rates``, ``rate_matrix``, ``PortChange``: the
  passive records, the estimator and the change rule (``host``, ``estimate``).
"""

from jaxcc.network.estimate import PortChange, Received, rate_matrix, received_rates
from jaxcc.network.host import RECORD, FrameLog, allgather
from jaxcc.network.measured import Event, MeasuredNetwork, snap
from jaxcc.network.native_probe import Measurement, probe, spot_check

__all__ = [
    "RECORD",
    "Event",
    "FrameLog",
    "Measurement",
    "MeasuredNetwork",
    "PortChange",
    "Received",
    "allgather",
    "probe",
    "rate_matrix",
    "received_rates",
    "snap",
    "spot_check",
]
