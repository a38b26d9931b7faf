"""ppermute: send each rank's array to another rank; a drop-in for ``lax.ppermute``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxcc._src import compat, dispatch, encoded_ppermute, local_executor
from jaxcc._src.bits import as_bits
from jaxcc._src.buffers import block_buffer
from jaxcc.collectives import _args, _buckets
from jaxcc.network import active
from jaxcc.schedules.ir import check_perm
from jaxcc.topology import Topology

_API = "jaxcc.ppermute"


def ppermute(x, axis_name, perm, *, executor: str = "auto", codec=None):
  """Rank ``src`` sends ``x`` (an array or a pytree) to rank ``dst`` for each pair of ``perm``.

  Equal to ``lax.ppermute`` bit for bit: a rank that receives nothing gets
  zeros. Differentiable (its transpose is the inverse permutation, with the
  same codec) and vmappable over other axes. A leaf reduced or unreduced
  along the axes (``jax.typeof(x).mat``) runs on ``lax.ppermute``.

  Bytes sent per rank (N = ``x.nbytes``): N by the source of each pair
  ``(src, dst)`` with ``src != dst`` and 0 by the others, every pair at once
  in one step; over TCP in ``chunks`` pipelined steps of ``N / chunks``
  (``jaxcc.schedules.permute``). With a codec N counts encoded bytes: the
  native executor sends each piece's real encoded size over TCP (about 0.67
  of raw bf16 weights with "entropy"; devices of one process copy raw
  memory), the XLA executor static sizes: "fixed" about 0.77 of raw bf16,
  "entropy" raw plus headers.

  Args:
    x: this rank's array, or a pytree of them.
    axis_name: the mesh axis (or tuple of axes).
    perm: pairs ``(src, dst)``; each rank at most once as a source and once as
      a destination. Over a tuple of axes ranks are numbered as
      ``lax.ppermute`` numbers them (in the mesh's axis order); a tuple not
      in mesh order fails as lax's does where jax refuses it
      (``jax_raise_on_ppermute_sort_diff``, jax 0.12).
    executor: "auto" (the engine priced fastest: with a codec the native
      one, so that pieces move over TCP at their encoded size; otherwise
      ``lax.ppermute``, which measured faster within a process and over gloo),
      "xla" or "native".
    codec: None, "fixed", "entropy" (bf16, f16 and f32 only) or "auto"
      (coded where it pays on the measured network, ``jaxcc.codec.auto_choice``): lossless
      compression on the wire; the result is the one ``codec=None`` gives,
      bit for bit.
  """
  params = _args.check_axis(_API, axis_name, executor, codec)
  size = params["axis_size"]
  perm = lax_perm = check_perm(perm, size, _API)
  order = compat.ppermute_order(axis_name)  # perm names ranks as lax.ppermute does
  if order is not None and compat.ppermute_needs_mesh_order():
    raise RuntimeError(
        f"{_API}: axis_name {axis_name!r} is not in the mesh's axis order, which "
        f"lax.ppermute requires under jax_raise_on_ppermute_sort_diff; name the axes in mesh "
        f"order, or disable that flag (ranks are then numbered in mesh order)")
  if order is not None:
    rank_of = {n: r for r, n in enumerate(order)}
    perm = tuple((rank_of[s], rank_of[d]) for s, d in perm)
  # The native executor's TCP pacing and pipeline depth plan on uniform ports; "auto" codes on
  # the measured network where one is active.
  topology = Topology.uniform(size, _args.DEFAULT_BANDWIDTH)
  measured = active.topology(axis_name)

  def one(v):
    v = _args.as_array(_API, v)
    _args.check_codec(_API, codec, v.dtype)
    if _args.xla_form(v, axis_name):
      return lax.ppermute(v, axis_name, lax_perm)
    v = compat.make_varying(v, axis_name)
    _, codec_v = _args.wire_codecs({"codec": codec, "topology": measured or topology}, {v.dtype})
    ordered = dispatch.needs_order(_API, "ppermute", dict(params, executor=executor,
                                                          codec=codec_v, topology=topology),
                                   _buckets.nbytes([v]))
    out, = ppermute_p.bind(v, perm=perm, executor=executor, codec=codec_v, topology=topology,
                           ordered=ordered, **params)
    return out

  return jax.tree.map(one, x)


def _abstract_eval(x, *, axes, **_):
  return [x], {compat.NamedAxisEffect(a) for a, _ in axes}


def _run(x, *, perm, platform, **params):
  axis_name = params["axis_name"]
  route = dispatch.choose(_API, "ppermute", params, platform, x.size * x.dtype.itemsize)
  if route.engine in (dispatch.Engine.XLA, dispatch.Engine.TWIN):
    return encoded_ppermute.ppermute([x], axis_name, [perm], params["codec"])
  if route.engine is dispatch.Engine.LOCAL:
    return [local_executor.ppermute(x, axis_name, params["axis_size"], params["group_axes"],
                                    perm)]
  # The input, then the output, zeros where no pair sends; 16-bit floats placed as bits.
  bits = as_bits(x.reshape(-1))
  buf = lax.bitcast_convert_type(block_buffer(bits, 0, 2), x.dtype)
  got = as_bits(dispatch.run_schedule(buf, route, "ppermute", params, perm=perm))[x.size:]
  stays = [s for s, d in perm if s == d]  # left out of the schedule: they keep their input
  if stays:
    got = jnp.where(jnp.isin(lax.axis_index(axis_name), jnp.asarray(stays)), bits, got)
  return [lax.bitcast_convert_type(got, x.dtype).reshape(x.shape)]


def _transpose(cts, x, *, perm, **params):
  return ppermute_p.bind(compat.instantiate_zeros(cts[0]), perm=tuple((d, s) for s, d in perm),
                         **params)


def _batch(axis_data, vals_in, dims_in, **params):
  if axis_data.name in {a for a, _ in params["axes"]}:
    raise NotImplementedError(f"{_API} over a vmapped axis; map it with jax.shard_map")
  return ppermute_p.bind(*vals_in, **params), list(dims_in)


ppermute_p = compat.Primitive("ppermute")
compat.register(ppermute_p, _abstract_eval, _run, _transpose, _batch)
