"""Every JAX-internal name jaxcc uses, in one place (jax 0.10 to 0.12).

JAX's primitive machinery (axis environment, manual-axis types, AD and
batching registries) is not public API; when it moves, only this module
changes.
"""

from __future__ import annotations

import contextvars
import threading
from typing import Callable

import jax
import numpy as np
from jax._src import config as _config
from jax._src import core as _core
from jax._src import dispatch as _dispatch
from jax._src import distributed as _distributed
from jax._src import effects as _effects
from jax._src import xla_bridge as _xla_bridge
from jax._src.lib import _jax
from jax._src.interpreters import ad, batching, mlir  # noqa: F401  (re-exported)
from jax._src.lib.mlir import ir
from jax.extend.core import Primitive  # noqa: F401  (re-exported)

NamedAxisEffect = _core.NamedAxisEffect
Zero = ad.Zero
instantiate_zeros = ad.instantiate_zeros
linear_jvp = ad.linear_jvp


# jaxlib 0.10's CPU client runs several executions of a multi-device program at once: a native
# call of a later execution can hold a thread that a rank of an earlier one needs (a stall until
# the timeout, tests/test_local_executor.py). From 0.11 it launches them one after another.
EXECUTIONS_OVERLAP = tuple(int(v) for v in jax.__version__.split(".")[:2]) < (0, 11)


class ProgramOrderEffect(_effects.Effect):
  """The effect of jaxcc's native collectives where executions overlap (``EXECUTIONS_OVERLAP``).

  An ordered effect: XLA threads one token through them all, so each device
  runs its native calls in program order (inside scans and conds too), and
  executions wait for the previous one's token. It costs jax's asynchronous
  dispatch: a program with an effect is dispatched on jax's Python path and
  waits for its token.
  """

  def __str__(self):
    return "jaxcc.ProgramOrder"


PROGRAM_ORDER = ProgramOrderEffect()
for _kind in (_effects.ordered_effects, _effects.shardable_ordered_effects,
              _effects.lowerable_effects, _effects.control_flow_allowed_effects,
              _effects.custom_derivatives_allowed_effects, _effects.remat_allowed_effects):
  _kind.add_type(ProgramOrderEffect)


# The effects of a native FFI call's primitive (bound inside a jaxcc collective's lowering).
NATIVE_CALL_EFFECTS = frozenset({PROGRAM_ORDER}) if EXECUTIONS_OVERLAP else frozenset()


def reset_program_order() -> None:
  """Drop this thread's ``PROGRAM_ORDER`` token: the next program starts a fresh chain.

  A program that failed returns a token that carries its error; every later
  program that takes it fails with that error without running.
  """
  _dispatch.runtime_tokens.current_tokens.pop(PROGRAM_ORDER, None)


def chained_ffi_lowering(target: str, **kwargs) -> Callable:
  """The lowering rule of a native collective's FFI call, in program order.

  The call's first operand and first result are tokens. With jaxcc's effect
  (``EXECUTIONS_OVERLAP``) it is the effect's token. Otherwise the call takes
  the token of the previous native call lowered into the same block (a fresh
  one for the block's first) and leaves its own for the next: XLA runs a
  block's native calls in program order on every device, with no jax effect,
  so the program keeps jax's asynchronous dispatch. The primitive, and the
  primitives whose lowering binds it, are registered with ``cacheable=False``:
  a cached lowering is emitted into a function of its own, where the chain
  would start afresh. ``kwargs`` go to ``jax.ffi.ffi_lowering`` (operand
  indices count the token).
  """
  lower = jax.ffi.ffi_lowering(target, **kwargs)

  def rule(ctx, *args, **attrs):
    with_token = ctx.replace(avals_in=[_core.abstract_token, *ctx.avals_in],
                             avals_out=[_core.abstract_token, *ctx.avals_out])
    if PROGRAM_ORDER in ctx.tokens_in.effects():
      token, *outs = lower(with_token, ctx.tokens_in.get(PROGRAM_ORDER), *args, **attrs)
      ctx.set_tokens_out(mlir.TokenSet({PROGRAM_ORDER: token}))
      return outs
    chain = _block_chain(ctx)
    block = ir.InsertionPoint.current.block
    token = chain.get(block)
    token, *outs = lower(with_token, mlir.create_token() if token is None else token, *args,
                         **attrs)
    chain[block] = token
    return outs

  return rule


