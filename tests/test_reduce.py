"""jaxcc_reduce (the FFI op behind reduce_sum) against its pure-JAX twin, bit for bit.

Inputs are fresh random numbers on every run, mixed with special values (NaN
payloads, infinities, -0.0, subnormals, values whose sum overflows); the seed
is in every failure message.
"""

import functools
import itertools
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import bitwise
from bitwise import SPECIAL_BITS, bits, uint_of
from jaxcc._src import config, ffi
from jaxcc._src.reduce import reduce, reduce_reference, reduce_sum, reduce_sum_reference

FLOATS = ("float32", "bfloat16", "float16")
INTS = ("int32", "uint8", "int8", "uint32")
SHAPES = ((1,), (7,), (1023,), (4097,), (3, 5, 7))
SEED = np.random.SeedSequence().entropy  # fresh inputs every run; printed on failure


def assert_same_bits(test, actual, expected, msg=""):
  bitwise.assert_same_bits(test, actual, expected, f"{msg}, seed={SEED}")

# Bit patterns of special values, per float dtype: quiet and signalling NaNs
# with payloads and both signs, +-inf, +-0, subnormals, the smallest normal,
# the largest finite values, and values near 1.




def random_array(rng, shape, dtype, special_fraction=0.1):
  """Random values of all magnitudes, plus special values at random places."""
  dtype = np.dtype(jnp.dtype(dtype))
  if np.issubdtype(dtype, np.integer):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
  x = rng.standard_normal(shape) * 10.0 ** rng.uniform(-4, 4, size=shape)
  x = x.astype(np.float32).astype(dtype)
  special = np.array(SPECIAL_BITS[dtype.name], dtype=uint_of(dtype)).view(dtype)
  where = rng.random(shape) < special_fraction
  x[where] = rng.choice(special, size=int(where.sum()))
  return x


def random_inputs(k, shape, dtype, salt=0):
  rng = np.random.default_rng([SEED, salt])
  return [jnp.asarray(random_array(rng, shape, dtype)) for _ in range(k)]



ffi_sum = jax.jit(lambda *xs: reduce_sum(list(xs)))
twin_sum = jax.jit(lambda *xs: reduce_sum_reference(list(xs)))


