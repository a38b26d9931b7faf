"""What every collective checks at trace time, and how it finds its schedule."""

from __future__ import annotations

import jax
import numpy as np

from jaxcc._src import compat, native_executor, xla_executor
from jaxcc._src.reduce import SUPPORTED_DTYPES
from jaxcc.schedules.ir import Schedule
from jaxcc.schedules.planner import check_algorithm, schedule_for
from jaxcc.topology import Topology

EXECUTORS = ("auto", "native", "xla")
# The network assumed when no topology is given: uniform 25 GB/s ports (a 200 Gb/s NIC).
DEFAULT_BANDWIDTH = 25e9


def check_axis(api: str, axis_name, executor: str, codec) -> int:
  """Validate the arguments every collective takes; return the axis size."""
  size = compat.axis_size(axis_name, api)
  if codec is not None:
    raise ValueError(f"{api}: codec={codec!r} is not available yet; use codec=None")
  if executor not in EXECUTORS:
    raise ValueError(f"{api}: executor must be one of {EXECUTORS}, got {executor!r}")
  if executor == "native" and (jax.process_count() > 1 or compat.group_axes(axis_name) is None):
    raise NotImplementedError(
        f"{api}: executor='native' runs on the devices of one process over a mesh whose axes are "
        f"all manual (the multi-process TCP transport is not built yet); use executor='auto' or "
        f"'xla'")
  return size


def native_params(axis_name) -> dict:
  """The primitive params that place a device for the native executor."""
  return {"group_axes": compat.group_axes(axis_name)}


def execute(buf: jax.Array, sched: Schedule, params: dict, native: bool) -> jax.Array:
  """Run ``sched`` on the flat ``buf`` with the executor the params and the platform call for.

  ``native`` is True when lowering for the CPU: the native executor runs there
  unless ``executor="xla"``, the process is one of several, or some mesh axis
  is not manual (then ``group_axes`` is None).
  """
  if (native and params["executor"] != "xla" and params["group_axes"] is not None
      and jax.process_count() == 1):
    return native_executor.run_schedule(buf, sched, params["axis_name"], params["group_axes"])
  if params["executor"] == "native":
    raise NotImplementedError("executor='native' has no transport on this platform yet (CPU "
                              "only); use executor='auto' or 'xla'")
  return xla_executor.run_schedule(buf, sched, params["axis_name"])


def resolve(api: str, collective: str, axis_name, algorithm: str, executor: str,
            topology: Topology | None, codec) -> tuple[int, Topology]:
  """Validate the arguments; return the axis size and the topology to plan on."""
  size = check_axis(api, axis_name, executor, codec)
  if not isinstance(algorithm, str):
    raise TypeError(f"{api}: algorithm must be a str, got {algorithm!r}")
  if algorithm != "lax":
    check_algorithm(collective, algorithm)
  if topology is None:
    topology = Topology.uniform(size, DEFAULT_BANDWIDTH)
  elif not isinstance(topology, Topology):
    raise TypeError(f"{api}: topology must be a jaxcc.Topology or None, got "
                    f"{type(topology).__name__}")
  elif topology.size != size:
    raise ValueError(f"{api}: topology has {topology.size} ranks but axis {axis_name!r} has "
                     f"{size}; build the topology for {size} ranks")
  return size, topology


def check_reducible(api: str, dtype) -> None:
  if np.dtype(dtype) not in SUPPORTED_DTYPES:
    raise TypeError(f"{api}: cannot sum dtype {np.dtype(dtype).name}; supported: "
                    f"{', '.join(d.name for d in SUPPORTED_DTYPES)}")


def check_dimension(api: str, name: str, dim, ndim: int) -> int:
  """``dim`` normalised to [0, ndim), or a ValueError naming the argument."""
  if isinstance(dim, bool) or not isinstance(dim, int) or not -ndim <= dim < ndim:
    raise ValueError(f"{api}: {name}={dim!r} is out of range for an array of rank {ndim}")
  return dim % ndim


def schedule(collective: str, x_size: int, dtype, params: dict, root: int = 0) -> Schedule:
  """The schedule the executors run for ``x_size`` elements: the planned algorithm in one chunk.

  The XLA executor runs steps one after another and the InProcess transport
  reads peers' memory directly, so pipelining buys nothing there; chunks only
  split pieces, so the sums (and their order) are those of any pipeline depth.
  """
  itemsize = np.dtype(dtype).itemsize
  planned = schedule_for(collective, x_size, itemsize, params["topology"], params["algorithm"],
                         root)
  return schedule_for(collective, x_size, itemsize, params["topology"], planned.algorithm, root,
                      chunks=1)