_chains = threading.local()


def _block_chain(ctx) -> dict:
  """The last native call's token of each block of the module being lowered."""
  module = ctx.module_context.module
  if getattr(_chains, "module", None) is not module:
    _chains.module, _chains.tokens = module, {}
  return _chains.tokens


def axis_names(axis_name, api_name: str) -> tuple[str, ...]:
  """``axis_name`` (one mesh axis name or a tuple of them, as ``lax.psum`` takes) as a tuple."""
  names = axis_name if isinstance(axis_name, tuple) else (axis_name,)
  if not names or not all(isinstance(a, str) for a in names) or len(set(names)) != len(names):
    raise TypeError(f"{api_name}: axis_name must be a mesh axis name (a str) or a tuple of "
                    f"distinct ones, got {axis_name!r}")
  return names


def bound_axes(axis_name, api_name: str) -> tuple[tuple[str, int], ...]:
  """The axes of ``axis_name`` as (name, size), or a NameError that says how to bind them."""
  env = _core.get_axis_env()
  out = []
  for name in axis_names(axis_name, api_name):
    if not env.axis_exists(name):
      raise NameError(
          f"{api_name}: Found an unbound axis name: {name}. To fix this, please call "
          f"{api_name.rsplit('.', 1)[-1]} under `jax.shard_map` over a mesh with axis {name!r}, "
          f"as lax's collectives")
    out.append((name, int(env.axis_size(name))))
  return tuple(out)


def axis_size(axis_name, api_name: str) -> int:
  """Number of ranks along ``axis_name`` (the product over a tuple of axes), bound or a NameError."""
  size = 1
  for _, n in bound_axes(axis_name, api_name):
    size *= n
  return size


def check_vma() -> bool:
  """Whether shard_map tracks which values vary along manual axes (check_vma=True)."""
  return bool(_config._check_vma.value)


def varying_axes(aval) -> frozenset:
  mat = getattr(aval, "mat", None)
  if mat is not None:
    return frozenset(mat.varying)
  return frozenset(getattr(aval, "vma", frozenset()))


def reduced_axes(aval) -> frozenset:
  """The manual axes along which ``aval`` is reduced or unreduced (jax's ``mat`` types): values
  only XLA's collectives take."""
  mat = getattr(aval, "mat", None)
  if mat is None:
    return frozenset()
  return frozenset(getattr(mat, "reduced", ())) | frozenset(getattr(mat, "unreduced", ()))


def with_varying_axes(aval, axes: frozenset):
  """``aval`` with the set of manual axes it varies along replaced by ``axes``."""
  if getattr(aval, "mat", None) is not None:
    return aval.update(manual_axis_type=aval.mat.update(varying=frozenset(axes)))
  return aval.update(vma=frozenset(axes))


def invariant_along(x, axis_name) -> bool:
  """Whether type checking knows ``x`` to be the same on every rank of ``axis_name``."""
  return check_vma() and not set(axis_names(axis_name, "invariant_along")) & varying_axes(
      jax.typeof(x))


def make_varying(x, axis_name):
  """``x`` cast to vary along every axis of ``axis_name`` if type checking tracks it."""
  if not check_vma():
    return x
  missing = tuple(a for a in axis_names(axis_name, "make_varying")
                  if a not in varying_axes(jax.typeof(x)))
  return jax.lax.pcast(x, missing, to="varying") if missing else x


def lower_in_axis_env(fun: Callable, **fixed) -> Callable:
  """A lowering rule that traces ``fun(*args, **params, **fixed)`` (a list of results) with its
  axes bound.

  The primitive's params name the collective's axes (``axes``: (name, size)
  pairs) and the other manual axes of the mesh (``group_axes``); inside
  shard_map's body they are bound, so ``fun`` may use ``lax.ppermute`` and
  ``lax.axis_index``.
  """

  def rule(ctx, *args, **params):
    axes = list(params["axes"]) + list(params["group_axes"] or ())
    token = _lowering_mesh.set(getattr(ctx.module_context.axis_context, "mesh", None))
    try:
      with _core.extend_axis_env_nd(axes):
        return mlir.lower_fun(lambda *a: fun(*a, **params, **fixed),
                              multiple_results=True)(ctx, *args)
    finally:
      _lowering_mesh.reset(token)

  return rule


_lowering_mesh = contextvars.ContextVar("jaxcc_lowering_mesh", default=None)


