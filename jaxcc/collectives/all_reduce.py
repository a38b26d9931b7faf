"""all_reduce: the sum over a mesh axis, a drop-in for ``lax.psum``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxcc._src import compat
from jaxcc.collectives import _common
from jaxcc.topology import Topology


def all_reduce(x: jax.Array, axis_name: str, *, algorithm: str = "auto", executor: str = "auto",
               topology: Topology | None = None, codec=None) -> jax.Array:
  """Sum ``x`` over the ranks of ``axis_name``; every rank gets the sum.

  Equal to ``lax.psum(x, axis_name)``: bit for bit for integers, up to
  reassociation for floats, identical from run to run. Call it inside
  ``jax.shard_map``; it is differentiable (the transpose is as for psum) and
  vmappable over other axes. bool is summed as int32, as psum does.

  Bytes sent per rank (N = ``x.nbytes``, p ranks): ``2(p-1)/p N`` for "ring"
  (``2(p-1)`` steps per chunk) and "direct" (2 steps per chunk);
  ``N + (p-2) w_i`` for "optcc", with shares ``w_i`` from the topology.
  With a codec every piece travels encoded, so N counts encoded bytes: each
  hop decodes, adds and re-encodes (a sum cannot be added compressed).

  Args:
    x: this rank's array.
    axis_name: the mesh axis to sum over.
    algorithm: "auto" (cheapest simulated schedule for ``topology``), "lax"
      (XLA's own all-reduce), "ring", "direct", "optcc" or "r2ccl".
    executor: "auto", "xla" (schedules run on XLA collectives) or "native".
    topology: the network of the axis' ranks; uniform ports if None.
    codec: None, "fixed" or "entropy" (bf16, f16 and f32 only; not with
      "lax"): lossless compression of every piece on the wire, so the sum is
      the one ``codec=None`` gives, bit for bit. "entropy" sends the real
      encoded size (about 0.67 of raw bf16 weights) with the native executor;
      the XLA executor moves static sizes: "fixed" about 0.77 of raw bf16,
      "entropy" raw plus headers (see ``jaxcc.codec``).

  Returns:
    The sum, with ``x``'s shape and dtype.
  """
  size, topology = _common.resolve("jaxcc.all_reduce", "all_reduce", axis_name, algorithm,
                                   executor, topology, codec)
  x = jnp.asarray(x)
  if x.dtype == jnp.bool_:
    x = x.astype(jnp.int32)
  _common.check_reducible("jaxcc.all_reduce", x.dtype)
  _common.check_codec("jaxcc.all_reduce", codec, x.dtype)
  x = compat.make_varying(x, axis_name)  # an invariant x sums to p * x, as with psum
  return all_reduce_p.bind(x, axis_name=axis_name, axis_size=size, algorithm=algorithm,
                           executor=executor, topology=topology, codec=codec,
                           invariant_out=compat.check_vma(), **_common.native_params(axis_name))


def _abstract_eval(x, *, axis_name, invariant_out, **_):
  out = x
  if invariant_out:
    out = compat.with_varying_axes(x, compat.varying_axes(x) - {axis_name})
  return out, {compat.NamedAxisEffect(axis_name)}


def _run(x, *, native, **params):
  axis_name = params["axis_name"]
  if params["algorithm"] == "lax":
    return lax.psum(x, axis_name)
  sched = _common.schedule("all_reduce", x.size, x.dtype, params)
  return _common.execute(x.reshape(-1), sched, params, native).reshape(x.shape)


def _transpose(ct, x, **params):
  if type(ct) is compat.Zero:
    return [compat.Zero(x.aval)]
  if params["invariant_out"]:
    return [jax.lax.pcast(ct, params["axis_name"], to="varying")]
  return [all_reduce_p.bind(ct, **params)]


def _batch(axis_data, vals_in, dims_in, **params):
  if axis_data.name == params["axis_name"]:
    raise NotImplementedError("jaxcc.all_reduce over a vmapped axis; map it with jax.shard_map")
  (x,), (d,) = vals_in, dims_in
  return all_reduce_p.bind(x, **params), d


all_reduce_p = compat.Primitive("all_reduce")
compat.register(all_reduce_p, _abstract_eval, _run, _transpose, _batch)
