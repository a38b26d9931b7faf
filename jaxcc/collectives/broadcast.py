"""broadcast: every rank gets the root's array."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxcc._src import compat, dispatch, local_executor
from jaxcc.collectives import _args, _buckets
from jaxcc.collectives.all_reduce import all_reduce_p
from jaxcc.topology import Topology

_API = "jaxcc.broadcast"


def broadcast(x, axis_name, *, root: int = 0, algorithm: str = "auto", executor: str = "auto",
              topology: Topology | None = None, codec=None):
  """Every rank of ``axis_name`` gets rank ``root``'s ``x`` (an array or a pytree), bit for bit.

  Bytes sent per rank (N = ``x.nbytes``): "ring" (a pipelined chain) sends N
  from every rank but the last in ``chunks + p - 2`` steps; "direct" sends
  ``(p-1) N`` from the root in one step; "lax" is XLA's all-reduce of the
  root's bits as unsigned integers, zeros elsewhere (exact; ``2(p-1)/p N`` per
  rank). With a codec N is the encoded size: the array travels encoded
  (about 0.67 of raw for bf16 weights with "entropy" on the native executor).
  The result does not vary along the axis; its transpose sums the cotangent
  onto the root (with the same codec).

  Args:
    x: this rank's array, or a pytree of them (only the root's matter).
    axis_name: the mesh axis (or tuple of axes, ranks in ``lax``'s order).
    root: the source rank.
    algorithm: "auto", "lax", "ring" or "direct".
    executor: "auto", "xla" or "native".
    topology: the network of the axis' ranks; if None, the measured network's
      inside ``jaxcc.network.MeasuredNetwork.jit``, else uniform ports.
    codec: None, "fixed", "entropy" (bf16, f16 and f32 only; not with
      "lax") or "auto" (coded where it pays, ``jaxcc.codec.auto_choice``):
      lossless compression of every piece on the wire; the result is
      the one ``codec=None`` gives, bit for bit. See ``jaxcc.all_reduce``.
  """
  params = _args.resolve(_API, "broadcast", axis_name, algorithm, executor, topology, codec)
  size = params["axis_size"]
  if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < size:
    raise ValueError(f"{_API}: root must be a rank in [0, {size}), got {root!r}")

  def one(v):
    v = _args.as_array(_API, v)
    _args.check_codec(_API, codec, v.dtype)
    v = compat.make_varying(v, axis_name)
    _, codec_v = _args.wire_codecs(params, {v.dtype})
    here = dict(params, codec=codec_v)
    ordered = dispatch.needs_order(_API, "broadcast", here, _buckets.nbytes([v]))
    out, = broadcast_p.bind(v, root=root, invariant_out=compat.check_vma(), ordered=ordered,
                            **here)
    return out

  return jax.tree.map(one, x)


def _abstract_eval(x, *, axes, invariant_out, **_):
  names = {a for a, _ in axes}
  out = compat.with_varying_axes(x, compat.varying_axes(x) - names) if invariant_out else x
  return [out], {compat.NamedAxisEffect(a) for a in names}


def _run(x, *, root, platform, **params):
  axis_name = params["axis_name"]
  route = dispatch.choose(_API, "broadcast", params, platform, x.size * x.dtype.itemsize)
  if route.engine is dispatch.Engine.XLA:
    # XLA's all-reduce of the root's bits as unsigned integers, zeros elsewhere: exact, and
    # 2(p-1)/p N bytes per rank where an all_gather moves (p-1) N.
    word = np.dtype(f"uint{8 * x.dtype.itemsize}")
    bits = lax.bitcast_convert_type(x, word) if x.dtype != jnp.bool_ else x.astype(word)
    total = lax.psum(jnp.where(lax.axis_index(axis_name) == root, bits, 0), axis_name)
    return [lax.bitcast_convert_type(total, x.dtype) if x.dtype != jnp.bool_
            else total.astype(jnp.bool_)]
  if route.engine is dispatch.Engine.LOCAL:
    return [local_executor.broadcast(x, axis_name, params["axis_size"], params["group_axes"],
                                     root)]
  flat = dispatch.run_schedule(x.reshape(-1), route, "broadcast", params, root=root)
  return [flat.reshape(x.shape)]


def _transpose(cts, x, *, axes, axis_name, root, invariant_out, **params):
  ct = compat.instantiate_zeros(cts[0])
  if invariant_out:  # ct is the whole cotangent, the same on every rank
    total = jax.lax.pcast(ct, tuple(a for a, _ in axes), to="varying")
  else:  # each rank holds the cotangent of its own copy
    total, = all_reduce_p.bind(ct, axes=axes, axis_name=axis_name, op="sum",
                               invariant_out=False, route_nbytes=_buckets.nbytes([ct]), **params)
  return [jnp.where(lax.axis_index(axis_name) == root, total, jnp.zeros_like(total))]


def _batch(axis_data, vals_in, dims_in, **params):
  if axis_data.name in {a for a, _ in params["axes"]}:
    raise NotImplementedError(f"{_API} over a vmapped axis; map it with jax.shard_map")
  return broadcast_p.bind(*vals_in, **params), list(dims_in)


broadcast_p = compat.Primitive("broadcast")
compat.register(broadcast_p, _abstract_eval, _run, _transpose, _batch)
