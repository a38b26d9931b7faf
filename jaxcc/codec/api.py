"""Lossless codecs for bf16, f16 and f32 arrays, as JAX functions.

``encode(x, codec)`` splits every element into its exponent and its
sign+mantissa bits and compresses block by block, in one FFI call (C++ on
CPU, CUDA on GPU); ``decode(encoded)`` inverts it bit for bit, NaN payloads,
infinities, -0.0 and subnormals included. Both read and write each byte once:
an encode reads ``x.nbytes`` and writes ``encoded.nbytes``; a decode does the
reverse. Neither moves data between devices.

Codecs (formats in ``xla_ffi/include/jaxcc/codec.h``):

* ``"fixed"``: 4-bit exponent codes against a per-256-element base, a code for
  zero, escapes and raw-exponent blocks in a spill area. Its size is
  :func:`fixed_nbytes` (about 0.77 of raw bf16, 0.885 of raw f32) whenever
  the escapes fit the spill pool, which they do for real weights, gradients
  and activations, so it can travel through XLA's static-shape collectives as
  ``payload[:fixed_nbytes(...)]``. Other inputs (random bits, many NaNs)
  spill further and are still exact; ``encoded.nbytes`` then exceeds
  :func:`fixed_nbytes`, never the raw size plus 2 bytes per block.
* ``"entropy"``: Huffman-coded byte planes per 65536-element block (about
  0.665 of raw bf16 for weights), a zero bitmap for sparse blocks (a
  97%-zero tensor: about 0.03), raw blocks for incompressible data. Variable
  size: for transports that move ``nbytes`` bytes, not a static buffer.
* ``"auto"``: ``"entropy"`` for bf16/f16/f32 and ``"raw"`` (the bytes as
  they are) for any other dtype.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxcc._src import config, ffi
from jaxcc.codec import reference

# The names encode and max_nbytes take ("raw" too, which Encoded.codec may hold).
CODECS = ("fixed", "entropy", "auto")
# The dtypes the codecs compress: those of reference.DTYPE_IDS (the native module's
# codec_dtype_ids(), checked when it loads).
CODEC_DTYPES = tuple(jnp.dtype(name) for name in reference.DTYPE_IDS)
SUPPORTED_DTYPES = CODEC_DTYPES  # the public name of CODEC_DTYPES


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class Encoded:
  """An encoded array: a pytree whose leaves are ``payload`` and ``nbytes``.

  Attributes:
    payload: uint8[max_nbytes(shape, dtype, codec)], the encoding in its first
      ``nbytes`` bytes (header included); the bytes after it are unspecified.
    nbytes: int32 scalar, traced: the real size of the encoding in bytes,
      header included (for ``"raw"``, the array's size).
    shape: the original shape (static).
    dtype: the original dtype (static).
    codec: ``"fixed"``, ``"entropy"`` or ``"raw"`` (static).
  """

  payload: jax.Array
  nbytes: jax.Array
  shape: tuple[int, ...]
  dtype: np.dtype
  codec: str

  def tree_flatten(self):
    return (self.payload, self.nbytes), (self.shape, self.dtype, self.codec)

  @classmethod
  def tree_unflatten(cls, aux, children):
    return cls(*children, *aux)


def max_nbytes(shape, dtype, codec: str) -> int:
  """The static capacity of an encoding: every input of this shape fits.

  Args:
    shape: the array's shape.
    dtype: its dtype.
    codec: ``"fixed"``, ``"entropy"``, ``"auto"`` or ``"raw"``.

  Returns:
    Bytes: raw size + 32-byte header + 2 bytes per 256 elements (``"fixed"``)
    or + 5 bytes per 65536 elements (``"entropy"``); the raw size for
    ``"raw"``.
  """
  codec = _resolve(codec, np.dtype(dtype), "max_nbytes")
  n = math.prod(shape)
  if codec == "raw":
    return n * np.dtype(dtype).itemsize
  return reference.max_nbytes(n, np.dtype(dtype).name, codec)


def fixed_nbytes(shape, dtype) -> int:
  """The static size of ``"fixed"`` encodings whose escapes fit the spill pool.

  ``32 + N/128 + N/2 + N * (sign+mantissa bytes) + ceil(N/32)`` bytes for N
  elements. ``encode(x, "fixed").nbytes == fixed_nbytes(x.shape, x.dtype)``
  for typical data (escape rates under 1.5%); a collective that moves
  ``payload[:fixed_nbytes]`` must check that on every rank (else send raw).
  """
  _resolve("fixed", np.dtype(dtype), "fixed_nbytes")
  return reference.fixed_nbytes(math.prod(shape), np.dtype(dtype).name)


def encode(x, codec: str = "entropy") -> Encoded:
  """Encodes ``x`` losslessly; ``decode`` gives back its exact bits.

  Reads ``x.nbytes`` and writes ``nbytes`` bytes, in one pass per block on the
  device that holds ``x``. ``JAXCC_USE_FFI=0`` runs the numpy twin instead
  (through ``jax.pure_callback``; same bytes).

  Args:
    x: an array; bf16, f16 or f32 for ``"fixed"`` and ``"entropy"``, any
      dtype for ``"auto"``.
    codec: ``"fixed"``, ``"entropy"`` or ``"auto"``.

  Returns:
    An :class:`Encoded` with a static capacity of :func:`max_nbytes` bytes.

  Raises:
    TypeError: the dtype is not bf16/f16/f32 and ``codec`` is not ``"auto"``.
    ValueError: an unknown codec.
  """
  x = jnp.asarray(x)
  codec = _resolve(codec, x.dtype, "encode")
  shape, dtype = tuple(x.shape), np.dtype(x.dtype)
  if codec == "raw":
    flat = x.reshape(-1)
    if jnp.issubdtype(dtype, jnp.complexfloating):
      flat = jnp.stack([flat.real, flat.imag], axis=-1)
    if dtype == np.bool_:
      flat = flat.astype(jnp.uint8)
    payload = jax.lax.bitcast_convert_type(flat, jnp.uint8).reshape(-1)
    return Encoded(payload, jnp.int32(payload.size), shape, dtype, codec)
  cap = max_nbytes(shape, dtype, codec)
  if cap >= 2**31:
    raise ValueError(f"jaxcc.codec.encode: {shape} {dtype.name} may need {cap} bytes; "
                     f"encodings are limited to 2^31 - 1 bytes, encode it in parts")
  flat = x.reshape(-1)
  results = (_aval((cap,), jnp.uint8, flat), _aval((), jnp.int32, flat))
  if config.USE_FFI:
    ffi.load()
    payload, nbytes = jax.ffi.ffi_call(f"jaxcc_codec_encode_{codec}", results,
                                       vmap_method="sequential")(flat)
  else:
    payload, nbytes = jax.pure_callback(
        lambda a: _encode_host(a, codec, cap), results, flat, vmap_method="sequential")
  return Encoded(payload, nbytes, shape, dtype, codec)


def decode(encoded: Encoded) -> jax.Array:
  """Decodes an :class:`Encoded` back to the exact array that was encoded.

  Reads ``nbytes`` bytes and writes the array once. The header (magic, codec,
  dtype, element count, size) and the checksum are checked first; corrupted
  or truncated bytes raise an error that names the problem (under ``jit``, a
  ``JaxRuntimeError``), never return wrong values.

  Args:
    encoded: the result of :func:`encode` (the payload may have been moved,
      sliced to at least ``nbytes`` bytes, or padded).

  Returns:
    An array of ``encoded.shape`` and ``encoded.dtype``.
  """
  if not isinstance(encoded, Encoded):
    raise TypeError(f"jaxcc.codec.decode: expected a jaxcc.codec.Encoded, got "
                    f"{type(encoded).__name__}")
  shape, dtype, codec = encoded.shape, np.dtype(encoded.dtype), encoded.codec
  payload = jnp.asarray(encoded.payload)
  if payload.dtype != jnp.uint8 or payload.ndim != 1:
    raise TypeError(f"jaxcc.codec.decode: payload must be a 1-D uint8 array, got "
                    f"{payload.dtype}{list(payload.shape)}")
  if codec == "raw":
    return _decode_raw(payload, shape, dtype)
  n = math.prod(shape)
  nbytes = jnp.asarray(encoded.nbytes, jnp.int32)
  result = _aval((n,), dtype, payload)
  if config.USE_FFI:
    ffi.load()
    flat = jax.ffi.ffi_call(f"jaxcc_codec_decode_{codec}", result,
                            vmap_method="sequential")(payload, nbytes)
  else:
    flat = jax.pure_callback(lambda p, k: _decode_host(p, k, (n,), dtype, codec), result,
                             payload, nbytes, vmap_method="sequential")
  return flat.reshape(shape)


def _resolve(codec, dtype: np.dtype, api_name: str) -> str:
  if codec == "raw":
    return codec
  if codec not in CODECS:
    raise ValueError(f"jaxcc.codec.{api_name}: unknown codec {codec!r}; use one of {CODECS}")
  if dtype in CODEC_DTYPES:
    return "entropy" if codec == "auto" else codec
  if codec == "auto":
    return "raw"
  raise TypeError(
      f"jaxcc.codec.{api_name}: codec {codec!r} cannot take {dtype.name} (it compresses "
      f"bfloat16, float16 and float32 only); cast the array, or pass codec='auto' to send "
      f"other dtypes raw")


def _aval(shape, dtype, like):
  """An output type of ``shape``/``dtype``, replicated, on ``like``'s mesh and manual axes."""
  aval = jax.typeof(like)
  spec = jax.sharding.PartitionSpec(*([None] * len(shape)))
  return aval.update(shape=tuple(shape), dtype=np.dtype(dtype),
                     sharding=aval.sharding.update(spec=spec))


def _decode_raw(payload, shape, dtype):
  n = math.prod(shape)
  if jnp.issubdtype(dtype, jnp.complexfloating):
    part = np.dtype(np.float32 if dtype == np.complex64 else np.float64)
    pairs = jax.lax.bitcast_convert_type(payload[:2 * n * part.itemsize].reshape(
        2 * n, part.itemsize), part).reshape(n, 2)
    return jax.lax.complex(pairs[:, 0], pairs[:, 1]).reshape(shape)
  if dtype == np.bool_:
    return payload[:n].astype(jnp.bool_).reshape(shape)
  if dtype.itemsize == 1:
    return jax.lax.bitcast_convert_type(payload[:n], dtype).reshape(shape)
  words = payload[:n * dtype.itemsize].reshape(n, dtype.itemsize)
  return jax.lax.bitcast_convert_type(words, dtype).reshape(shape)


def _encode_host(x, codec: str, cap: int):
  data = reference.encode(np.asarray(x), codec)
  payload = np.zeros(cap, np.uint8)
  payload[:data.size] = data
  return payload, np.int32(data.size)


def _decode_host(payload, nbytes, shape, dtype, codec: str):
  return reference.decode(np.asarray(payload), int(nbytes), shape, dtype, codec)