class ReduceSumTest(parameterized.TestCase):

  @parameterized.product(dtype=FLOATS + INTS, k=tuple(range(1, 10)))
  def test_matches_twin_bit_for_bit(self, dtype, k):
    for salt, shape in enumerate(SHAPES):
      xs = random_inputs(k, shape, dtype, salt)
      assert_same_bits(self, ffi_sum(*xs), twin_sum(*xs), f"{dtype} k={k} shape={shape}")

  @parameterized.parameters("bfloat16", "float16")
  def test_every_16_bit_pattern(self, dtype):
    # All 2^16 values against shuffled copies of themselves: every special
    # value meets every other (NaN + NaN, inf - inf, subnormal + subnormal...).
    rng = np.random.default_rng([SEED, 1])
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(jnp.dtype(dtype))
    xs = [jnp.asarray(every), jnp.asarray(rng.permutation(every)),
          jnp.asarray(rng.permutation(every))]
    for k in (2, 3):
      assert_same_bits(self, ffi_sum(*xs[:k]), twin_sum(*xs[:k]), f"{dtype} k={k}")

  @parameterized.parameters(*FLOATS)
  def test_special_value_pairs(self, dtype):
    # Every ordered pair of special values, then the same plus a third.
    special = np.array(SPECIAL_BITS[dtype], dtype=uint_of(dtype)).view(jnp.dtype(dtype))
    a, b = (jnp.asarray(v) for v in zip(*itertools.product(special, repeat=2)))
    assert_same_bits(self, ffi_sum(a, b), twin_sum(a, b), dtype)
    assert_same_bits(self, ffi_sum(a, b, a[::-1]), twin_sum(a, b, a[::-1]), dtype)

  def test_one_rounding_at_the_end(self):
    # 1 + 2^-8 is a tie in bf16 (rounds to 1); adding 2^-9 to that gives 1 again.
    # Accumulated in f32 and rounded once: 1 + 2^-8 + 2^-9 -> 1 + 2^-7.
    xs = [jnp.asarray([v], jnp.bfloat16) for v in (1.0, 2.0**-8, 2.0**-9)]
    pairwise = (np.asarray(xs[0]) + np.asarray(xs[1])) + np.asarray(xs[2])  # rounds per add
    self.assertEqual(float(pairwise[0]), 1.0)
    self.assertEqual(float(ffi_sum(*xs)[0]), 1.0 + 2.0**-7)
    self.assertEqual(float(reduce_sum(xs)[0]), 1.0 + 2.0**-7)
    # The same for f16 (10 fraction bits).
    xs = [jnp.asarray([v], jnp.float16) for v in (1.0, 2.0**-11, 2.0**-12)]
    self.assertEqual(float(ffi_sum(*xs)[0]), 1.0 + 2.0**-10)

  def test_order_is_the_given_order(self):
    # (big + -big) + 1 = 1, but (big + 1) + -big = 0 in f32.
    big, one = jnp.asarray([2.0**30], jnp.float32), jnp.asarray([1.0], jnp.float32)
    self.assertEqual(float(reduce_sum([big, -big, one])[0]), 1.0)
    self.assertEqual(float(reduce_sum([big, one, -big])[0]), 0.0)

  @parameterized.parameters(*INTS)
  def test_integers_wrap_like_numpy(self, dtype):
    rng = np.random.default_rng([SEED, 2])
    xs = [random_array(rng, (1023,), dtype) for _ in range(5)]
    expected = functools.reduce(np.add, xs)  # numpy wraps too
    assert_same_bits(self, reduce_sum([jnp.asarray(x) for x in xs]), expected, dtype)
    info = np.iinfo(dtype)
    top = jnp.asarray([info.max], dtype)
    self.assertEqual(int(reduce_sum([top, jnp.ones(1, dtype)])[0]), info.min)

  def test_eager_equals_jit(self):
    xs = random_inputs(5, (3, 5, 7), "bfloat16", salt=3)
    assert_same_bits(self, reduce_sum(xs), ffi_sum(*xs))
    assert_same_bits(self, reduce_sum_reference(xs), ffi_sum(*xs))

  def test_single_input_is_a_copy(self):
    x = jnp.asarray(np.array([0x7F81, 0xFFA5, 0x0001], np.uint16).view(jnp.bfloat16))
    assert_same_bits(self, reduce_sum([x]), x)  # even signalling NaNs keep their bits
    assert_same_bits(self, reduce_sum_reference([x]), x)

  def test_empty_arrays(self):
    xs = [jnp.zeros((0, 3), jnp.float32)] * 3
    self.assertEqual(reduce_sum(xs).shape, (0, 3))

  def test_kill_switch(self):
    xs = random_inputs(3, (7,), "float32")
    with mock.patch.object(config, "USE_FFI", True):
      self.assertIn("ffi_call", str(jax.make_jaxpr(lambda *a: reduce_sum(list(a)))(*xs)))
    with mock.patch.object(config, "USE_FFI", False):
      jaxpr = str(jax.make_jaxpr(lambda *a: reduce_sum(list(a)))(*xs))
      self.assertNotIn("ffi_call", jaxpr)
      assert_same_bits(self, reduce_sum(xs), twin_sum(*xs))

  def test_config_flag_parsing(self):
    for value, expected in (("0", False), ("false", False), ("1", True), ("", True)):
      with mock.patch.dict("os.environ", {"JAXCC_TEST_FLAG": value}):
        self.assertEqual(config._env_flag("JAXCC_TEST_FLAG", True), expected)
    with mock.patch.dict("os.environ", {"JAXCC_TEST_FLAG": "maybe"}):
      with self.assertRaisesRegex(ValueError, "JAXCC_TEST_FLAG"):
        config._env_flag("JAXCC_TEST_FLAG", True)


