"""Moving 16-bit floats through XLA:CPU unchanged.

XLA:CPU computes bf16 and f16 data movement (copies, transposes, selects,
dynamic slices in fusions) through f32, which quiets signalling NaNs, drops
NaN payload bits and flushes subnormals. So jaxcc moves 16-bit floats as
uint16 and bitcasts them back where the values are needed. Other dtypes
(f32 and f64 included) move as they are: the extra bitcast kernels would cost
time for nothing.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

_CONVERTED = (np.dtype(jnp.bfloat16), np.dtype(jnp.float16))


def word_of(dtype) -> np.dtype:
  """The dtype values of ``dtype`` move as: uint16 for bf16 and f16, else ``dtype`` itself."""
  dtype = np.dtype(dtype)
  return np.dtype(np.uint16) if dtype in _CONVERTED else dtype


def as_bits(x: jax.Array) -> jax.Array:
  """``x`` as ``word_of(x.dtype)`` (a bitcast; the identity for other dtypes)."""
  word = word_of(x.dtype)
  return x if word == x.dtype else lax.bitcast_convert_type(x, word)
