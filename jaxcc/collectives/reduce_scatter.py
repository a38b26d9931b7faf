"""reduce_scatter: sum over a mesh axis, each rank keeping one shard; a drop-in for ``lax.psum_scatter``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxcc._src import compat
from jaxcc.collectives import _common
from jaxcc.topology import Topology


def reduce_scatter(x: jax.Array, axis_name: str, *, scatter_dimension: int = 0, tiled: bool = True,
                   algorithm: str = "auto", executor: str = "auto",
                   topology: Topology | None = None, codec=None) -> jax.Array:
  """Sum ``x`` over ``axis_name``; rank r keeps block r of ``scatter_dimension``.

  Equal to ``lax.psum_scatter(x, axis_name, scatter_dimension=..., tiled=...)``.
  With ``tiled`` the dimension (divisible by p) shrinks p times; without it
  the dimension must have size p and is removed. Differentiable (its
  transpose is ``all_gather``) and vmappable over other axes.

  Bytes sent per rank (N = ``x.nbytes``): ``(p-1)/p N`` for "ring" (``p-1``
  steps per chunk) and "direct" (1 step per chunk). With a codec N counts
  encoded bytes: each hop decodes, adds and re-encodes.

  Args:
    x: this rank's full array.
    axis_name: the mesh axis to reduce over.
    scatter_dimension: the dimension cut into p blocks.
    tiled: keep the dimension (size / p) instead of removing it.
    algorithm: "auto", "lax", "ring" or "direct".
    executor: "auto", "xla" or "native".
    topology: the network of the axis' ranks; uniform ports if None.
    codec: None, "fixed" or "entropy" (bf16, f16 and f32 only; not with
      "lax"): lossless compression of every piece on the wire; the result is
      the one ``codec=None`` gives, bit for bit. See ``jaxcc.all_reduce``.
  """
  size, topology = _common.resolve("jaxcc.reduce_scatter", "reduce_scatter", axis_name,
                                   algorithm, executor, topology, codec)
  x = jnp.asarray(x)
  _common.check_reducible("jaxcc.reduce_scatter", x.dtype)
  _common.check_codec("jaxcc.reduce_scatter", codec, x.dtype)
  dim = _common.check_dimension("jaxcc.reduce_scatter", "scatter_dimension", scatter_dimension,
                               x.ndim)
  n = x.shape[dim]
  if (tiled and n % size) or (not tiled and n != size):
    need = f"divisible by {size}" if tiled else f"equal to {size}"
    raise ValueError(f"jaxcc.reduce_scatter: dimension {dim} of x has size {n}, which must be "
                     f"{need} (the size of axis {axis_name!r}) with tiled={tiled}")
  x = compat.make_varying(x, axis_name)
  return reduce_scatter_p.bind(x, axis_name=axis_name, axis_size=size, algorithm=algorithm,
                               executor=executor, topology=topology, codec=codec,
                               scatter_dimension=dim, tiled=bool(tiled),
                               **_common.native_params(axis_name))


def _abstract_eval(x, *, axis_name, axis_size, scatter_dimension, tiled, **_):
  shape = list(x.shape)
  if tiled:
    shape[scatter_dimension] //= axis_size
  else:
    del shape[scatter_dimension]
  return x.update(shape=tuple(shape)), {compat.NamedAxisEffect(axis_name)}


def _run(x, *, scatter_dimension, tiled, native, **params):
  axis_name, axis_size = params["axis_name"], params["axis_size"]
  if params["algorithm"] == "lax":
    return lax.psum_scatter(x, axis_name, scatter_dimension=scatter_dimension, tiled=tiled)
  front = jnp.moveaxis(x, scatter_dimension, 0)
  sched = _common.schedule("reduce_scatter", front.size, x.dtype, params)
  shard = front.size // axis_size
  flat = _common.execute(front.reshape(-1), sched, params, native)
  mine = lax.dynamic_slice(flat, (lax.axis_index(axis_name) * shard,), (shard,))
  out = jnp.moveaxis(mine.reshape((front.shape[0] // axis_size,) + front.shape[1:]), 0,
                     scatter_dimension)
  return out if tiled else jnp.squeeze(out, scatter_dimension)


def _transpose(ct, x, *, scatter_dimension, tiled, **params):
  if type(ct) is compat.Zero:
    return [compat.Zero(x.aval)]
  from jaxcc.collectives.all_gather import all_gather_p  # transposes into each other
  return [all_gather_p.bind(ct, gather_dimension=scatter_dimension, tiled=tiled, **params)]


def _batch(axis_data, vals_in, dims_in, *, scatter_dimension, tiled, **params):
  if axis_data.name == params["axis_name"]:
    raise NotImplementedError(
        "jaxcc.reduce_scatter over a vmapped axis; map it with jax.shard_map")
  (x,), (d,) = vals_in, dims_in
  if d is not None and d <= scatter_dimension:
    scatter_dimension += 1
  out = reduce_scatter_p.bind(x, scatter_dimension=scatter_dimension, tiled=tiled, **params)
  if d is not None and not tiled and d > scatter_dimension:
    d -= 1
  return out, d


reduce_scatter_p = compat.Primitive("reduce_scatter")
compat.register(reduce_scatter_p, _abstract_eval, _run, _transpose,
                _batch)