class TransformationsTest(parameterized.TestCase):

  @parameterized.parameters("float32", "bfloat16")
  def test_grad(self, dtype):
    rng = np.random.default_rng([SEED, 4])
    a, b, x = (jnp.asarray(rng.standard_normal(1023).astype(np.float32), dtype) for _ in range(3))

    def loss(x, fn):
      return jnp.sum(fn([a * x, b * x]).astype(jnp.float32))

    g_ffi = jax.jit(jax.grad(functools.partial(loss, fn=reduce_sum)))(x)
    g_twin = jax.jit(jax.grad(functools.partial(loss, fn=reduce_sum_reference)))(x)
    assert_same_bits(self, g_ffi, g_twin, dtype)
    np.testing.assert_allclose(np.asarray(g_ffi, np.float32), np.asarray(a + b, np.float32),
                               rtol=1e-2)

  def test_jvp(self):
    xs = random_inputs(3, (7,), "float32", salt=5)
    ts = random_inputs(3, (7,), "float32", salt=6)
    y, t = jax.jvp(lambda *a: reduce_sum(list(a)), xs, ts)
    assert_same_bits(self, y, twin_sum(*xs))
    assert_same_bits(self, t, twin_sum(*ts))

  def test_integers_pass_through_autodiff(self):
    # Integer inputs carry no tangent; differentiating w.r.t. a float argument works.
    n = jnp.arange(4, dtype=jnp.int32)
    f = lambda x: jnp.sum(x * reduce_sum([n, n]).astype(jnp.float32))
    np.testing.assert_array_equal(jax.grad(f)(jnp.ones(4)), np.arange(4) * 2.0)

  @parameterized.parameters("float32", "bfloat16", "int32")
  def test_vmap(self, dtype):
    xs = random_inputs(3, (4, 33), dtype, salt=7)
    batched = jax.vmap(lambda a, b, c: reduce_sum([a, b, c]))(*xs)
    assert_same_bits(self, batched, twin_sum(*xs), dtype)
    # An unbatched input is broadcast against the batched ones.
    batched = jax.vmap(lambda a, b: reduce_sum([a, b]), in_axes=(0, None))(xs[0], xs[1][0])
    assert_same_bits(self, batched, twin_sum(xs[0], jnp.broadcast_to(xs[1][0], xs[0].shape)))

  @parameterized.parameters("float32", "bfloat16", "uint8")
  def test_shard_map(self, dtype):
    if jax.device_count() < 8:
      self.skipTest("needs 8 devices (tests/conftest.py sets 8 virtual CPU devices)")
    mesh = jax.make_mesh((8,), ("x",))
    sharding = NamedSharding(mesh, P("x"))
    xs = [jax.device_put(x, sharding) for x in random_inputs(4, (8 * 129,), dtype, salt=8)]

    def per_device(fn):
      return jax.jit(jax.shard_map(lambda *a: fn(list(a)), mesh=mesh, in_specs=P("x"),
                                   out_specs=P("x")))

    out = per_device(reduce_sum)(*xs)
    assert_same_bits(self, out, per_device(reduce_sum_reference)(*xs), dtype)
    assert_same_bits(self, out, twin_sum(*xs), dtype)
    hlo = per_device(reduce_sum).lower(*xs).as_text()
    self.assertNotIn("all-gather", hlo)  # each device sums its own shards

  def test_shard_map_mixed_varying_and_grad(self):
    if jax.device_count() < 8:
      self.skipTest("needs 8 devices (tests/conftest.py sets 8 virtual CPU devices)")
    mesh = jax.make_mesh((8,), ("x",))
    a = jax.device_put(random_inputs(1, (8 * 16,), "float32", salt=9)[0],
                       NamedSharding(mesh, P("x")))
    b = jax.device_put(random_inputs(1, (16,), "float32", salt=10)[0], NamedSharding(mesh, P()))

    def make(fn):
      body = lambda a, b: fn([a, b, a - b])  # b is the same on every device
      return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P()), out_specs=P("x")))

    assert_same_bits(self, make(reduce_sum)(a, b), make(reduce_sum_reference)(a, b))
    loss = lambda fn: jax.jit(jax.grad(lambda a, b: jnp.sum(make(fn)(a, b)), argnums=(0, 1)))
    with jax.set_mesh(mesh):
      ga = loss(reduce_sum)(a, b)
      gt = loss(reduce_sum_reference)(a, b)
    for g, t in zip(ga, gt):
      assert_same_bits(self, g, t)


class ReduceMaxMinTest(parameterized.TestCase):
  """op="max" / "min": XLA:CPU's all-reduce fold; the kernel, its twin and lax.pmax agree."""

  @parameterized.product(dtype=FLOATS + INTS, k=(1, 2, 3, 5, 9), op=("max", "min"))
  def test_matches_twin_bit_for_bit(self, dtype, k, op):
    ffi_op = jax.jit(lambda *xs: reduce(list(xs), op))
    twin_op = jax.jit(lambda *xs: reduce_reference(list(xs), op))
    for salt, shape in enumerate(SHAPES):
      xs = random_inputs(k, shape, dtype, salt)
      assert_same_bits(self, ffi_op(*xs), twin_op(*xs), f"{op} {dtype} k={k} shape={shape}")

  @parameterized.product(dtype=FLOATS, op=("max", "min"))
  def test_special_value_pairs_and_16_bit_patterns(self, dtype, op):
    special = np.array(SPECIAL_BITS[dtype], dtype=uint_of(dtype)).view(jnp.dtype(dtype))
    a, b = (jnp.asarray(v) for v in zip(*itertools.product(special, repeat=2)))
    rng = np.random.default_rng([SEED, 5])
    if dtype != "float32":
      every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(jnp.dtype(dtype))
      a = jnp.concatenate([a, jnp.asarray(every)])
      b = jnp.concatenate([b, jnp.asarray(rng.permutation(every))])
    for xs in ([a, b], [a, b, a[::-1]]):
      assert_same_bits(self, reduce(xs, op), reduce_reference(xs, op), f"{op} {dtype}")

  @parameterized.product(dtype=FLOATS + INTS, op=("max", "min"))
  def test_equals_lax_pmax_pmin_in_rank_order(self, dtype, op):
    n = 4
    mesh = jax.make_mesh((n,), ("x",), devices=jax.devices()[:n])
    rng = np.random.default_rng([SEED, 6])
    host = random_array(rng, (n, 257), dtype, special_fraction=0.3)
    if dtype in FLOATS:  # +-0 ties in both orders, all-NaN columns
      host[:, :3] = 0
      host[0, 0] = host[n - 1, 1] = np.array(-0.0, host.dtype)
      host[:, 2] = np.nan
    pop = jax.lax.pmax if op == "max" else jax.lax.pmin
    x = jax.device_put(host.reshape(-1), NamedSharding(mesh, P("x")))
    f = jax.jit(jax.shard_map(lambda v: pop(v, "x"), mesh=mesh, in_specs=P("x"),
                              out_specs=P("x"), check_vma=False))
    want = np.asarray(f(x)).reshape(n, -1)[0]
    assert_same_bits(self, reduce([jnp.asarray(r) for r in host], op), want, f"{op} {dtype}")

  def test_unknown_op(self):
    with self.assertRaisesRegex(ValueError, "reduce: op must be one of"):
      reduce([jnp.ones(3)], "prod")
    with self.assertRaisesRegex(ValueError, "reduce_reference: op must be one of"):
      reduce_reference([jnp.ones(3)], "mean")


