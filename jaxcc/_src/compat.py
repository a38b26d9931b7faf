"""Every JAX-internal name jaxcc uses, in one place (jax 0.10 to 0.12).

JAX's primitive machinery (axis environment, manual-axis types, AD and
batching registries) is not public API; when it moves, only this module
changes.
"""

from __future__ import annotations

from typing import Callable

import jax
from jax._src import config as _config
from jax._src import core as _core
from jax._src.interpreters import ad, batching, mlir  # noqa: F401  (re-exported)
from jax.extend.core import Primitive  # noqa: F401  (re-exported)

NamedAxisEffect = _core.NamedAxisEffect
is_undefined_primal = ad.is_undefined_primal
Zero = ad.Zero


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


def lower_in_axis_env(fun: Callable) -> Callable:
  """A lowering rule that traces ``fun(*args, **params)`` with its axis bound.

  The primitive's params name the axis (``axis_name``, ``axis_size``); inside
  shard_map's body the axis is bound, so ``fun`` may use ``lax.ppermute`` and
  ``lax.axis_index`` on it.
  """

  def rule(ctx, *args, **params):
    with _core.extend_axis_env_nd([(params["axis_name"], params["axis_size"])]):
      return mlir.lower_fun(lambda *a: fun(*a, **params), multiple_results=False)(ctx, *args)

  return rule


def register(prim, abstract_eval, lowering, transpose, batcher) -> None:
  """Register an effectful abstract eval, a lowering, a linear transpose and a batcher."""
  prim.def_effectful_abstract_eval(abstract_eval)
  prim.def_impl(_unmapped_impl(prim.name))
  mlir.register_lowering(prim, lowering)
  ad.deflinear2(prim, transpose)
  batching.fancy_primitive_batchers[prim] = batcher


def _unmapped_impl(name):
  def impl(*args, **params):
    raise NameError(f"jaxcc.{name} must be called inside jax.shard_map (with its axis bound)")
  return impl
