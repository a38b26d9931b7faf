"""The flat buffers the schedule engines run on, built so that XLA:CPU writes them in plain loops.

A buffer of ``blocks`` blocks that holds this rank's data in one block and
zeros in the others (``ppermute``: input then output; ``all_gather``: the
rank's block of the result) is a concatenation, one operand per block:
XLA:CPU copies each operand of a concatenation in its own loop. The other
spellings of the same buffer, a concatenation with a zero literal (which XLA
rewrites into a ``pad``) or a ``dynamic_update_slice`` into zeros, become one
loop over the whole buffer that reads the data with masked vector loads; with
16 MiB per rank across 4 processes that loop costs about 10x the copies.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def block_buffer(x: jax.Array, index, blocks: int) -> jax.Array:
  """The flat buffer of ``blocks`` blocks of ``x.size`` elements: ``x`` at block ``index``, else 0.

  Args:
    x: the data, flat.
    index: the block ``x`` goes to: an int, or a traced int32 scalar.
    blocks: the number of blocks.
  """
  if isinstance(index, int):
    # The barrier keeps XLA from folding the zero blocks into a pad of x.
    zeros = lax.optimization_barrier(jnp.zeros_like(x))
    return jnp.concatenate([x if b == index else zeros for b in range(blocks)])
  zero = jnp.zeros((), x.dtype)
  return jnp.concatenate([jnp.where(index == b, x, zero) for b in range(blocks)])
