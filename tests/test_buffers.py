"""jaxcc._src.buffers: the native executor's block buffers, and the loops XLA:CPU writes them in."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxcc._src.bits import as_bits
from jaxcc._src.buffers import block_buffer

DTYPES = (jnp.float32, jnp.uint16, jnp.int32, jnp.int8)


def expected(x, index, blocks):
  out = np.zeros((blocks, x.size), x.dtype)
  out[index] = x
  return out.reshape(-1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, index, blocks", [(1, 0, 1), (7, 0, 2), (33, 1, 2), (5, 4, 5)])
def test_static_index_places_x_between_zeros(dtype, n, index, blocks):
  x = (np.random.default_rng(n).normal(size=n) * 100).astype(dtype)
  got = jax.jit(lambda v: block_buffer(v, index, blocks))(x)
  np.testing.assert_array_equal(as_bits(got), as_bits(jnp.asarray(expected(x, index, blocks))))


@pytest.mark.parametrize("p", [1, 2, 3, 8])
@pytest.mark.parametrize("dtype", DTYPES)
def test_traced_index_in_shard_map(p, dtype):
  mesh = jax.make_mesh((p,), ("x",), devices=jax.devices()[:p])
  n = 13
  x = (np.random.default_rng(p).normal(size=p * n) * 100).astype(dtype)
  fn = jax.jit(jax.shard_map(lambda v: block_buffer(v, lax.axis_index("x"), p), mesh=mesh,
                             in_specs=P("x"), out_specs=P("x")))
  got = np.asarray(fn(jax.device_put(x, NamedSharding(mesh, P("x")))))
  for r in range(p):
    np.testing.assert_array_equal(got[r * p * n:(r + 1) * p * n],
                                  expected(x[r * n:(r + 1) * n], r, p))


@pytest.mark.parametrize("traced", [False, True])
def test_compiles_to_copies_not_a_masked_loop(traced):
  x = jnp.ones((1000,), jnp.float32)
  if traced:
    hlo = jax.jit(lambda v, i: block_buffer(v, i, 3)).lower(x, jnp.int32(1)).compile().as_text()
  else:
    hlo = jax.jit(lambda v: block_buffer(v, 0, 3)).lower(x).compile().as_text()
  assert " pad(" not in hlo and " dynamic-update-slice(" not in hlo, hlo
