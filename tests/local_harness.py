"""Calls jaxcc._src.local_executor from a shard_map body (tests and benchmarks/local_collectives).

``call`` binds a tiny primitive whose CPU lowering runs one of the module's
five functions with the mesh axes bound, as a jaxcc collective's lowering
rule does.
"""

import math

from jaxcc._src import compat, local_executor


def call(fn: str, x, axis_name, mesh, out_shape, **kwargs):
  """``local_executor.<fn>(x, axis_name, size, group_axes, **kwargs)`` inside shard_map.

  Args:
    fn: "all_reduce", "reduce_scatter", "all_gather", "broadcast" or "ppermute".
    x: this rank's array.
    axis_name: a mesh axis or a tuple of them.
    mesh: the shard_map's mesh (every axis manual).
    out_shape: the result's shape.
    **kwargs: the function's other arguments (op, tiled, root, perm, ...).
  """
  names = (axis_name,) if isinstance(axis_name, str) else tuple(axis_name)
  mesh_axes = tuple(zip(mesh.axis_names, mesh.axis_sizes))
  group_axes = tuple((a, s) for a, s in mesh_axes if a not in names)
  return _local_p.bind(x, mesh_axes=mesh_axes, fn=fn, kwargs=tuple(sorted(kwargs.items())),
                       out_shape=tuple(out_shape), axis_name=axis_name, group_axes=group_axes)


def _abstract_eval(x, *, out_shape, **_):
  return x.update(shape=out_shape), compat.NATIVE_CALL_EFFECTS


def _lower(ctx, x, *, mesh_axes, fn, kwargs, out_shape, axis_name, group_axes):
  del out_shape
  names = (axis_name,) if isinstance(axis_name, str) else axis_name
  size = math.prod(dict(mesh_axes)[a] for a in names)
  run = getattr(local_executor, fn)
  with compat._core.extend_axis_env_nd(list(mesh_axes)):
    return compat.mlir.lower_fun(lambda a: run(a, axis_name, size, group_axes, **dict(kwargs)),
                                 multiple_results=False)(ctx, x)


_local_p = compat.Primitive("test_local_collective")
_local_p.def_effectful_abstract_eval(_abstract_eval)
compat.mlir.register_lowering(_local_p, _lower, platform="cpu", cacheable=False)
