"""ppermute: send each rank's array to another rank; a drop-in for ``lax.ppermute``."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxcc._src import compat, encoded_ppermute
from jaxcc.collectives import _common


def ppermute(x: jax.Array, axis_name: str, perm, *, executor: str = "auto",
             codec=None) -> jax.Array:
  """Rank ``src`` sends ``x`` to rank ``dst`` for each pair of ``perm``.

  Equal to ``lax.ppermute``: a rank that receives nothing gets zeros.
  Bytes sent per rank: ``x.nbytes`` if it is a source, in one step; with a
  codec the encoded size instead (XLA moves static sizes: "fixed" about 0.77
  of raw bf16, "entropy" raw plus headers). Its transpose is the inverse
  permutation (with the same codec).

  Args:
    x: this rank's array.
    axis_name: the mesh axis.
    perm: pairs ``(src, dst)``; each rank at most once as a source and once as
      a destination.
    executor: "auto", "xla" or "native".
    codec: None, "fixed" or "entropy" (bf16, f16 and f32 only): lossless
      compression on the wire; the result is the one ``codec=None`` gives,
      bit for bit.
  """
  size = _common.check_axis("jaxcc.ppermute", axis_name, executor, codec)
  if executor == "native":
    raise NotImplementedError("jaxcc.ppermute: the native executor does not run ppermute yet; "
                              "use executor='auto' or 'xla'")
  perm = _check_perm(perm, size)
  x = jnp.asarray(x)
  _common.check_codec("jaxcc.ppermute", codec, x.dtype)
  x = compat.make_varying(x, axis_name)
  return ppermute_p.bind(x, axis_name=axis_name, axis_size=size, perm=perm, executor=executor,
                         codec=codec, **_common.native_params(axis_name))


def _check_perm(perm, size: int) -> tuple[tuple[int, int], ...]:
  try:
    pairs = tuple((int(s), int(d)) for s, d in perm)
  except (TypeError, ValueError):
    raise ValueError(f"jaxcc.ppermute: perm must be a sequence of (src, dst) pairs, "
                     f"got {perm!r}") from None
  srcs, dsts = [s for s, _ in pairs], [d for _, d in pairs]
  for r in srcs + dsts:
    if not 0 <= r < size:
      raise ValueError(f"jaxcc.ppermute: rank {r} in perm is outside the axis of size {size}")
  if len(set(srcs)) != len(srcs) or len(set(dsts)) != len(dsts):
    raise ValueError(f"jaxcc.ppermute: perm {pairs} names a rank twice as source or as "
                     f"destination")
  return pairs


def _abstract_eval(x, *, axis_name, **_):
  return x, {compat.NamedAxisEffect(axis_name)}


def _run(x, *, axis_name, perm, codec, **_):
  return encoded_ppermute.ppermute([x], axis_name, [perm], codec)[0]


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
