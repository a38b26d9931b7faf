"""``lax.ppermute`` of encoded bytes: how ``codec=`` travels over XLA's collectives.

Each array is encoded (``jaxcc.codec.encode``) before its ``lax.ppermute``
and decoded after, so every rank gets the exact bits ``lax.ppermute`` would
give it (zeros where it receives nothing). Unencoded 16-bit floats move as
their bits (``jaxcc._src.bits``). XLA moves
one static size per call: "fixed" moves its static size, which is below raw
for pieces of more than about 100 elements; "entropy" moves its worst case
(raw plus headers), so only the native executor, which sends the real size,
saves bytes with it.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax

from jaxcc import codec as codec_lib
from jaxcc._src import compat
from jaxcc._src.bits import as_bits

_SIZE_BYTES = 4  # the encoding's int32 size travels after its payload


def ppermute(xs: list[jax.Array], axis_name, perms: list, codec: str | None) -> list:
  """Move each ``xs[i]`` along ``perms[i]`` (ranks numbered as ``lax.axis_index`` does) as
  ``lax.ppermute`` does, encoded on the wire.

  Bytes sent by a source, per array of N bytes, in one ``lax.ppermute`` step:
  N with ``codec=None``; ``max_nbytes + 4`` (N + 37 and up) with "entropy";
  ``fixed_nbytes + 4`` (about 0.77 N for bf16, 0.9 N for f32) with "fixed"
  when every rank's encoding fits it, else N raw, decided for all the arrays
  together by one ``lax.pmax`` of a flag over the axis; N raw when
  ``fixed_nbytes + 4`` is not below N.

  Args:
    xs: this rank's arrays (bf16, f16 or f32 when ``codec`` is set).
    axis_name: the axis of the permutations.
    perms: one tuple of ``(src, dst)`` pairs per array.
    codec: None, "fixed" or "entropy".

  Returns:
    The received arrays, in the order of ``xs``.
  """
  rank = lax.axis_index(axis_name)
  if codec == "entropy":
    encs = [codec_lib.encode(x, codec) for x in xs]
    return [_move(enc, enc.payload.size, axis_name, perm, rank) for enc, perm in zip(encs, perms)]
  out = list(xs)
  shrunk = []
  for i, (x, perm) in enumerate(zip(xs, perms)):
    if codec == "fixed" and _fixed_size(x) + _SIZE_BYTES < x.nbytes:
      shrunk.append(i)
    else:
      out[i] = _move_raw(x, axis_name, perm)
  if not shrunk:
    return out
  encs = [codec_lib.encode(xs[i], "fixed") for i in shrunk]
  # Every rank's spill counts: one that receives nothing decodes its own truncated bytes.
  spills = [enc.nbytes > _fixed_size(xs[i]) for i, enc in zip(shrunk, encs)]
  spill = lax.pmax(jnp.any(jnp.stack(spills)).astype(jnp.int32), axis_name) > 0
  moved = lax.cond(
      spill,
      lambda: [_move_raw(xs[i], axis_name, perms[i]) for i in shrunk],
      lambda: [_move(enc, _fixed_size(xs[i]), axis_name, perms[i], rank)
               for i, enc in zip(shrunk, encs)])
  for i, y in zip(shrunk, moved):
    out[i] = y
  return out


def _move(enc: codec_lib.Encoded, length: int, axis_name: str, perm, rank) -> jax.Array:
  """``enc``'s first ``length`` payload bytes and its size, permuted, then decoded.

  A rank that receives nothing decodes its own bytes (any valid encoding)
  and returns zeros. 16-bit floats are selected as bits (``jaxcc._src.bits``).
  """
  size = lax.bitcast_convert_type(enc.nbytes, jnp.uint8)
  packed = jnp.concatenate([enc.payload[:length], size])
  receives = _is_rank_in(rank, [d for _, d in perm])
  got = jnp.where(receives, compat.ppermute(packed, axis_name, perm), packed)
  nbytes = lax.bitcast_convert_type(got[length:], jnp.int32)
  out = as_bits(codec_lib.decode(dataclasses.replace(enc, payload=got[:length], nbytes=nbytes)))
  return lax.bitcast_convert_type(jnp.where(receives, out, jnp.zeros_like(out)), enc.dtype)


def _move_raw(x: jax.Array, axis_name: str, perm) -> jax.Array:
  """``lax.ppermute`` of ``x`` (16-bit floats as their bits)."""
  return lax.bitcast_convert_type(compat.ppermute(as_bits(x), axis_name, perm), x.dtype)


def _fixed_size(x: jax.Array) -> int:
  return codec_lib.fixed_nbytes(x.shape, x.dtype)


def _is_rank_in(rank, ranks: list[int]) -> jax.Array:
  return jnp.any(rank == jnp.asarray(ranks, jnp.int32)) if ranks else jnp.bool_(False)
