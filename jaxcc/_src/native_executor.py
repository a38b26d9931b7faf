"""The native executor: one ``jaxcc_collective`` FFI call runs a whole Schedule.

The call gets the rows of the serialised schedule that the ranks of this
process send or receive (``serialized_for``: of a ``RankSchedule``, the part
``planner.rank_schedule`` plans for them without the whole table, or of a
whole ``Schedule``), this rank's position along the axis,
which instance of the axis it is in (a multi-axis mesh has one per
coordinate of the other axes) and an op id naming the call site; the C++
interpreter walks the steps over a transport and sums with the
``jaxcc_reduce`` kernel in the canonical order, so its results equal the XLA
executor's bit for bit. The buffer is updated in place (the result aliases
the operand).

Transports: InProcess when every rank of the group lives in this process
(the devices read each other's buffers directly; steps run one after
another), Tcp when they span the processes of a jax.distributed job
(``process_map`` tells the handler which process holds each rank;
``tcp_bootstrap`` connects the processes; steps overlap as the data allows, so
a chunked schedule runs as a pipeline, and pieces may travel encoded). On the
GPU, Nccl (``run_schedule_cuda``): one NCCL communicator per axis instance
and device, made by ``nccl_bootstrap`` at lowering; pieces may travel
encoded there too. Op ids
count call sites in lowering order, so every process must lower the same
programs in the same order (any SPMD program does).

Program order (``compat.chained_ffi_lowering``): the call takes the token of
the previous native call lowered into its block and returns its own, so every
device runs a block's native calls in program order, with no jax effect: the
program keeps jax's asynchronous dispatch, and a failed call fails its
program only. On jax 0.10, whose CPU client runs executions of a program at
once (``compat.EXECUTIONS_OVERLAP``), the token is that of jaxcc's ordered
effect (``compat.PROGRAM_ORDER``), which also orders executions; a failed
call fails the later jaxcc programs of the process with the same error (the
runtime token carries it) until ``jaxcc.recover``.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxcc._src import compat, config, ffi, nccl_bootstrap, tcp_bootstrap
from jaxcc._src.bits import as_bits, word_of
from jaxcc.codec import reference
from jaxcc.schedules.ir import DST, LENGTH, SRC, RankSchedule, Schedule, traffic
from jaxcc.topology import Topology

_op_ids = itertools.count(1)
# The codec ids of xla_ffi/include/jaxcc/codec.h; 0: raw pieces.
CODEC_IDS = {None: 0, **reference.CODEC_IDS}
# XLA_FFI_DataType (xla/ffi/api/c_api.h) of the element types a codec takes.
FFI_FLOAT_TYPES = {np.dtype(jnp.float16): 10, np.dtype(np.float32): 11,
                   np.dtype(jnp.bfloat16): 16}
_NONE = np.zeros((0,), np.int64)  # no process map / no pacing
_NONE.setflags(write=False)


def bits_type_id(dtype) -> int:
  """The handler's ``dtype`` attribute for ``dtype``: the FFI type of a float that travels as
  its bits (``bits.as_bits``), 0 for one that travels as itself."""
  dtype = np.dtype(dtype)
  return FFI_FLOAT_TYPES[dtype] if word_of(dtype) != dtype else 0


def next_op_id() -> int:
  """A new op id: call sites of native calls are numbered in lowering order, from 1."""
  return next(_op_ids)


def run_schedule(buf: jax.Array, schedule: Schedule | RankSchedule, axis_name: str,
                 group_axes: tuple[tuple[str, int], ...], procs: np.ndarray = _NONE,
                 topology: Topology | None = None, codec: str | None = None) -> jax.Array:
  """Run ``schedule`` on this rank's flat ``buf`` in one FFI call (inside shard_map).

  Args:
    buf: this rank's flat buffer of ``schedule.length`` elements.
    schedule: the schedule, every rank the same one: whole, or its part for (at least) the
      ranks of this process. Processes recognise it by its ``digest``: a RankSchedule's, from
      the planning arguments, is the same in every process that planned it.
    axis_name: the axis whose ranks the schedule spans.
    group_axes: the other mesh axes as (name, size), in mesh order.
    procs: ``process_map``'s answer; empty when one process holds every rank.
    topology: the network the schedule was planned on; sets the pacing of the
      TCP connections (``pacing_rates``).
    codec: None, "fixed" or "entropy": the encoding of every piece on the TCP
      connections (each moves at its encoded size); ranks of one process
      exchange raw memory.
  """
  _check_buffer(buf, schedule)
  if not schedule.num_steps:
    return buf
  if len(procs):
    tcp_bootstrap.ensure_started()
  pacing = pacing_rates(schedule, topology) if len(procs) and topology is not None else _NONE
  # 16-bit floats go in and out as their bits (jaxcc._src.bits); the handler's `dtype` names them.
  bits = as_bits(buf)
  dtype_id = bits_type_id(buf.dtype)
  out = _collective_call(bits, schedule, axis_name, group_axes,
                         _local_ranks(procs, schedule.nranks),
                         procs=np.ascontiguousarray(procs, np.int64), pacing=pacing,
                         codec=np.int64(CODEC_IDS[codec]), dtype=np.int64(dtype_id),
                         split_send_bytes=np.int64(config.split_send_bytes()))
  return lax.bitcast_convert_type(out, buf.dtype) if dtype_id else out


def run_schedule_cuda(buf: jax.Array, schedule: Schedule | RankSchedule, axis_name: str,
                      group_axes: tuple[tuple[str, int], ...],
                      codec: str | None = None) -> jax.Array | None:
  """``run_schedule`` on the GPU over the Nccl transport (inside shard_map, lowering for CUDA).

  Creates the axis' communicators first (``nccl_bootstrap.ensure_comms``).
  With ``codec`` every piece is encoded on the device and travels at its
  encoded size (xla_ffi/include/jaxcc/piece_layout.h: per step the segment
  sizes go first, then the bytes; a reduce decodes, sums and re-encodes in
  one fused hop). Returns None when the lowering mesh's devices are unknown
  (abstract mesh): then no communicator can be made.
  """
  _check_buffer(buf, schedule)
  if not schedule.num_steps:
    return buf
  mesh = compat.lowering_mesh()
  if mesh is None:
    return None
  key = nccl_bootstrap.ensure_comms(mesh, axis_name, group_axes)
  ranks = held_ranks(schedule.nranks, None, axis_name, group_axes)
  return _collective_call(buf, schedule, axis_name, group_axes, ranks, procs=_NONE,
                          pacing=_NONE, comm_key=np.int64(key), codec=np.int64(CODEC_IDS[codec]))


def _check_buffer(buf: jax.Array, schedule: Schedule) -> None:
  if buf.ndim != 1 or buf.shape[0] != schedule.length:
    raise ValueError(f"run_schedule: buffer of shape {buf.shape} for a schedule of "
                     f"{schedule.length} elements")


def held_ranks(nranks: int, procs: np.ndarray | None, axis_name,
               group_axes: tuple[tuple[str, int], ...]) -> np.ndarray:
  """The ranks of an axis of ``nranks`` that this process holds in some group: by ``procs``
  (``process_map``'s answer), None: by the lowering mesh (every rank where it is unknown).
  What ``planner.rank_schedule`` plans for the native engines."""
  if procs is None:
    procs = process_map(axis_name, group_axes)
  return _local_ranks(_NONE if procs is None else procs, nranks)


def _local_ranks(procs: np.ndarray, nranks: int) -> np.ndarray:
  """The ranks of an axis of ``nranks`` that this process holds in some group (every rank
  when ``procs``, ``process_map``'s answer, is empty)."""
  if not len(procs):
    return np.arange(nranks)
  procs = np.asarray(procs).reshape(-1, nranks)
  return np.flatnonzero((procs == jax.process_index()).any(axis=0))


def _collective_call(buf, schedule, axis_name, group_axes, ranks, **attrs):
  """One ``jaxcc_collective`` call: this rank, its group, the rows of the schedule that
  ``ranks`` (the ranks of this process) send or receive, and ``attrs``."""
  ffi.load()
  rank = lax.axis_index(axis_name).astype(jnp.int32)
  group = jnp.int32(0)
  for name, size in group_axes:
    group = group * size + lax.axis_index(name).astype(jnp.int32)
  attrs = {k: ArrayAttr(v) if isinstance(v, np.ndarray) and v.ndim else v
           for k, v in attrs.items()}
  return collective_p.bind(
      buf, rank, group, table=ArrayAttr(schedule.serialized_for(ranks)),
      num_steps=np.int64(schedule.num_steps), nranks=np.int64(schedule.nranks),
      op_id=np.int64(next_op_id()), digest=np.int64(int(schedule.digest[:15], 16)),
      name=schedule.collective, timeout_ms=np.int64(config.timeout_ms()), **attrs)


class ArrayAttr:
  """An array attribute of the FFI call; hashable (by identity), as primitive params must be."""

  __slots__ = ("array",)

  def __init__(self, array: np.ndarray):
    self.array = array


# The FFI call as a primitive; its lowering orders it after the previous native call (the
# token is the handler's first operand and result).
collective_p = compat.Primitive("jaxcc_collective")
collective_p.def_effectful_abstract_eval(
    lambda buf, rank, group, **_: (buf, compat.NATIVE_CALL_EFFECTS))
_lower_ffi = compat.chained_ffi_lowering("jaxcc_collective", operand_output_aliases={1: 1},
                                         has_side_effect=True)


def _lower_collective(ctx, *args, **attrs):
  return _lower_ffi(ctx, *args, **{k: v.array if isinstance(v, ArrayAttr) else v
                                   for k, v in attrs.items()})


for _platform in ("cpu", "cuda"):
  compat.mlir.register_lowering(collective_p, _lower_collective, platform=_platform,
                                cacheable=False)


def process_map(axis_name, group_axes: tuple[tuple[str, int], ...]) -> np.ndarray | None:
  """The process of every rank of every instance of ``axis_name``, for the lowering mesh.

  Returns:
    int64, flat ``(groups, p)`` in ``run_schedule``'s group order; empty when
    this process holds the whole mesh; None when the mesh's devices are
    unknown (abstract mesh).
  """
  if jax.process_count() == 1:
    return _NONE
  mesh = compat.lowering_mesh()
  if mesh is None:
    return None
  names = list(mesh.axis_names)
  axes = axis_name if isinstance(axis_name, tuple) else (axis_name,)
  order = [names.index(name) for name, _ in group_axes] + [names.index(a) for a in axes]
  procs = np.vectorize(lambda d: d.process_index, otypes=[np.int64])(mesh.devices)
  if np.all(procs == jax.process_index()):
    return _NONE
  return np.ascontiguousarray(procs.transpose(order).reshape(-1))


def pacing_rates(schedule: Schedule | RankSchedule, topology: Topology) -> np.ndarray:
  """Pacing rates (bytes/s) per ordered rank pair, flat ``(p, p)``; empty if all ports are equal.

  A rank's port is shared by the peers it exchanges with in proportion to the
  bytes the schedule moves between them: with ``v`` the bytes ``src -> dst`` and
  ``out``, ``in`` the ranks' totals, the pair gets ``min(send[src] v / out[src],
  recv[dst] v / in[dst])``. So the rates through a port sum to its bandwidth,
  a slow rank's links never queue behind faster traffic (research/testbed.md),
  and every pair can move its bytes in the time its busier port needs for all
  of its own (a share by peer count instead held a pair that carries more than
  the others back, e.g. two owners in optcc with two slow leaves: 1.5x the bound).

  No pair goes below half an even split of its slower port,
  ``min(send[src], recv[dst]) / (2 (p - 1))``: the kernel spaces a connection's
  packets by their length at the rate they left with, so a pair paced far below
  its ports delays the first packets of the next call on that connection (on
  the testbed optcc ran 13% slower right after r2ccl, whose scatter and gather
  pairs were paced at 3% of a port), and it cannot make up for any stall. The
  pairs the floor lifts carry little, so it overbooks their ports only briefly.
  Equal ports need no pacing. In a topology of clusters the pairs inside a
  cluster share the intra ports and the pairs across share the cross-cluster
  ports. From a RankSchedule, the rates of the pairs that its ranks are in (the
  ones the transport of its process paces), the others 0.
  """
  send = np.asarray(topology.send_bandwidth, np.float64)
  recv = np.asarray(topology.recv_bandwidth, np.float64)
  p = schedule.nranks
  cross = np.zeros((p, p), bool)
  isend = irecv = np.zeros(p)
  if topology.cluster is not None:
    cluster = np.asarray(topology.cluster)
    isend = np.asarray(topology.inter_send_bandwidth, np.float64)
    irecv = np.asarray(topology.inter_recv_bandwidth, np.float64)
    cross = cluster[:, None] != cluster[None, :]
  pair_send = np.where(cross, isend[:, None], send[:, None])
  pair_recv = np.where(cross, irecv[None, :], recv[None, :])
  pair_send = np.where(pair_send > 0, pair_send, send[:, None])  # no port: the intra one
  pair_recv = np.where(pair_recv > 0, pair_recv, recv[None, :])
  off = ~np.eye(p, dtype=bool)
  if len(np.unique(np.r_[pair_send[off], pair_recv[off]])) <= 1:
    return _NONE
  volume = np.zeros((p, p))
  np.add.at(volume, (schedule.table[:, SRC], schedule.table[:, DST]), schedule.table[:, LENGTH])
  sent, received = ((schedule.sent, schedule.received) if isinstance(schedule, RankSchedule)
                    else traffic(schedule.table, p, topology.cluster))
  share = np.zeros((p, p))
  for level, out, into in ((cross, sent[1], received[1]), (~cross, sent[0], received[0])):
    share += np.minimum(pair_send / np.maximum(out, 1)[:, None],
                        pair_recv / np.maximum(into, 1)[None, :]) * np.where(level, volume, 0)
  floor = np.minimum(pair_send, pair_recv) / (2 * (p - 1))
  rates = np.where(volume > 0, np.maximum(share, floor), 0)
  return np.ascontiguousarray(np.ceil(rates).astype(np.int64).reshape(-1))
