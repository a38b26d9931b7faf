"""codec="auto": coded where the model says it pays, raw elsewhere, and the same bits either way."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxcc
from jaxcc import Topology

SLOW = Topology.uniform(8, 20e6 / 8)  # 20 Mbit/s ports
FAST = Topology.uniform(8, 25e9)


@pytest.mark.parametrize("dtype, topology, want", [
    (jnp.bfloat16, SLOW, "entropy"), (jnp.float16, SLOW, "entropy"), (jnp.float32, SLOW, "entropy"),
    (jnp.bfloat16, FAST, None), (jnp.float32, Topology.uniform(8, 1e9), None),
    (jnp.int32, SLOW, None)])
def test_auto_codes_where_the_link_is_the_limit(dtype, topology, want):
  got, why = jaxcc.codec.auto_choice(dtype, topology)
  assert got == want, why


def test_a_cross_cluster_port_is_the_one_that_counts():
  clusters = Topology.clusters([4, 4], 25e9, 20e6 / 8)
  assert jaxcc.codec.auto_choice(jnp.bfloat16, clusters)[0] == "entropy"


def test_a_declared_ratio_decides():
  try:
    jaxcc.codec.declare_ratio(jnp.bfloat16, 0.99)
    assert jaxcc.codec.auto_choice(jnp.bfloat16, SLOW)[0] is None
  finally:
    jaxcc.codec.declare_ratio(jnp.bfloat16, None)
  assert jaxcc.codec.auto_choice(jnp.bfloat16, SLOW)[0] == "entropy"
  with pytest.raises(ValueError, match="the codecs take"):
    jaxcc.codec.declare_ratio(jnp.int32, 0.5)
  with pytest.raises(ValueError, match="ratio must be in"):
    jaxcc.codec.declare_ratio(jnp.float32, 0.0)


@pytest.mark.parametrize("topology", [SLOW, FAST])
def test_collectives_with_auto_equal_lax_on_mixed_dtypes(topology):
  mesh = jax.make_mesh((8,), ("x",))
  rng = np.random.default_rng()
  tree = {"w": jnp.asarray(rng.normal(size=(8, 1001)), jnp.bfloat16),
          "f": jnp.asarray(rng.normal(size=(8, 37)), jnp.float32),
          "i": jnp.asarray(rng.integers(-9, 9, (8, 5)), jnp.int32)}
  tree = jax.device_put(tree, NamedSharding(mesh, P("x")))

  def body(t):
    return (jaxcc.all_reduce(t, "x", topology=topology, codec="auto"),
            jaxcc.all_gather(t, "x", topology=topology, codec="auto", tiled=True),
            jaxcc.ppermute(t, "x", [(i, (i + 1) % 8) for i in range(8)], codec="auto"),
            jaxcc.broadcast(t, "x", root=3, topology=topology, codec="auto"))

  def twin(t):
    return (jax.lax.psum(t, "x"), jax.lax.all_gather(t, "x", tiled=True),
            jax.lax.ppermute(t, "x", [(i, (i + 1) % 8) for i in range(8)]),
            jax.tree.map(lambda v: jax.lax.all_gather(v, "x")[3], t))

  def run(f):
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P("x")))(tree)

  for got, want in zip(jax.tree.leaves(run(body)), jax.tree.leaves(run(twin))):
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                               rtol=2e-2, atol=1e-5)
