"""Smoke test of an installed jaxcc, run outside the checkout: the native ring all_reduce == psum.

On 8 virtual CPU devices; prints jaxcc's version and location and jax's version.
"""

import importlib.metadata
import os

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxcc  # noqa: E402

mesh = jax.make_mesh((8,), ("x",))
x = jax.device_put(jnp.arange(8 * 4096, dtype=jnp.float32).reshape(8, 4096) / 7,
                   NamedSharding(mesh, P("x")))
ring = jax.jit(jax.shard_map(lambda v: jaxcc.all_reduce(v, "x", algorithm="ring",
                                                        executor="native"),
                             mesh=mesh, in_specs=P("x"), out_specs=P("x")))
psum = jax.jit(jax.shard_map(lambda v: lax.psum(v, "x"), mesh=mesh, in_specs=P("x"),
                             out_specs=P("x")))
assert "custom_call @jaxcc_collective" in ring.lower(x).as_text()  # the native module runs it
np.testing.assert_allclose(np.asarray(ring(x)), np.asarray(psum(x)), rtol=1e-6)
assert importlib.metadata.version("jaxcc") == jaxcc.__version__
print(f"jaxcc {jaxcc.__version__} at {jaxcc.__file__}, jax {jax.__version__}: "
      f"all_reduce ring native == lax.psum on {jax.device_count()} devices")
