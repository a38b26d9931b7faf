"""all_reduce: the sum (mean, max, min) over mesh axes, a drop-in for ``lax.psum`` and friends."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
from jax import lax

from jaxcc._src import compat, dispatch, local_executor
from jaxcc.collectives import _args, _buckets
from jaxcc.topology import Topology

_API = "jaxcc.all_reduce"
_LAX = {"sum": lax.psum, "mean": lax.pmean, "max": lax.pmax, "min": lax.pmin}
_INVARIANT_SUM = (
    "jaxcc.all_reduce: a float input is already the same on every rank of {axis_name!r} "
    "(invariant), so its sum is p * x with nothing sent. A gradient with respect to a "
    "replicated parameter is invariant because jax summed it already, over XLA's all-reduce; "
    "for jaxcc to sum it, differentiate with respect to "
    "jax.lax.pcast(params, {axis_name!r}, to='varying').")


def all_reduce(x, axis_name, *, op: str = "sum", axis_index_groups=None, algorithm: str = "auto",
               executor: str = "auto", topology: Topology | None = None, codec=None,
               bucket_bytes: int | None = None):
  """Reduce ``x`` (an array or a pytree of arrays) over ``axis_name``; every rank gets the result.

  Equal to ``lax.psum(x, axis_name)`` (``op="sum"``), ``lax.pmean``
  ("mean"), ``lax.pmax`` ("max") or ``lax.pmin`` ("min"): bit for bit for
  integers, max and min, up to reassociation for float sums, identical from
  run to run. Call it inside ``jax.shard_map``; ``axis_name`` is a mesh axis
  or a tuple of them (ranks in ``lax``'s order). Sums and means are
  differentiable (the transpose is as for psum); all ops are vmappable over
  other axes. bool is summed as int32, as psum does.

  A pytree's leaves go in buckets by dtype of up to ``bucket_bytes`` (one
  collective per bucket); the results equal per-leaf calls. A leaf typed
  invariant along the axes (the same on every rank) sends nothing: ``p * x``
  for a sum, ``x`` for max and min, as XLA simplifies psum of one; a float sum
  of one warns (the gradient of a replicated parameter is one: jax summed it
  already, over XLA's collective). Forms only XLA's collective takes run on
  ``lax``'s, with its result and type: ``axis_index_groups``, and a leaf
  reduced or unreduced along the axes (``jax.typeof(x).mat``).

  Bytes sent per rank (N = the bucket's bytes, p ranks): ``2(p-1)/p N`` for
  "ring" (``2(p-1)`` steps per chunk) and "direct" (2 steps per chunk);
  ``N + (p-2) w_i`` for "optcc", with shares ``w_i`` from the topology.
  With a codec every piece travels encoded, so N counts encoded bytes: each
  hop decodes, adds and re-encodes (a sum cannot be added compressed).

  Args:
    x: this rank's array, or a pytree of arrays.
    axis_name: the mesh axis (or tuple of axes) to reduce over.
    op: "sum", "mean", "max" or "min".
    axis_index_groups: as for ``lax.psum``: reduce within each group of ranks
      (on XLA's collective).
    algorithm: "auto" (the engine and schedule priced fastest: XLA's own
      collective, the native in-process path, or the schedule for
      ``topology`` priced cheapest by ``jaxcc.planner.price``), "lax" (XLA's own all-reduce), "ring",
      "direct", "optcc" or "r2ccl".
    executor: "auto", "xla" (schedules run on XLA collectives) or "native".
    topology: the network of the axis' ranks; if None, the measured network's
      inside ``jaxcc.network.MeasuredNetwork.jit``, else uniform ports.
    codec: None, "fixed", "entropy" (bf16, f16 and f32 only; not with
      "lax") or "auto" (``jaxcc.codec.auto_choice``: "entropy" for a dtype
      where coding pays on the topology's slowest port, else raw): lossless
      compression of every piece on the wire, so the result is the one
      ``codec=None`` gives, bit for bit. "entropy" sends the real
      encoded size (about 0.67 of raw bf16 weights) with the native executor;
      the XLA executor moves static sizes: "fixed" about 0.77 of raw bf16,
      "entropy" raw plus headers (see ``jaxcc.codec``).
    bucket_bytes: the largest bucket of a pytree (default 25 MiB).

  Returns:
    The result, with ``x``'s structure, shapes and dtypes (a mean of integers
    is a float, as with ``lax.pmean``).
  """
  params = _args.resolve(_API, "all_reduce", axis_name, algorithm, executor, topology, codec)
  op = _args.check_op(_API, op)
  bucket_bytes = _args.check_bucket_bytes(_API, bucket_bytes)
  _args.group_size(_API, axis_index_groups, params["axis_size"])
  leaves, tree = _args.leaves_of(_API, x)
  leaves = [v.astype(jnp.int32) if v.dtype == jnp.bool_ else v for v in leaves]
  for v in leaves:
    _args.check_reducible(_API, v.dtype)
    _args.check_codec(_API, codec, v.dtype)
  out = [None] * len(leaves)
  reduce_op = "sum" if op == "mean" else op
  by_xla = [i for i, v in enumerate(leaves) if _args.xla_form(v, axis_name, axis_index_groups)]
  for i in by_xla:
    out[i] = _LAX[op](leaves[i], axis_name, axis_index_groups=axis_index_groups)
  # A leaf the same on every rank reduces with no communication (XLA's all-reduce simplifier
  # does the same for psum): p * x for a sum, x for max and min.
  invariant = [i for i, v in enumerate(leaves)
               if i not in by_xla and compat.invariant_along(v, axis_name)]
  for i in invariant:
    v = leaves[i]
    r = v * params["axis_size"] if reduce_op == "sum" else v
    out[i] = r / params["axis_size"] if op == "mean" else r
  if any(jnp.issubdtype(leaves[i].dtype, jnp.floating) for i in invariant) and reduce_op == "sum":
    warnings.warn(_INVARIANT_SUM.format(axis_name=axis_name), stacklevel=2)
  rest = [i for i in range(len(leaves)) if i not in invariant and i not in by_xla]
  if not rest:
    return jax.tree.unflatten(tree, out)
  # Leaves that vary along part of a tuple of axes sum to p' * x over the rest, as with psum.
  moving = [compat.make_varying(leaves[i], axis_name) for i in rest]
  # Every bucket of one call runs on one engine, chosen on the whole call's bytes: engines that
  # do not order their calls against each other must not meet within one call.
  route_nbytes = _buckets.nbytes(moving)
  codecs, call_codec = _args.wire_codecs(params, {v.dtype for v in moving})
  ordered = dispatch.needs_order(_API, "all_reduce", dict(params, codec=call_codec),
                                 route_nbytes, reduce_op)
  for bucket in _buckets.buckets(moving, bucket_bytes):
    operands = [moving[j] for j in bucket]
    results = all_reduce_p.bind(*operands, op=reduce_op, invariant_out=compat.check_vma(),
                                ordered=ordered, route_nbytes=route_nbytes,
                                **dict(params, codec=codecs[operands[0].dtype]))
    for j, r in zip(bucket, results):
      out[rest[j]] = r / params["axis_size"] if op == "mean" else r
  return jax.tree.unflatten(tree, out)


def _abstract_eval(*xs, axes, invariant_out, **_):
  names = {a for a, _ in axes}
  outs = [compat.with_varying_axes(x, compat.varying_axes(x) - names) if invariant_out else x
          for x in xs]
  return outs, {compat.NamedAxisEffect(a) for a in names}


def _run(*xs, platform, op, route_nbytes, **params):
  axis_name = params["axis_name"]
  route = dispatch.choose(_API, "all_reduce", params, platform, route_nbytes, op)
  if route.engine is dispatch.Engine.XLA:
    return list(_LAX[op](list(xs), axis_name))
  flat = _buckets.pack(xs)
  if route.engine is dispatch.Engine.LOCAL:
    flat = local_executor.all_reduce(flat, axis_name, params["axis_size"], params["group_axes"],
                                     op)
  else:
    flat = dispatch.run_schedule(flat, route, "all_reduce", params, op=op)
  return _buckets.unpack(flat, [x.shape for x in xs])


def _transpose(cts, *xs, op, **params):
  if op != "sum":
    raise NotImplementedError(f"{_API}: op={op!r} is not differentiable (as lax.p{op})")
  cts = [compat.instantiate_zeros(ct) for ct in cts]
  if params["invariant_out"]:
    return [jax.lax.pcast(ct, tuple(a for a, _ in params["axes"]), to="varying") for ct in cts]
  return all_reduce_p.bind(*cts, op=op, **params)


def _jvp(primals, tangents, *, op, **params):
  if op != "sum":
    raise NotImplementedError(f"{_API}: op={op!r} is not differentiable (as lax.p{op})")
  return compat.linear_jvp(all_reduce_p, primals, tangents, op=op, **params)


def _batch(axis_data, vals_in, dims_in, **params):
  if axis_data.name in {a for a, _ in params["axes"]}:
    raise NotImplementedError(f"{_API} over a vmapped axis; map it with jax.shard_map")
  return all_reduce_p.bind(*vals_in, **params), list(dims_in)


all_reduce_p = compat.Primitive("all_reduce")
compat.register(all_reduce_p, _abstract_eval, _run, _transpose, _batch, jvp=_jvp)
