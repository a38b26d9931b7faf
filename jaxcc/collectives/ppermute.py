"""ppermute: send each rank's array to another rank; a drop-in for ``lax.ppermute``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxcc import planner
from jaxcc._src import compat, encoded_ppermute, native_executor
from jaxcc._src.bits import as_bits
from jaxcc.collectives import _common
from jaxcc.schedules.ir import check_perm
from jaxcc.topology import Topology


def ppermute(x: jax.Array, axis_name: str, perm, *, executor: str = "auto",
             codec=None) -> jax.Array:
  """Rank ``src`` sends ``x`` to rank ``dst`` for each pair of ``perm``.

  Equal to ``lax.ppermute`` bit for bit: a rank that receives nothing gets
  zeros. Differentiable (its transpose is the inverse permutation, with the
  same codec) and vmappable over other axes.

  Bytes sent per rank (N = ``x.nbytes``): N by the source of each pair
  ``(src, dst)`` with ``src != dst`` and 0 by the others, every pair at once
  in one step; over TCP in ``chunks`` pipelined steps of ``N / chunks``
  (``jaxcc.schedules.permute``). With a codec N counts encoded bytes: the
  native executor sends each piece's real encoded size over TCP (about 0.67
  of raw bf16 weights with "entropy"; devices of one process copy raw
  memory), the XLA executor static sizes: "fixed" about 0.77 of raw bf16,
  "entropy" raw plus headers.

  Args:
    x: this rank's array.
    axis_name: the mesh axis.
    perm: pairs ``(src, dst)``; each rank at most once as a source and once as
      a destination.
    executor: "auto" (native where the axis spans processes on the CPU, in a
      shard_map over every mesh axis, so that pieces move over TCP at their
      encoded size; elsewhere ``lax.ppermute``, which within a process is a
      plain copy, over 10x faster than the native path's buffer of twice the
      array), "xla" or "native".
    codec: None, "fixed" or "entropy" (bf16, f16 and f32 only): lossless
      compression on the wire; the result is the one ``codec=None`` gives,
      bit for bit.
  """
  size = _common.check_axis("jaxcc.ppermute", axis_name, executor, codec)
  perm = check_perm(perm, size, "jaxcc.ppermute")
  x = jnp.asarray(x)
  _common.check_codec("jaxcc.ppermute", codec, x.dtype)
  x = compat.make_varying(x, axis_name)
  # The native executor's TCP pacing and pipeline depth plan on uniform ports.
  topology = Topology.uniform(size, _common.DEFAULT_BANDWIDTH)
  return ppermute_p.bind(x, axis_name=axis_name, axis_size=size, perm=perm, executor=executor,
                         codec=codec, topology=topology, **_common.native_params(axis_name))


def _abstract_eval(x, *, axis_name, **_):
  return x, {compat.NamedAxisEffect(axis_name)}


def _run(x, *, perm, native, **params):
  axis_name = params["axis_name"]
  if not _native_pays(params, native):
    return encoded_ppermute.ppermute([x], axis_name, [perm], params["codec"])[0]
  sched = planner.schedule("ppermute", x.size, x.dtype.itemsize, params["topology"], "direct",
                           chunks=1, perm=perm, api="jaxcc.ppermute")
  # The input, then the output, zeros where no pair sends; 16-bit floats placed as bits.
  bits = as_bits(x.reshape(-1))
  buf = lax.bitcast_convert_type(jnp.concatenate([bits, jnp.zeros_like(bits)]), x.dtype)
  got = as_bits(_common.run_native(buf, sched, params, native))[x.size:]
  stays = [s for s, d in perm if s == d]  # left out of the schedule: they keep their input
  if stays:
    got = jnp.where(jnp.isin(lax.axis_index(axis_name), jnp.asarray(stays)), bits, got)
  return lax.bitcast_convert_type(got, x.dtype).reshape(x.shape)


def _native_pays(params, native) -> bool:
  """Whether to run natively: when asked to, or with "auto" across processes on the CPU."""
  if params["executor"] != "auto":
    return params["executor"] == "native"
  if native is not True or params["group_axes"] is None:
    return False
  procs = native_executor.process_map(params["axis_name"], params["group_axes"])
  return procs is not None and len(procs) > 0


def _transpose(ct, x, *, perm, **params):
  if type(ct) is compat.Zero:
    return [compat.Zero(x.aval)]
  return [ppermute_p.bind(ct, perm=tuple((d, s) for s, d in perm), **params)]


def _batch(axis_data, vals_in, dims_in, **params):
  if axis_data.name == params["axis_name"]:
    raise NotImplementedError("jaxcc.ppermute over a vmapped axis; map it with jax.shard_map")
  (x,), (d,) = vals_in, dims_in
  return ppermute_p.bind(x, **params), d


ppermute_p = compat.Primitive("ppermute")
compat.register(ppermute_p, _abstract_eval, _run, _transpose, _batch)
