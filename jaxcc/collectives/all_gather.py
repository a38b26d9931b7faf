"""all_gather: every rank gets every rank's block; a drop-in for ``lax.all_gather``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxcc._src import compat
from jaxcc._src.bits import as_bits, word_of
from jaxcc.collectives import _common
from jaxcc.topology import Topology


def all_gather(x: jax.Array, axis_name: str, *, axis: int = 0, tiled: bool = True,
               algorithm: str = "auto", executor: str = "auto",
               topology: Topology | None = None, codec=None) -> jax.Array:
  """Gather every rank's ``x`` along ``axis``; block r comes from rank r.

  Equal to ``lax.all_gather(x, axis_name, axis=axis, tiled=tiled)``: with
  ``tiled`` the blocks are concatenated along ``axis``, without it stacked
  along a new ``axis`` of size p. Differentiable (its transpose is
  ``reduce_scatter``) and vmappable over other axes.

  Bytes sent per rank (N = the gathered result's bytes): ``(p-1)/p N`` for
  "ring" (``p-1`` steps per chunk) and "direct" (1 step per chunk). With a
  codec N counts encoded bytes: the blocks travel encoded.

  Args:
    x: this rank's block.
    axis_name: the mesh axis to gather over.
    axis: where the blocks go.
    tiled: concatenate (True) or stack (False).
    algorithm: "auto", "lax", "ring" or "direct".
    executor: "auto", "xla" or "native".
    topology: the network of the axis' ranks; uniform ports if None.
    codec: None, "fixed" or "entropy" (bf16, f16 and f32 only; not with
      "lax"): lossless compression of every piece on the wire; the result is
      the one ``codec=None`` gives, bit for bit. See ``jaxcc.all_reduce``.
  """
  size, topology = _common.resolve("jaxcc.all_gather", "all_gather", axis_name, algorithm,
                                   executor, topology, codec)
  x = jnp.asarray(x)
  _common.check_codec("jaxcc.all_gather", codec, x.dtype)
  dim = _common.check_dimension("jaxcc.all_gather", "axis", axis, x.ndim + (0 if tiled else 1))
  x = compat.make_varying(x, axis_name)
  return all_gather_p.bind(x, axis_name=axis_name, axis_size=size, algorithm=algorithm,
                           executor=executor, topology=topology, codec=codec,
                           gather_dimension=dim, tiled=bool(tiled),
                           **_common.native_params(axis_name))


def _abstract_eval(x, *, axis_name, axis_size, gather_dimension, tiled, **_):
  shape = list(x.shape)
  if tiled:
    shape[gather_dimension] *= axis_size
  else:
    shape.insert(gather_dimension, axis_size)
  return x.update(shape=tuple(shape)), {compat.NamedAxisEffect(axis_name)}


def _run(x, *, gather_dimension, tiled, native, **params):
  axis_name, axis_size = params["axis_name"], params["axis_size"]
  if params["algorithm"] == "lax":
    return lax.all_gather(x, axis_name, axis=gather_dimension, tiled=tiled)
  # 16-bit floats move as bits (jaxcc._src.bits): the executor's call is the only op that sees
  # their float type.
  word = word_of(x.dtype)
  bits = as_bits(x)
  if not tiled:
    bits = jnp.expand_dims(bits, gather_dimension)
  front = jnp.moveaxis(bits, gather_dimension, 0)
  sched = _common.schedule("all_gather", front.size * axis_size, x.dtype, params)
  buf = lax.dynamic_update_slice(jnp.zeros((sched.length,), word), front.reshape(-1),
                                 (lax.axis_index(axis_name) * front.size,))
  out = _common.execute(lax.bitcast_convert_type(buf, x.dtype), sched, params, native)
  out = as_bits(out).reshape((axis_size * front.shape[0],) + front.shape[1:])
  return lax.bitcast_convert_type(jnp.moveaxis(out, 0, gather_dimension), x.dtype)


def _transpose(ct, x, *, gather_dimension, tiled, **params):
  if type(ct) is compat.Zero:
    return [compat.Zero(x.aval)]
  from jaxcc.collectives.reduce_scatter import reduce_scatter_p  # transposes into each other
  return [reduce_scatter_p.bind(ct, scatter_dimension=gather_dimension, tiled=tiled, **params)]


def _batch(axis_data, vals_in, dims_in, *, gather_dimension, tiled, **params):
  if axis_data.name == params["axis_name"]:
    raise NotImplementedError("jaxcc.all_gather over a vmapped axis; map it with jax.shard_map")
  (x,), (d,) = vals_in, dims_in
  if d is not None:
    if d <= gather_dimension:
      gather_dimension += 1
    elif not tiled:
      d += 1
  return all_gather_p.bind(x, gather_dimension=gather_dimension, tiled=tiled, **params), d


all_gather_p = compat.Primitive("all_gather")
compat.register(all_gather_p, _abstract_eval, _run, _transpose, _batch)
