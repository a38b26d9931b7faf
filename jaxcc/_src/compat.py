"""Every JAX-internal name jaxcc uses, in one place (jax 0.10 to 0.12).

JAX's primitive machinery (axis environment, manual-axis types, AD and
batching registries) is not public API; when it moves, only this module
changes.
"""

from __future__ import annotations

import contextvars
from typing import Callable

import jax
from jax._src import config as _config
from jax._src import core as _core
from jax._src import distributed as _distributed
from jax._src import effects as _effects
from jax._src.interpreters import ad, batching, mlir  # noqa: F401  (re-exported)
from jax.extend.core import Primitive  # noqa: F401  (re-exported)

NamedAxisEffect = _core.NamedAxisEffect
Zero = ad.Zero


class ProgramOrderEffect(_effects.Effect):
  """The effect of every jaxcc collective: XLA threads one token through them all.

  An ordered effect, so each device runs its jaxcc collectives in program
  order (inside scans and conds too) and executions of jitted programs run
  in dispatch order: the native executor's peers always meet in the same call.
  """

  def __str__(self):
    return "jaxcc.ProgramOrder"


PROGRAM_ORDER = ProgramOrderEffect()
for _kind in (_effects.ordered_effects, _effects.shardable_ordered_effects,
              _effects.lowerable_effects, _effects.control_flow_allowed_effects,
              _effects.custom_derivatives_allowed_effects, _effects.remat_allowed_effects):
  _kind.add_type(ProgramOrderEffect)


def ordered_ffi_lowering(target: str, **kwargs) -> Callable:
  """The lowering rule of an FFI call that takes and returns the ``PROGRAM_ORDER`` token.

  The token is the call's first operand and first result; ``kwargs`` go to
  ``jax.ffi.ffi_lowering`` (operand indices count the token).
  """
  lower = jax.ffi.ffi_lowering(target, **kwargs)

  def rule(ctx, *args, **attrs):
    token = ctx.tokens_in.get(PROGRAM_ORDER)
    with_token = ctx.replace(avals_in=[_core.abstract_token, *ctx.avals_in],
                             avals_out=[_core.abstract_token, *ctx.avals_out])
    token, *outs = lower(with_token, token, *args, **attrs)
    ctx.set_tokens_out(mlir.TokenSet({PROGRAM_ORDER: token}))
    return outs

  return rule


def axis_size(axis_name, api_name: str) -> int:
  """Size of a bound named axis, or a NameError that says how to bind it."""
  if not isinstance(axis_name, str):
    raise TypeError(f"{api_name}: axis_name must be one mesh axis name (a str), got {axis_name!r}")
  env = _core.get_axis_env()
  if not env.axis_exists(axis_name):
    raise NameError(
        f"{api_name}: unbound axis name {axis_name!r}; call it inside jax.shard_map over a mesh "
        f"with that axis (as for jax.lax.psum)")
  return int(env.axis_size(axis_name))


def check_vma() -> bool:
  """Whether shard_map tracks which values vary along manual axes (check_vma=True)."""
  return bool(_config._check_vma.value)


def varying_axes(aval) -> frozenset:
  mat = getattr(aval, "mat", None)
  if mat is not None:
    return frozenset(mat.varying)
  return frozenset(getattr(aval, "vma", frozenset()))


def with_varying_axes(aval, axes: frozenset):
  """``aval`` with the set of manual axes it varies along replaced by ``axes``."""
  if getattr(aval, "mat", None) is not None:
    return aval.update(manual_axis_type=aval.mat.update(varying=frozenset(axes)))
  return aval.update(vma=frozenset(axes))


def make_varying(x, axis_name):
  """``x`` cast to vary along ``axis_name`` if type checking tracks it and it does not yet."""
  if check_vma() and axis_name not in varying_axes(jax.typeof(x)):
    return jax.lax.pcast(x, axis_name, to="varying")
  return x


def lower_in_axis_env(fun: Callable, **fixed) -> Callable:
  """A lowering rule that traces ``fun(*args, **params, **fixed)`` with its axes bound.

  The primitive's params name the axis (``axis_name``, ``axis_size``) and the
  other manual axes of the mesh (``group_axes``); inside shard_map's body they
  are bound, so ``fun`` may use ``lax.ppermute`` and ``lax.axis_index``.
  """

  def rule(ctx, *args, **params):
    axes = [(params["axis_name"], params["axis_size"])] + list(params["group_axes"] or ())
    token = _lowering_mesh.set(getattr(ctx.module_context.axis_context, "mesh", None))
    try:
      with _core.extend_axis_env_nd(axes):
        return mlir.lower_fun(lambda *a: fun(*a, **params, **fixed),
                              multiple_results=False)(ctx, *args)
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


def coordinator_address() -> str | None:
  """The ``host:port`` that jax.distributed.initialize connected to, or None before it."""
  if _distributed.global_state.client is None:
    return None
  return _distributed.global_state.coordinator_address


def kv_set(key: str, value: str) -> None:
  """Put ``key`` in the jax.distributed key-value store (shared by the job's processes)."""
  _distributed.global_state.client.key_value_set(key, value)


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


def group_axes(axis_name: str) -> tuple[tuple[str, int], ...] | None:
  """The other manual axes of the current mesh as (name, size), or None if some axis is not manual.

  Together they say which instance of ``axis_name`` a device is in; with an
  automatic (non-manual) axis of size > 1 that is not visible inside the body.
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return ()
  sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
  if any(sizes[a] > 1 for a in mesh.axis_names if a not in mesh.manual_axes):
    return None
  return tuple((a, sizes[a]) for a in mesh.axis_names if a != axis_name)


def register(prim, abstract_eval, run, transpose, batcher) -> None:
  """Register an effectful abstract eval (``PROGRAM_ORDER`` added), lowerings, a linear transpose
  and a batcher.

  ``run(*args, native, **params)`` is the body lowered on every platform with
  ``native=False``, on the CPU with ``native=True`` and on CUDA GPUs with
  ``native="cuda"``.
  """
  def ordered_abstract_eval(*args, **params):
    out, effects = abstract_eval(*args, **params)
    return out, effects | {PROGRAM_ORDER}

  prim.def_effectful_abstract_eval(ordered_abstract_eval)
  prim.def_impl(_unmapped_impl(prim.name))
  mlir.register_lowering(prim, lower_in_axis_env(run, native=False))
  mlir.register_lowering(prim, lower_in_axis_env(run, native=True), platform="cpu")
  mlir.register_lowering(prim, lower_in_axis_env(run, native="cuda"), platform="cuda")
  ad.deflinear2(prim, transpose)
  batching.fancy_primitive_batchers[prim] = batcher


def _unmapped_impl(name):
  def impl(*args, **params):
    raise NameError(f"jaxcc.{name} must be called inside jax.shard_map (with its axis bound)")
  return impl
