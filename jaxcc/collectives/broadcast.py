"""broadcast: every rank gets the root's array."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxcc._src import compat
from jaxcc.collectives import _common
from jaxcc.collectives.all_reduce import all_reduce_p
from jaxcc.topology import Topology


def broadcast(x: jax.Array, axis_name: str, *, root: int = 0, algorithm: str = "auto",
              executor: str = "auto", topology: Topology | None = None, codec=None) -> jax.Array:
  """Every rank of ``axis_name`` gets rank ``root``'s ``x`` (bit for bit).

  Bytes sent per rank (N = ``x.nbytes``): "ring" (a pipelined chain) sends N
  from every rank but the last in ``chunks + p - 2`` steps; "direct" sends
  ``(p-1) N`` from the root in one step; "lax" is XLA's all-gather (``(p-1) N``
  per rank). With a codec N is the encoded size: the array travels encoded
  (about 0.67 of raw for bf16 weights with "entropy" on the native executor).
  The result does not vary along the axis; its transpose sums the cotangent
  onto the root (with the same codec).

  Args:
    x: this rank's array (only the root's matters).
    axis_name: the mesh axis.
    root: the source rank.
    algorithm: "auto", "lax", "ring" or "direct".
    executor: "auto", "xla" or "native".
    topology: the network of the axis' ranks; uniform ports if None.
    codec: None, "fixed" or "entropy" (bf16, f16 and f32 only; not with
      "lax"): lossless compression of every piece on the wire; the result is
      the one ``codec=None`` gives, bit for bit. See ``jaxcc.all_reduce``.
  """
  size, topology = _common.resolve("jaxcc.broadcast", "broadcast", axis_name, algorithm,
                                   executor, topology, codec)
  if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < size:
    raise ValueError(f"jaxcc.broadcast: root must be a rank in [0, {size}), got {root!r}")
  x = jnp.asarray(x)
  _common.check_codec("jaxcc.broadcast", codec, x.dtype)
  x = compat.make_varying(x, axis_name)
  return broadcast_p.bind(x, axis_name=axis_name, axis_size=size, algorithm=algorithm,
                          executor=executor, topology=topology, codec=codec, root=root,
                          invariant_out=compat.check_vma(), **_common.native_params(axis_name))


def _abstract_eval(x, *, axis_name, invariant_out, **_):
  out = x
  if invariant_out:
    out = compat.with_varying_axes(x, compat.varying_axes(x) - {axis_name})
  return out, {compat.NamedAxisEffect(axis_name)}


def _run(x, *, root, native, **params):
  if params["algorithm"] == "lax":
    return lax.all_gather(x, params["axis_name"])[root]
  sched = _common.schedule("broadcast", x.size, x.dtype, params, root=root)
  return _common.execute(x.reshape(-1), sched, params, native).reshape(x.shape)


def _transpose(ct, x, *, axis_name, root, invariant_out, **params):
  if type(ct) is compat.Zero:
    return [compat.Zero(x.aval)]
  if invariant_out:  # ct is the whole cotangent, the same on every rank
    total = jax.lax.pcast(ct, axis_name, to="varying")
  else:  # each rank holds the cotangent of its own copy
    total = all_reduce_p.bind(ct, axis_name=axis_name, invariant_out=False, **params)
  return [jnp.where(lax.axis_index(axis_name) == root, total, jnp.zeros_like(total))]


def _batch(axis_data, vals_in, dims_in, **params):
  if axis_data.name == params["axis_name"]:
    raise NotImplementedError("jaxcc.broadcast over a vmapped axis; map it with jax.shard_map")
  (x,), (d,) = vals_in, dims_in
  return broadcast_p.bind(x, **params), d


broadcast_p = compat.Primitive("broadcast")
compat.register(broadcast_p, _abstract_eval, _run, _transpose, _batch)