def lowering_mesh() -> jax.sharding.Mesh | None:
  """The mesh, with its devices, of the shard_map whose body a jaxcc rule is lowering.

  None outside such a rule or when only an abstract mesh is known.
  """
  mesh = _lowering_mesh.get()
  return mesh if isinstance(mesh, jax.sharding.Mesh) else None


def backends_started() -> bool:
  """Whether jax has created its backends (after which the CPU device count is fixed)."""
  return _xla_bridge.backends_are_initialized()


def serve_coordination(address: str, num_processes: int, heartbeat_timeout_s: int):
  """Run a jax.distributed coordination service on ``address`` for ``num_processes`` clients.

  Every task is recoverable: a client that dies is not reported to the others (no
  error, no failed barrier, no shutdown barrier), so a job's survivors run on; the
  service keeps the key-value store. Returns the service; it runs until shut down.
  """
  return _jax.get_distributed_runtime_service(address, num_processes,
                                              heartbeat_timeout=heartbeat_timeout_s,
                                              recoverable=True)


def connect_to_coordination(address: str, num_processes: int, process_id: int,
                            timeout_s: int, heartbeat_timeout_s: int, restarted: bool) -> None:
  """``jax.distributed.initialize`` as a client of a service that runs elsewhere, any process id.

  ``initialize`` starts a service in process 0; here it binds an ephemeral
  loopback port, which no client reaches, and is shut down at once, so process
  0 is a client like the others and may die without taking the job's service
  with it. A restarted process 0 first deletes the CPU client's global
  topology from the store: process 0 publishes it, once per key, when its
  backend starts (the others read it, and read it long before).
  """
  jax.distributed.initialize(address, num_processes, process_id,
                             initialization_timeout=timeout_s,
                             heartbeat_timeout_seconds=heartbeat_timeout_s,
                             coordinator_bind_address="127.0.0.1:0" if process_id == 0 else None)
  if _distributed.global_state.service is not None:
    _distributed.global_state.service.shutdown()
    _distributed.global_state.service = None
  if restarted and process_id == 0:
    _distributed.global_state.client.key_value_delete("cpu:global_topology")


def coordinator_address() -> str | None:
  """The ``host:port`` that jax.distributed.initialize connected to, or None before it."""
  if _distributed.global_state.client is None:
    return None
  return _distributed.global_state.coordinator_address


def kv_set(key: str, value: str, overwrite: bool = False) -> None:
  """Put ``key`` in the jax.distributed key-value store (shared by the job's processes)."""
  _distributed.global_state.client.key_value_set(key, value, allow_overwrite=overwrite)


def barrier(name: str, timeout_s: float) -> None:
  """Wait until every process of the job reaches the barrier ``name`` (once per name)."""
  _distributed.global_state.client.wait_at_barrier(name, int(timeout_s * 1000))


def kv_try_get(key: str) -> str | None:
  """``key``'s value in the jax.distributed key-value store, None if no process set it."""
  try:
    return _distributed.global_state.client.key_value_try_get(key)
  except jax.errors.JaxRuntimeError as e:
    if "NOT_FOUND" not in str(e):
      raise
    return None


def kv_get(key: str, timeout_s: float) -> str:
  """``key``'s value in the jax.distributed key-value store, waiting up to ``timeout_s`` for it.

  Raises:
    TimeoutError: no process set it in time.
  """
  try:
    return _distributed.global_state.client.blocking_key_value_get(
        key, max(1, int(timeout_s * 1000)))
  except jax.errors.JaxRuntimeError as e:
    if "DEADLINE_EXCEEDED" not in str(e):
      raise
    raise TimeoutError(f"{key!r} did not appear in the jax.distributed key-value store within "
                       f"{timeout_s:.0f} s") from e