class ErrorsTest(parameterized.TestCase):

  def test_no_inputs(self):
    with self.assertRaisesRegex(ValueError, "at least one input"):
      reduce_sum([])
    with self.assertRaisesRegex(ValueError, "at least one input"):
      reduce_sum_reference([])

  def test_not_a_sequence(self):
    with self.assertRaisesRegex(TypeError, "sequence"):
      reduce_sum(jnp.ones((2, 3)))

  def test_mismatched_shapes(self):
    with self.assertRaisesRegex(ValueError, r"inputs\[1\] has shape \(4,\)"):
      reduce_sum([jnp.ones(3), jnp.ones(4)])

  def test_mismatched_dtypes(self):
    with self.assertRaisesRegex(TypeError, r"inputs\[2\] has dtype bfloat16"):
      reduce_sum([jnp.ones(3), jnp.ones(3), jnp.ones(3, jnp.bfloat16)])

  @parameterized.parameters("bool", "complex64", "int16")
  def test_unsupported_dtype(self, dtype):
    with self.assertRaisesRegex(TypeError, f"unsupported dtype {dtype}"):
      reduce_sum([jnp.zeros(3, dtype)] * 2)

  def test_native_handler_checks(self):
    # The handler validates too, for callers that bypass reduce_sum.
    call = lambda dtype, *xs, op=0: jax.ffi.ffi_call(
        "jaxcc_reduce", jax.ShapeDtypeStruct((3,), dtype))(*xs, op=np.int64(op))
    with self.assertRaisesRegex(Exception, "needs at least one input"):
      call(jnp.float32)
    with self.assertRaisesRegex(Exception, "input 1 has dtype float16"):
      call(jnp.float32, jnp.ones(3), jnp.ones(3, jnp.float16))
    with self.assertRaisesRegex(Exception, "input 0 has a different shape"):
      call(jnp.float32, jnp.ones(4))
    with self.assertRaisesRegex(Exception, "unsupported dtype bool"):
      call(jnp.bool_, jnp.ones(3, bool), jnp.ones(3, bool))
    with self.assertRaisesRegex(Exception, "unknown reduction op 3"):
      call(jnp.float32, jnp.ones(3), op=3)


class NativeModuleTest(absltest.TestCase):

  def test_registrations_and_api_version(self):
    modules = [ffi._jaxcc_cpu] + ([ffi._jaxcc_cuda] if ffi.HAS_CUDA else [])
    runtime = ffi.runtime_ffi_api_version()
    for module in modules:
      self.assertIn("jaxcc_reduce", module.registrations())
      major, minor = module.ffi_api_version()
      if runtime is not None:
        self.assertEqual(major, runtime[0])
        self.assertLessEqual(minor, runtime[1])

  def test_newer_ffi_api_is_refused(self):
    major, minor = ffi._jaxcc_cpu.ffi_api_version()
    older = (major, minor - 1) if minor else (major - 1, 0)
    with mock.patch.object(ffi, "runtime_ffi_api_version", return_value=older):
      with self.assertRaisesRegex(ImportError, f"against XLA FFI API {major}.{minor}.*make"):
        ffi._check_api_version(ffi._jaxcc_cpu)


if __name__ == "__main__":
  absltest.main()
