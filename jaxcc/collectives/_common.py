"""What every collective checks at trace time, and how it finds its schedule."""

from __future__ import annotations

import jax
import numpy as np

from jaxcc import codec as codec_lib
from jaxcc import planner
from jaxcc._src import compat, native_executor, nccl_bootstrap, xla_executor
from jaxcc._src.reduce import SUPPORTED_DTYPES
from jaxcc.schedules.ir import Schedule
from jaxcc.topology import Topology

EXECUTORS = ("auto", "native", "xla")
CODECS = (None, "fixed", "entropy")
# The network assumed when no topology is given: uniform 25 GB/s ports (a 200 Gb/s NIC).
DEFAULT_BANDWIDTH = 25e9


def check_axis(api: str, axis_name, executor: str, codec) -> int:
  """Validate the arguments every collective takes; return the axis size."""
  size = compat.axis_size(axis_name, api)
  if not (codec is None or isinstance(codec, str) and codec in CODECS):
    raise ValueError(f"{api}: codec must be one of {CODECS}, got codec={codec!r}")
  if executor not in EXECUTORS:
    raise ValueError(f"{api}: executor must be one of {EXECUTORS}, got {executor!r}")
  if executor == "native" and compat.group_axes(axis_name) is None:
    raise NotImplementedError(
        f"{api}: executor='native' runs over a mesh whose axes are all manual (shard_map over "
        f"every mesh axis); use executor='auto' or 'xla'")
  return size


def native_params(axis_name) -> dict:
  """The primitive params that place a device for the native executor."""
  return {"group_axes": compat.group_axes(axis_name)}


def execute(buf: jax.Array, sched: Schedule, params: dict, native: bool | str) -> jax.Array:
  """Run ``sched`` on the flat ``buf`` with the executor the params and the platform call for:
  the native one where ``run_native`` runs it, else the XLA executor."""
  out = run_native(buf, sched, params, native)
  if out is None:
    out = xla_executor.run_schedule(buf, sched, params["axis_name"], codec=params.get("codec"))
  return out


def run_native(buf: jax.Array, sched: Schedule, params: dict,
               native: bool | str) -> jax.Array | None:
  """Run ``sched`` on the flat ``buf`` with the native executor, or return None where it does not
  run (then the caller runs its XLA twin; with ``executor="native"`` that is an error).

  ``native`` is True when lowering for the CPU: the native executor runs there
  (over TCP when the axis spans processes) unless ``executor="xla"``, some
  mesh axis is not manual (then ``group_axes`` is None), or the axis spans
  processes of a mesh whose devices are unknown. It is "cuda" when lowering
  for a CUDA GPU: see ``_run_cuda``.
  """
  if native == "cuda":
    return _run_cuda(buf, sched, params)
  if native and params["executor"] != "xla" and params["group_axes"] is not None:
    procs = native_executor.process_map(params["axis_name"], params["group_axes"])
    if procs is not None:
      if len(procs):  # over TCP: the pipelined schedule, whose steps the runner overlaps
        length = sched.length // 2 if sched.collective == "ppermute" else sched.length
        sched = planner.schedule(sched.collective, length, sched.itemsize, params["topology"],
                                 sched.algorithm, root=sched.root,
                                 perm=sched.perm if sched.collective == "ppermute" else None,
                                 api=f"jaxcc.{sched.collective}")
      return native_executor.run_schedule(buf, sched, params["axis_name"], params["group_axes"],
                                          procs, params["topology"], params.get("codec"))
  if params["executor"] == "native":
    raise NotImplementedError("executor='native' runs on the CPU, across processes only in a "
                              "shard_map over a mesh of devices (jax.make_mesh); use "
                              "executor='auto' or 'xla'")
  return None


def _run_cuda(buf: jax.Array, sched: Schedule, params: dict) -> jax.Array | None:
  """On the GPU the native executor runs over the Nccl transport when jaxcc's CUDA module has it
  and libnccl.so.2 loads; else "auto" falls back to the XLA executor and "native" is an error."""
  if params["executor"] == "xla":
    return None
  if params["group_axes"] is None:
    reason = "some mesh axis is not manual"
  else:
    reason = nccl_bootstrap.unavailable()
  if reason is None:
    out = native_executor.run_schedule_cuda(buf, sched, params["axis_name"],
                                            params["group_axes"])
    if out is not None:
      return out
    reason = "the devices of the shard_map's mesh are unknown (abstract mesh)"
  if params["executor"] == "native":
    raise NotImplementedError(f"executor='native' on the GPU needs the Nccl transport: {reason}; "
                              f"use executor='auto' or 'xla'")
  return None


def resolve(api: str, collective: str, axis_name, algorithm: str, executor: str,
            topology: Topology | None, codec) -> tuple[int, Topology]:
  """Validate the arguments; return the axis size and the topology to plan on."""
  size = check_axis(api, axis_name, executor, codec)
  if not isinstance(algorithm, str):
    raise TypeError(f"{api}: algorithm must be a str, got {algorithm!r}")
  if algorithm != "lax":
    planner.check_algorithm(collective, algorithm, api)
  elif codec is not None:
    raise ValueError(f"{api}: algorithm='lax' is XLA's own collective, which cannot move "
                     f"encoded bytes; use codec=None with it, or another algorithm with "
                     f"codec={codec!r}")
  if topology is None:
    topology = Topology.uniform(size, DEFAULT_BANDWIDTH)
  elif not isinstance(topology, Topology):
    raise TypeError(f"{api}: topology must be a jaxcc.Topology or None, got "
                    f"{type(topology).__name__}")
  elif topology.size != size:
    raise ValueError(f"{api}: topology has {topology.size} ranks but axis {axis_name!r} has "
                     f"{size}; build the topology for {size} ranks")
  return size, topology


def check_codec(api: str, codec, dtype) -> None:
  """A codec compresses bf16, f16 and f32 only: a TypeError naming the fix for other dtypes."""
  if codec is not None and np.dtype(dtype) not in codec_lib.SUPPORTED_DTYPES:
    raise TypeError(f"{api}: codec={codec!r} cannot take {np.dtype(dtype).name}; codecs take "
                    f"{', '.join(d.name for d in codec_lib.SUPPORTED_DTYPES)}; use codec=None")


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
  reads peers' memory directly, so pipelining buys nothing there; ``execute``
  swaps in the pipelined schedule for the Tcp transport. Chunks only split
  pieces, so the sums (and their order) are those of any pipeline depth.
  """
  itemsize = np.dtype(dtype).itemsize
  algorithm = params["algorithm"]
  api = f"jaxcc.{collective}"
  if algorithm == "auto":  # chosen on the pipelined schedules the simulator prices
    algorithm = planner.auto_algorithm(collective, x_size, itemsize, params["topology"],
                                       root=root, api=api)
  return planner.schedule(collective, x_size, itemsize, params["topology"], algorithm, root=root,
                          chunks=1, api=api)
