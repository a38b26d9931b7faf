"""reduce_scatter: reduce over mesh axes, each rank keeping one shard; a drop-in for
``lax.psum_scatter``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxcc._src import compat, dispatch, local_executor
from jaxcc.collectives import _args, _buckets
from jaxcc.topology import Topology

_API = "jaxcc.reduce_scatter"
_LAX = {"sum": lax.psum, "max": lax.pmax, "min": lax.pmin}


def reduce_scatter(x, axis_name, *, scatter_dimension: int = 0, tiled: bool = True,
                   op: str = "sum", axis_index_groups=None, algorithm: str = "auto",
                   executor: str = "auto", topology: Topology | None = None, codec=None,
                   bucket_bytes: int | None = None):
  """Reduce ``x`` (an array or a pytree) over ``axis_name``; rank r keeps block r of
  ``scatter_dimension``.

  Equal to ``lax.psum_scatter(x, axis_name, scatter_dimension=..., tiled=...)``
  for ``op="sum"`` (and to its mean, max or min for "mean", "max", "min").
  With ``tiled`` the dimension (divisible by p) shrinks p times; without it
  the dimension must have size p and is removed. ``axis_name`` is a mesh axis
  or a tuple of them (blocks in ``lax``'s rank order). Sums are
  differentiable (the transpose is ``all_gather``); all ops are vmappable over
  other axes. A pytree's leaves go in buckets by dtype (``all_reduce``).
  Unlike ``lax.psum_scatter``, ``tiled`` defaults to True
  (``jaxcc.psum_scatter`` has lax's default). Forms only XLA's collective
  takes run on ``lax.psum_scatter`` (sums and means), with its result and
  type: ``axis_index_groups``, and a leaf unreduced along the axes.

  Bytes sent per rank (N = ``x.nbytes``): ``(p-1)/p N`` for "ring" (``p-1``
  steps per chunk) and "direct" (1 step per chunk). With a codec N counts
  encoded bytes: each hop decodes, adds and re-encodes.

  Args:
    x: this rank's full array, or a pytree of them.
    axis_name: the mesh axis (or tuple of axes) to reduce over.
    scatter_dimension: the dimension cut into p blocks.
    tiled: keep the dimension (size / p) instead of removing it.
    op: "sum", "mean", "max" or "min".
    axis_index_groups: as for ``lax.psum_scatter``: reduce within each group
      of ranks, which scatter its blocks among them (on XLA's collective).
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
  params = _args.resolve(_API, "reduce_scatter", axis_name, algorithm, executor, topology, codec)
  op = _args.check_op(_API, op)
  bucket_bytes = _args.check_bucket_bytes(_API, bucket_bytes)
  size = _args.group_size(_API, axis_index_groups, params["axis_size"])
  leaves, tree = _args.leaves_of(_API, x)
  dims = []
  for v in leaves:
    _args.check_reducible(_API, v.dtype)
    _args.check_codec(_API, codec, v.dtype)
    dim = _args.check_dimension(_API, "scatter_dimension", scatter_dimension, v.ndim)
    n = v.shape[dim]
    if (tiled and n % size) or (not tiled and n != size):
      need = f"divisible by {size}" if tiled else f"equal to {size}"
      raise ValueError(f"{_API}: dimension {dim} of x has size {n}, which must be {need} (the "
                       f"ranks of axis {axis_name!r} or of a group) with tiled={tiled}")
    dims.append(dim)
  out = [None] * len(leaves)
  reduce_op = "sum" if op == "mean" else op
  by_xla = [_args.xla_form(v, axis_name, axis_index_groups) for v in leaves]
  for i, v in enumerate(leaves):
    if not by_xla[i]:
      continue
    if reduce_op != "sum":
      raise ValueError(f"{_API}: op={op!r} cannot take axis_index_groups or a reduced or "
                       f"unreduced input (only XLA's psum_scatter does, for sums and means)")
    r = lax.psum_scatter(v, axis_name, scatter_dimension=dims[i],
                         axis_index_groups=axis_index_groups, tiled=tiled)
    out[i] = r / size if op == "mean" else r
  rest, leaves, dims = _args.native_leaves(leaves, dims, by_xla, axis_name)
  if not rest:
    return jax.tree.unflatten(tree, out)
  keys = [(v.dtype, d) for v, d in zip(leaves, dims)]  # one dimension per bucket
  # Every bucket of one call runs on one engine, chosen on the whole call's bytes: engines that
  # do not order their calls against each other must not meet within one call.
  route_nbytes = _buckets.nbytes(leaves)
  codecs, call_codec = _args.wire_codecs(params, {v.dtype for v in leaves})
  ordered = dispatch.needs_order(_API, "reduce_scatter", dict(params, codec=call_codec),
                                 route_nbytes, reduce_op)
  for bucket in _buckets.buckets(leaves, bucket_bytes, keys):
    operands = [leaves[i] for i in bucket]
    results = reduce_scatter_p.bind(*operands, scatter_dimension=dims[bucket[0]],
                                    tiled=bool(tiled), op=reduce_op, ordered=ordered,
                                    route_nbytes=route_nbytes,
                                    **dict(params, codec=codecs[operands[0].dtype]))
    for i, r in zip(bucket, results):
      out[rest[i]] = r / size if op == "mean" else r
  return jax.tree.unflatten(tree, out)


def _abstract_eval(*xs, axes, axis_size, scatter_dimension, tiled, **_):
  outs = []
  for x in xs:
    shape = list(x.shape)
    if tiled:
      shape[scatter_dimension] //= axis_size
    else:
      del shape[scatter_dimension]
    outs.append(x.update(shape=tuple(shape)))
  return outs, {compat.NamedAxisEffect(a) for a, _ in axes}


def _run(*xs, scatter_dimension, tiled, op, platform, route_nbytes, **params):
  axis_name, p = params["axis_name"], params["axis_size"]
  route = dispatch.choose(_API, "reduce_scatter", params, platform, route_nbytes, op)
  if route.engine is dispatch.Engine.XLA:
    # In a partial-manual shard_map (no group_axes) newer jax cannot trace psum_scatter: there
    # each rank keeps its block of the psum.
    if op == "sum" and (params["group_axes"] is not None or compat.PSUM_SCATTER_IN_PARTIAL_MANUAL):
      return list(lax.psum_scatter(list(xs), axis_name, scatter_dimension=scatter_dimension,
                                   tiled=tiled))
    return [_own_block(r, axis_name, p, scatter_dimension, tiled)
            for r in _LAX[op](list(xs), axis_name)]
  fronts = [jnp.moveaxis(x, scatter_dimension, 0) for x in xs]
  flat = _buckets.pack(fronts, rows=p)  # block r: every array's block r
  shard = flat.shape[0] // p
  if route.engine is dispatch.Engine.LOCAL:
    mine = local_executor.reduce_scatter(flat, axis_name, p, params["group_axes"], 0, True, op)
  else:
    full = dispatch.run_schedule(flat, route, "reduce_scatter", params, op=op)
    mine = lax.dynamic_slice(full, (lax.axis_index(axis_name) * shard,), (shard,))
  blocks = _buckets.unpack(mine, [(f.shape[0] // p,) + f.shape[1:] for f in fronts])
  outs = [jnp.moveaxis(b, 0, scatter_dimension) for b in blocks]
  return outs if tiled else [jnp.squeeze(o, scatter_dimension) for o in outs]


def _own_block(full, axis_name, p, dim, tiled):
  """This rank's block of ``full`` along ``dim`` (as psum_scatter would keep it)."""
  n = full.shape[dim] // p
  out = lax.dynamic_slice_in_dim(full, lax.axis_index(axis_name) * n, n, dim)
  return out if tiled else jnp.squeeze(out, dim)


def _transpose(cts, *xs, scatter_dimension, tiled, op, **params):
  if op != "sum":
    raise NotImplementedError(f"{_API}: op={op!r} is not differentiable")
  from jaxcc.collectives.all_gather import all_gather_p  # transposes into each other
  return all_gather_p.bind(*(compat.instantiate_zeros(ct) for ct in cts),
                           gather_dimension=scatter_dimension, tiled=tiled, **params)


def _jvp(primals, tangents, *, op, **params):
  if op != "sum":
    raise NotImplementedError(f"{_API}: op={op!r} is not differentiable")
  return compat.linear_jvp(reduce_scatter_p, primals, tangents, op=op, **params)


def _batch(axis_data, vals_in, dims_in, *, scatter_dimension, tiled, **params):
  if axis_data.name in {a for a, _ in params["axes"]}:
    raise NotImplementedError(f"{_API} over a vmapped axis; map it with jax.shard_map")
  outs, dims_out = [], []
  for x, d in zip(vals_in, dims_in):  # the batch dimension shifts each operand's own dimension
    dim = scatter_dimension + (1 if d is not None and d <= scatter_dimension else 0)
    out, = reduce_scatter_p.bind(x, scatter_dimension=dim, tiled=tiled, **params)
    outs.append(out)
    dims_out.append(d - 1 if d is not None and not tiled and d > dim else d)
  return outs, dims_out


reduce_scatter_p = compat.Primitive("reduce_scatter")
compat.register(reduce_scatter_p, _abstract_eval, _run, _transpose, _batch, jvp=_jvp)
