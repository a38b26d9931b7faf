"""The executor layer: which engine runs a collective, decided here and nowhere else.

Engines:

* ``XLA``: XLA's own collective (``lax.psum``, ``psum_scatter``,
  ``all_gather``, ``ppermute``): NCCL on GPUs, gloo across CPU processes,
  XLA:CPU's in-process collective within one process.
* ``LOCAL``: the native in-process path (``local_executor``): every rank of
  the group lives in this process, so one rendezvous and direct reads of the
  peers' buffers, in the fixed order of the "direct" schedule.
* ``INPROCESS``, ``TCP``, ``NCCL``: the native interpreter walking a
  Schedule (``native_executor``) over the InProcess transport (an explicit
  algorithm within one process), the Tcp transport (ranks in several
  processes; the schedule pipelined over chunks) or the Nccl transport (CUDA).
* ``BORDER``: a hierarchical collective over a tuple of mesh axes whose
  outer groups are the clusters (``border_executor``): the intra-cluster
  phases on XLA's collective over the inner axes, the cross-cluster phase on
  ``cross`` (INPROCESS, TCP or NCCL) over the outer axis, with the bits of
  the full schedule. Chosen on the GPU, where the inner axes are NCCL's; on
  the CPU with ``JAXCC_INTRA_ENGINE=xla`` (there XLA:CPU's collectives made it
  2.7-2.8x slower than the whole schedule, ``benchmarks/hierarchical_loopback.py``).
* ``TWIN``: the Schedule on XLA's collectives (``xla_executor``): the
  oracle, and the path where no native transport runs.

How the choice is made (``choose``): ``algorithm="lax"`` is XLA;
``executor="xla"`` is TWIN; an explicit algorithm runs on the native engine
where one runs (else TWIN, or an error with ``executor="native"``); and
``algorithm="auto"`` is priced: the native engine where its cost model
(``costs``) says it beats XLA's collective at this size, or where a measured
network's slowest port bounds the collective (``costs.network_bound``), else
XLA. Algorithms never choose engines; engines never choose algorithms.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxcc import planner
from jaxcc._src import (border_executor, compat, config, costs, native_executor,
                        nccl_bootstrap, xla_executor)
from jaxcc._src.engines import Engine


@dataclasses.dataclass(frozen=True)
class Route:
  """An engine and what it needs: ``procs``, the process of every rank of every group (TCP;
  of the outer axis for BORDER); ``cross``, BORDER's engine across clusters; ``full``, the
  route of the whole schedule where BORDER cannot cut a buffer into equal tiles."""

  engine: Engine
  procs: np.ndarray | None = None
  cross: Engine | None = None
  full: Route | None = None


def needs_order(api: str, collective: str, params: dict, nbytes: int, op: str = "sum") -> bool:
  """Whether the collective may run on a native engine, decided when it is traced.

  Native peers meet in program order (a token through every native call:
  ``compat.chained_ffi_lowering``); a collective left to XLA carries none. The
  platform is jax's default backend and the processes those of the job; the
  lowering (``choose``) decides again with the mesh's devices, and runs a
  collective traced without the token on XLA.

  Raises:
    NotImplementedError: as ``choose``.
  """
  platform = {"cpu": "cpu", "gpu": "cuda", "cuda": "cuda"}.get(jax.default_backend())
  route = choose(api, collective, dict(params, ordered=True), platform, nbytes, op,
                 at_trace=True)
  return route.engine not in (Engine.XLA, Engine.TWIN)


def choose(api: str, collective: str, params: dict, platform: str | None, nbytes: int,
           op: str = "sum", at_trace: bool = False) -> Route:
  """The engine that runs ``collective`` on ``nbytes`` per rank (see the module docstring).

  ``at_trace``: decided before lowering, when the mesh's devices are not
  known (``needs_order``).

  Raises:
    NotImplementedError: ``executor="native"`` where no native engine runs
      (the message says why and names the fix).
  """
  algorithm = params.get("algorithm", "auto")
  executor = params["executor"]
  if algorithm == "lax":
    return Route(Engine.XLA)
  if executor == "xla":
    return Route(Engine.TWIN)
  native = _native_route(params, platform, explicit=algorithm != "auto", op=op,
                         at_trace=at_trace)
  if not isinstance(native, str) and not params["ordered"]:
    native = "was traced for XLA's collective (no program-order token)"
  if isinstance(native, str):
    if executor == "native":
      raise NotImplementedError(f"{api}: executor='native' {native}; use executor='auto' or "
                                f"'xla'")
    xla_runs = algorithm == "auto" and params.get("codec") is None
    return Route(Engine.XLA if xla_runs else Engine.TWIN)
  if not (executor == "native" or algorithm != "auto" or params.get("codec") is not None
          or _native_pays(collective, native.engine, params, nbytes)):
    return Route(Engine.XLA)
  if at_trace or native.engine is Engine.LOCAL:
    return native
  border = _border_route(params, native, op)
  if border is not None and _runs_hierarchical(collective, algorithm, params, nbytes):
    return border
  return native


def run_schedule(buf: jax.Array, route: Route, collective: str, params: dict, *, root: int = 0,
                 perm=None, op: str = "sum") -> jax.Array:
  """Run ``collective`` on the flat ``buf`` on a schedule engine: the planned algorithm, in one
  chunk, or pipelined over chunks on TCP (whose steps overlap)."""
  if route.engine is Engine.BORDER:
    return _run_border(buf, route, collective, params)
  length = buf.shape[0] // 2 if collective == "ppermute" else buf.shape[0]
  topology = params["topology"]
  itemsize = np.dtype(buf.dtype).itemsize
  api = f"jaxcc.{collective}"
  algorithm = params.get("algorithm", "direct")
  if algorithm == "auto":  # chosen on the pipelined schedules, as planner.price prices them
    algorithm = planner.auto_algorithm(collective, length, itemsize, topology, root=root,
                                       perm=perm, api=api)
  # One chunk, or over TCP the depth the cost model picks (the runner overlaps its steps).
  chunks = None if route.engine is Engine.TCP else 1
  if route.engine is Engine.TWIN:
    sched = planner.schedule(collective, length, itemsize, topology, algorithm, root=root,
                             chunks=chunks, perm=perm, api=api)
    return xla_executor.run_schedule(buf, sched, params["axis_name"], codec=params.get("codec"),
                                     op=op)
  # The native engines run the part of the schedule that the ranks of this process are in.
  ranks = native_executor.held_ranks(topology.size, route.procs, params["axis_name"],
                                     params["group_axes"])
  sched = planner.rank_schedule(collective, length, itemsize, topology, algorithm, ranks,
                                root=root, chunks=chunks, perm=perm, api=api)
  if route.engine is Engine.NCCL:
    return native_executor.run_schedule_cuda(buf, sched, params["axis_name"],
                                             params["group_axes"], params.get("codec"))
  if route.engine is Engine.TCP:
    return native_executor.run_schedule(buf, sched, params["axis_name"], params["group_axes"],
                                        route.procs, topology, params.get("codec"))
  return native_executor.run_schedule(buf, sched, params["axis_name"], params["group_axes"])


def _run_border(buf, route, collective, params):
  """BORDER with ``run_schedule``'s buffers (reduce_scatter: this rank's tile in place), or the
  full schedule where the buffer does not cut into equal tiles of the inner group."""
  p = params["axis_size"]
  inner = p // params["axes"][0][1]
  if collective == "all_reduce":
    if buf.shape[0] % inner:
      return run_schedule(buf, route.full, collective, params)
    return border_executor.all_reduce(buf, route, params)
  tile = buf.shape[0] // p
  start = lax.axis_index(params["axis_name"]) * tile
  if collective == "reduce_scatter":
    mine = border_executor.reduce_scatter(buf, route, params)
    return lax.dynamic_update_slice_in_dim(jnp.zeros_like(buf), mine, start, 0)
  return border_executor.all_gather(lax.dynamic_slice_in_dim(buf, start, tile), route, params)


def _runs_hierarchical(collective, algorithm, params, nbytes) -> bool:
  """Whether the call runs the hierarchical schedule ("auto": priced on float32 of ``nbytes``)."""
  if algorithm == "auto" and collective in ("all_reduce", "reduce_scatter", "all_gather"):
    length = max(nbytes // 4, params["axis_size"])
    length -= length % params["axis_size"]
    algorithm = planner.auto_algorithm(collective, length, 4, params["topology"])
  return algorithm == "hierarchical"


def _border_route(params: dict, native: Route, op: str) -> Route | None:
  """BORDER where ``JAXCC_INTRA_ENGINE`` asks for it ("auto": on the GPU) and the clusters are
  the outer axis' groups, with equal ports (so equal tiles), each inside one process; else
  None."""
  axes, topology = params["axes"], params["topology"]
  engine = config.intra_engine()
  if engine == "native" or (engine == "auto" and native.engine is not Engine.NCCL):
    return None
  if len(axes) < 2 or op != "sum" or params.get("codec") is not None:
    return None
  clusters = axes[0][1]
  n = params["axis_size"] // clusters
  if topology.cluster != tuple(r // n for r in range(params["axis_size"])):
    return None
  for c in range(clusters):
    ranks = topology.cluster_ranks(c)
    ports = {(topology.send_bandwidth[r], topology.recv_bandwidth[r],
              topology.inter_send_bandwidth[r], topology.inter_recv_bandwidth[r]) for r in ranks}
    if len(ports) != 1 or 0.0 in next(iter(ports)):
      return None
  outer = axes[0][0]
  if native.engine is Engine.NCCL:
    return Route(Engine.BORDER, cross=Engine.NCCL, full=native)
  if native.engine is Engine.INPROCESS:
    return Route(Engine.BORDER, cross=Engine.INPROCESS, full=native)
  procs = native.procs.reshape(-1, clusters, n)  # (groups, cluster, inner rank)
  if not (procs == procs[:, :, :1]).all():
    return None  # a cluster spans processes: the full schedule pipelines its phases over TCP
  outer_procs = native_executor.process_map(outer, params["cross_group_axes"])
  return Route(Engine.BORDER, procs=outer_procs, cross=Engine.TCP, full=native)


def _native_route(params: dict, platform: str | None, explicit: bool, op: str,
                  at_trace: bool) -> Route | str:
  """The native engine for these params on ``platform``, or why none runs."""
  if params["group_axes"] is None:
    return ("runs in a shard_map whose mesh axes are all manual (a partial-manual shard_map "
            "hides which instance of the axis a device is in)")
  if platform == "cpu":
    if at_trace:
      procs = np.zeros(int(jax.process_count() > 1), np.int64)  # across processes or not
    else:
      procs = native_executor.process_map(params["axis_name"], params["group_axes"])
    if procs is None:
      return ("runs across processes only in a shard_map over a mesh of devices "
              "(jax.make_mesh), not an abstract mesh")
    if len(procs):
      return Route(Engine.TCP, procs) if op == "sum" else f"runs op={op!r} within one process only"
    if explicit:
      return Route(Engine.INPROCESS) if op == "sum" else (
          f"runs op={op!r} with algorithm='auto' only")
    return Route(Engine.LOCAL)
  if platform == "cuda":
    if op != "sum":
      return f"runs op={op!r} on the CPU only"
    reason = nccl_bootstrap.unavailable()
    if reason is None and not at_trace and compat.lowering_mesh() is None:
      reason = "the devices of the shard_map's mesh are unknown (abstract mesh)"
    return Route(Engine.NCCL) if reason is None else f"on the GPU needs the Nccl transport: {reason}"
  return f"has no transport on platform {platform!r}"


def _native_pays(collective: str, engine: Engine, params: dict, nbytes: int) -> bool:
  """Whether the native engine beats XLA's collective for this call, by the cost model."""
  if engine is Engine.LOCAL:
    return costs.local_beats_xla(collective, nbytes)
  topology = params["topology"]
  ports = topology.ports
  equal_ports = len(set(ports)) == 1
  if engine is Engine.TCP:
    return (not equal_ports or costs.tcp_beats_xla(collective, nbytes)
            or params.get("measured", False) and costs.network_bound(min(ports)))
  # NCCL: XLA's NCCL ring is as good as any schedule on equal ports; a schedule that
  # planner.price prices clearly below the ring pays for the native transport.
  if equal_ports or collective == "ppermute":
    return False
  length = max(nbytes // 4, 1)
  best = planner.auto_algorithm(collective, length, 4, topology)
  return (planner.price(collective, length, 4, topology, best,
                        chunks=planner.depth(collective, length, 4, topology, best))
          < costs.NCCL_MARGIN * planner.price(collective, length, 4, topology, "ring",
                                              chunks=planner.depth(collective, length, 4,
                                                                   topology, "ring")))