def group_axes(axis_name) -> tuple[tuple[str, int], ...] | None:
  """The other manual axes of the current mesh as (name, size), or None if some axis is not manual.

  Together they say which instance of ``axis_name`` (a name or a tuple of
  names) a device is in; with an automatic (non-manual) axis of size > 1 that
  is not visible inside the body (a partial-manual shard_map).
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return ()
  sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
  if any(sizes[a] > 1 for a in mesh.axis_names if a not in mesh.manual_axes):
    return None
  names = axis_name if isinstance(axis_name, tuple) else (axis_name,)
  return tuple((a, sizes[a]) for a in mesh.axis_names if a not in names)


def ppermute(x, axis_name, perm):
  """``lax.ppermute`` with ``perm`` in ``lax.axis_index``'s numbering of ``axis_name``.

  Over a tuple of axes ``lax.axis_index`` (and ``lax.all_gather``) number the
  ranks in the tuple's order, ``lax.ppermute`` in the mesh's; jaxcc numbers
  every rank as ``lax.axis_index`` does and translates here.
  """
  order = ppermute_order(axis_name)
  if order is not None:  # lax.ppermute over the axes in mesh order (jax 0.12 requires that order)
    perm = tuple((order[s], order[d]) for s, d in perm)
    position = {a: i for i, a in enumerate(jax.sharding.get_abstract_mesh().axis_names)}
    axis_name = tuple(sorted(axis_name, key=position.__getitem__))
  return jax.lax.ppermute(x, axis_name, perm)


def ppermute_order(axis_name) -> tuple[int, ...] | None:
  """``lax.ppermute``'s number of each rank (indexed by ``lax.axis_index``'s), or None where they
  agree (one axis, or a tuple in mesh order)."""
  names = axis_names(axis_name, "ppermute")
  mesh = jax.sharding.get_abstract_mesh()
  if len(names) == 1 or mesh.empty:
    return None
  position = {a: i for i, a in enumerate(mesh.axis_names)}
  in_mesh_order = sorted(names, key=position.__getitem__)
  if in_mesh_order == list(names):
    return None
  sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
  coords = np.indices([sizes[a] for a in names]).reshape(len(names), -1)
  index = np.ravel_multi_index([coords[names.index(a)] for a in in_mesh_order],
                               [sizes[a] for a in in_mesh_order])
  return tuple(int(i) for i in index)


# jax >= 0.11 fails to trace lax.psum_scatter in a partial-manual shard_map ("Length of
# sharding.spec (2) must be equal to aval's ndim (0)"); jax 0.10 traces it.
PSUM_SCATTER_IN_PARTIAL_MANUAL = tuple(int(v) for v in jax.__version__.split(".")[:2]) < (0, 11)


def ppermute_needs_mesh_order() -> bool:
  """Whether ``lax.ppermute`` refuses a tuple of axes not in the mesh's order (jax 0.12's
  ``jax_raise_on_ppermute_sort_diff``)."""
  flag = getattr(_config, "raise_on_ppermute_sort_diff", None)
  return bool(flag is not None and flag.value)


def register(prim, abstract_eval, run, transpose, batcher, jvp=None) -> None:
  """Register an effectful abstract eval, lowerings, a linear transpose and a batcher for a
  primitive with any number of operands and as many results.

  ``abstract_eval`` returns the list of result avals and the effects. Where
  executions overlap (``EXECUTIONS_OVERLAP``) the program-order effect is
  added when the param ``ordered`` says the collective may run on a native
  engine (``dispatch.needs_order``); collectives left to XLA carry no token (a
  token costs each execution a wait on the previous one, and a partial-manual
  shard_map cannot place one). Elsewhere native calls are ordered by data
  (``chained_ffi_lowering``). ``run(*args, platform, **params)`` is the body
  lowered with ``platform`` "cpu", "cuda" or None (any other), uncached so
  that the native calls it binds join their block's chain. ``jvp`` replaces
  the linear rule's tangent (for reductions that are not linear, e.g. max).
  """
  def ordered_abstract_eval(*args, **params):
    outs, effects = abstract_eval(*args, **params)
    ordered = EXECUTIONS_OVERLAP and params["ordered"]
    return outs, (effects | {PROGRAM_ORDER}) if ordered else effects

  prim.multiple_results = True
  prim.def_effectful_abstract_eval(ordered_abstract_eval)
  prim.def_impl(_unmapped_impl(prim.name))
  for platform in (None, "cpu", "cuda"):
    mlir.register_lowering(prim, lower_in_axis_env(run, platform=platform), platform=platform,
                           cacheable=False)
  ad.deflinear2(prim, transpose)
  if jvp is not None:
    ad.primitive_jvps[prim] = jvp
  batching.fancy_primitive_batchers[prim] = batcher


def _unmapped_impl(name):
  def impl(*args, **params):
    raise NameError(f"jaxcc.{name} must be called inside jax.shard_map (with its axis bound)")
  return impl
