"""all_gather: every rank gets every rank's block; a drop-in for ``lax.all_gather``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxcc._src import compat, dispatch, local_executor
from jaxcc._src.bits import as_bits
from jaxcc._src.buffers import block_buffer
from jaxcc.collectives import _args, _buckets
from jaxcc.topology import Topology

_API = "jaxcc.all_gather"


def all_gather(x, axis_name, *, axis: int = 0, tiled: bool = True, axis_index_groups=None,
               to: str = "varying", algorithm: str = "auto", executor: str = "auto",
               topology: Topology | None = None, codec=None, bucket_bytes: int | None = None):
  """Gather every rank's ``x`` (an array or a pytree) along ``axis``; block r comes from rank r.

  Equal to ``lax.all_gather(x, axis_name, axis=axis, tiled=tiled)`` bit for
  bit: with ``tiled`` the blocks are concatenated along ``axis``, without it
  stacked along a new ``axis`` of size p. ``axis_name`` is a mesh axis or a
  tuple of them (blocks in ``lax``'s rank order). Differentiable (its
  transpose is ``reduce_scatter``) and vmappable over other axes. A pytree's
  leaves go in buckets by dtype (``all_reduce``). Unlike ``lax.all_gather``,
  ``tiled`` defaults to True (pass False for lax's stacking).
  Forms only XLA's collective takes run on ``lax.all_gather``, with its
  result and type: ``axis_index_groups``, ``to`` other than "varying", and a
  leaf reduced or unreduced along the axes.

  Bytes sent per rank (N = the gathered result's bytes): ``(p-1)/p N`` for
  "ring" (``p-1`` steps per chunk) and "direct" (1 step per chunk). With a
  codec N counts encoded bytes: the blocks travel encoded.

  Args:
    x: this rank's block, or a pytree of them.
    axis_name: the mesh axis (or tuple of axes) to gather over.
    axis: where the blocks go.
    tiled: concatenate (True) or stack (False).
    axis_index_groups: as for ``lax.all_gather``: gather within each group.
    to: the result's type along the axes, as for ``lax.all_gather``:
      "varying", "invarying" or "reduced".
    algorithm: "auto", "lax", "ring" or "direct".
    executor: "auto", "xla" or "native".
    topology: the network of the axis' ranks; if None, the measured network's
      inside ``jaxcc.network.MeasuredNetwork.jit``, else uniform ports.
    codec: None, "fixed", "entropy" (bf16, f16 and f32 only; not with
      "lax") or "auto" (coded where it pays, ``jaxcc.codec.auto_choice``):
      lossless compression of every piece on the wire; the result is
      the one ``codec=None`` gives, bit for bit. See ``jaxcc.all_reduce``.
    bucket_bytes: the largest bucket of a pytree (default 25 MiB).
  """
  params = _args.resolve(_API, "all_gather", axis_name, algorithm, executor, topology, codec)
  bucket_bytes = _args.check_bucket_bytes(_API, bucket_bytes)
  _args.group_size(_API, axis_index_groups, params["axis_size"])
  leaves, tree = _args.leaves_of(_API, x)
  dims = []
  for v in leaves:
    _args.check_codec(_API, codec, v.dtype)
    dims.append(_args.check_dimension(_API, "axis", axis, v.ndim + (0 if tiled else 1)))
  out = [None] * len(leaves)
  by_xla = [to != "varying" or _args.xla_form(v, axis_name, axis_index_groups) for v in leaves]
  for i, v in enumerate(leaves):
    if by_xla[i]:
      out[i] = lax.all_gather(v, axis_name, axis_index_groups=axis_index_groups, axis=axis,
                              tiled=tiled, to=to)
  rest, leaves, dims = _args.native_leaves(leaves, dims, by_xla, axis_name)
  if not rest:
    return jax.tree.unflatten(tree, out)
  keys = [(v.dtype, d) for v, d in zip(leaves, dims)]  # one dimension per bucket
  # Every bucket of one call runs on one engine, chosen on the whole call's bytes: engines that
  # do not order their calls against each other must not meet within one call.
  route_nbytes = params["axis_size"] * _buckets.nbytes(leaves)
  codecs, call_codec = _args.wire_codecs(params, {v.dtype for v in leaves})
  ordered = dispatch.needs_order(_API, "all_gather", dict(params, codec=call_codec), route_nbytes)
  for bucket in _buckets.buckets(leaves, bucket_bytes, keys):
    operands = [leaves[i] for i in bucket]
    results = all_gather_p.bind(*operands, gather_dimension=dims[bucket[0]], tiled=bool(tiled),
                                ordered=ordered, route_nbytes=route_nbytes,
                                **dict(params, codec=codecs[operands[0].dtype]))
    for i, r in zip(bucket, results):
      out[rest[i]] = r
  return jax.tree.unflatten(tree, out)


def _abstract_eval(*xs, axes, axis_size, gather_dimension, tiled, **_):
  outs = []
  for x in xs:
    shape = list(x.shape)
    if tiled:
      shape[gather_dimension] *= axis_size
    else:
      shape.insert(gather_dimension, axis_size)
    outs.append(x.update(shape=tuple(shape)))
  return outs, {compat.NamedAxisEffect(a) for a, _ in axes}


def _run(*xs, gather_dimension, tiled, platform, route_nbytes, **params):
  axis_name, p = params["axis_name"], params["axis_size"]
  route = dispatch.choose(_API, "all_gather", params, platform, route_nbytes)
  dtype = xs[0].dtype
  # 16-bit floats move as bits (jaxcc._src.bits): only the executor's call sees their float type.
  if route.engine is dispatch.Engine.XLA:
    return [lax.bitcast_convert_type(g, dtype) for g in lax.all_gather(
        [as_bits(x) for x in xs], axis_name, axis=gather_dimension, tiled=tiled)]
  fronts = [jnp.moveaxis(as_bits(x if tiled else jnp.expand_dims(x, gather_dimension)),
                         gather_dimension, 0) for x in xs]
  flat = _buckets.pack(fronts)
  if route.engine is dispatch.Engine.LOCAL:
    full = as_bits(local_executor.all_gather(lax.bitcast_convert_type(flat, dtype), axis_name, p,
                                             params["group_axes"], 0, True))
  else:
    buf = block_buffer(flat, lax.axis_index(axis_name), p)
    full = as_bits(dispatch.run_schedule(lax.bitcast_convert_type(buf, dtype), route,
                                         "all_gather", params))
  blocks = _buckets.unpack(full, [(p * f.shape[0],) + f.shape[1:] for f in fronts], rows=p)
  return [lax.bitcast_convert_type(jnp.moveaxis(b, 0, gather_dimension), dtype) for b in blocks]


def _transpose(cts, *xs, gather_dimension, tiled, **params):
  from jaxcc.collectives.reduce_scatter import reduce_scatter_p  # transposes into each other
  return reduce_scatter_p.bind(*(compat.instantiate_zeros(ct) for ct in cts),
                               scatter_dimension=gather_dimension, tiled=tiled, op="sum",
                               **params)


def _batch(axis_data, vals_in, dims_in, *, gather_dimension, tiled, **params):
  if axis_data.name in {a for a, _ in params["axes"]}:
    raise NotImplementedError(f"{_API} over a vmapped axis; map it with jax.shard_map")
  outs, dims_out = [], []
  for x, d in zip(vals_in, dims_in):  # the batch dimension shifts each operand's own dimension
    dim, d_out = gather_dimension, d
    if d is not None:
      if d <= dim:
        dim += 1
      elif not tiled:
        d_out += 1
    out, = all_gather_p.bind(x, gather_dimension=dim, tiled=tiled, **params)
    outs.append(out)
    dims_out.append(d_out)
  return outs, dims_out


all_gather_p = compat.Primitive("all_gather")
compat.register(all_gather_p, _abstract_eval, _run, _transpose, _batch)
