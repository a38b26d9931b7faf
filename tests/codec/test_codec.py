"""jaxcc.codec: the FFI kernels against the numpy twin, byte for byte, and round trips bit for bit.

Inputs are fresh random numbers on every run (the seed is in every failure
message), mixed with adversarial bit patterns: NaN payloads, infinities, -0.0,
subnormals, random bits, every 16-bit pattern, sparse and constant tensors.
"""

import dataclasses
import math
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import bitwise
from bitwise import SPECIAL_BITS, bits, uint_of
from jaxcc import codec
from jaxcc._src import config
from jaxcc.codec import reference

FLOATS = ("bfloat16", "float16", "float32")
CODECS = ("fixed", "entropy")
SEED = np.random.SeedSequence().entropy


def assert_same_bits(test, actual, expected, msg=""):
  bitwise.assert_same_bits(test, actual, expected, f"{msg}, seed={SEED}")
# Crosses the fixed (256) and entropy (65536) block and sub-stream (1024) edges.
SIZES = (0, 1, 7, 255, 256, 257, 1025, 4099, 65536 + 1000)




def make(kind, n, dtype, salt=0):
  """Test data of one kind (bitwise.float_data), fresh per run, fixed per (kind, n, salt)."""
  return bitwise.float_data(kind, n, dtype, np.random.default_rng([SEED, salt, n]))




encode_jit = jax.jit(codec.encode, static_argnums=1)
decode_jit = jax.jit(codec.decode)


def check_against_twin(test, x, name, msg):
  """FFI bytes == twin bytes; both decoders give back x; returns the encoding."""
  enc = encode_jit(jnp.asarray(x), name)
  n = int(enc.nbytes)
  test.assertEqual(enc.payload.shape, (codec.max_nbytes(x.shape, x.dtype, name),), msg)
  twin = reference.encode(x, name)
  test.assertEqual(n, twin.size, f"{msg}, seed={SEED}")
  np.testing.assert_array_equal(np.asarray(enc.payload)[:n], twin, f"{msg}, seed={SEED}")
  assert_same_bits(test, decode_jit(enc), x, msg)
  assert_same_bits(test, reference.decode(twin, n, x.shape, x.dtype, name), x, msg)
  return enc


class TwinTest(parameterized.TestCase):

  @parameterized.product(dtype=FLOATS, name=CODECS,
                         kind=("normal", "weights", "bits", "special", "sparse"))
  def test_matches_twin_and_round_trips(self, dtype, name, kind):
    for salt, n in enumerate(SIZES):
      x = make(kind, n, dtype, salt)
      check_against_twin(self, x, name, f"{dtype} {name} {kind} n={n}")

  @parameterized.product(dtype=("bfloat16", "float16"), name=CODECS)
  def test_every_16_bit_pattern(self, dtype, name):
    rng = np.random.default_rng([SEED, 1])
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    for x in (every, rng.permutation(every)):
      check_against_twin(self, x.view(jnp.dtype(dtype)), name, f"{dtype} {name}")

  @parameterized.product(dtype=FLOATS, name=CODECS, kind=("zeros", "negzero"))
  def test_constant_tensors(self, dtype, name, kind):
    check_against_twin(self, make(kind, 70000, dtype), name, f"{dtype} {name} {kind}")

  @parameterized.product(dtype=FLOATS, name=CODECS)
  def test_nan_and_inf_blocks(self, dtype, name):
    # A NaN or inf in a block raises its base to the top exponent: every other
    # element escapes, and the block switches to raw exponents.
    x = make("weights", 4096, dtype)
    x[::300] = np.array(SPECIAL_BITS[dtype][:5] * 3, uint_of(dtype))[:len(x[::300])].view(x.dtype)
    check_against_twin(self, x, name, f"{dtype} {name}")

  def test_huffman_lengths(self):
    # Fibonacci frequencies force an unlimited Huffman code past 11 bits.
    fib = [1, 1]
    while len(fib) < 40:
      fib.append(fib[-1] + fib[-2])
    for freq in (fib + [0] * 216, [5, 5] + [0] * 254, list(range(256))):
      lengths = reference.build_code_lengths(freq)
      present = np.flatnonzero(freq)
      self.assertTrue(np.all(lengths[present] >= 1) and np.all(lengths <= 11))
      self.assertEqual(int((2048 >> lengths[present]).sum()), 2048)  # complete code
      order = np.argsort(np.asarray(freq)[present], kind="stable")
      self.assertTrue(np.all(np.diff(lengths[present][order]) <= 0))  # rarer: not shorter


class SizeTest(parameterized.TestCase):

  @parameterized.parameters(*FLOATS)
  def test_fixed_static_size(self, dtype):
    for n in (1, 300, 70000):
      x = make("weights", n, dtype)
      enc = encode_jit(jnp.asarray(x), "fixed")
      self.assertEqual(int(enc.nbytes), codec.fixed_nbytes(x.shape, x.dtype))
    raw = 70000 * np.dtype(jnp.dtype(dtype)).itemsize
    limit = {"bfloat16": 0.78, "float32": 0.89, "float16": 0.96}[dtype]
    self.assertLess(codec.fixed_nbytes((70000,), dtype), limit * raw)

  @parameterized.product(dtype=FLOATS, name=CODECS)
  def test_never_more_than_headers_over_raw(self, dtype, name):
    for kind in ("bits", "special"):
      x = make(kind, 70000, dtype)
      enc = encode_jit(jnp.asarray(x), name)
      blocks = math.ceil(x.size / (256 if name == "fixed" else 65536))
      per_block = 2 if name == "fixed" else 5
      self.assertLessEqual(int(enc.nbytes), x.nbytes + 32 + per_block * blocks)
      self.assertLessEqual(int(enc.nbytes), codec.max_nbytes(x.shape, x.dtype, name))

  def test_sparse_and_dense_ratios(self):
    sparse = make("sparse", 1 << 18, "bfloat16")
    self.assertLess(int(codec.encode(sparse, "entropy").nbytes), 0.05 * sparse.nbytes)
    normal = make("normal", 1 << 18, "bfloat16")  # ~2.5 bits of exponent entropy
    self.assertLess(int(codec.encode(normal, "entropy").nbytes), 0.67 * normal.nbytes)
    zeros = make("zeros", 1 << 18, "float32")
    self.assertLess(int(codec.encode(zeros, "entropy").nbytes), 100)  # 32 + 13 per block


class ApiTest(parameterized.TestCase):

  def test_shapes_and_pytree(self):
    x = jnp.asarray(make("weights", 3 * 5 * 7, "bfloat16").reshape(3, 5, 7))
    enc = codec.encode(x, "fixed")
    self.assertEqual((enc.shape, enc.dtype, enc.codec), ((3, 5, 7), np.dtype(jnp.bfloat16),
                                                         "fixed"))
    self.assertEqual(enc.nbytes.dtype, jnp.int32)
    leaves, tree = jax.tree_util.tree_flatten(enc)
    self.assertLen(leaves, 2)
    assert_same_bits(self, codec.decode(jax.tree_util.tree_unflatten(tree, leaves)), x)
    scalar = jnp.float32(-0.0)
    assert_same_bits(self, codec.decode(codec.encode(scalar, "entropy")), scalar)

  def test_vmap(self):
    xs = jnp.asarray(np.stack([make("weights", 500, "float32", s) for s in range(3)]))
    encs = jax.vmap(lambda a: codec.encode(a, "entropy"))(xs)
    self.assertEqual(encs.payload.shape[0], 3)
    assert_same_bits(self, jax.vmap(codec.decode)(encs), xs)
    for i in range(3):
      np.testing.assert_array_equal(np.asarray(encs.payload[i])[:int(encs.nbytes[i])],
                                    reference.encode(np.asarray(xs[i]), "entropy"))

  def test_shard_map(self):
    if jax.device_count() < 8:
      self.skipTest("needs 8 devices (tests/conftest.py sets 8 virtual CPU devices)")
    mesh = jax.make_mesh((8,), ("x",))
    x = jax.device_put(jnp.asarray(make("weights", 8 * 1000, "bfloat16")),
                       NamedSharding(mesh, P("x")))
    for name in CODECS:
      f = jax.jit(jax.shard_map(lambda a: codec.decode(codec.encode(a, name)), mesh=mesh,
                                in_specs=P("x"), out_specs=P("x")))
      assert_same_bits(self, f(x), x, name)
      g = jax.jit(jax.shard_map(lambda a: codec.encode(a, name).nbytes[None], mesh=mesh,
                                in_specs=P("x"), out_specs=P("x")))
      sizes = np.asarray(g(x))
      for r in range(8):
        shard = np.asarray(x)[r * 1000:(r + 1) * 1000]
        self.assertEqual(sizes[r], reference.encode(shard, name).size)

  @parameterized.parameters("int32", "int8", "uint16", "bool", "complex64")
  def test_auto_passes_other_dtypes_raw(self, dtype):
    rng = np.random.default_rng([SEED, 3])
    x = rng.standard_normal(37) * 100
    x = jnp.asarray(x.astype(dtype) if dtype in ("bool", "complex64") else
                    x.astype(np.int64).astype(dtype))
    enc = jax.jit(lambda a: codec.encode(a, "auto"))(x)
    self.assertEqual(enc.codec, "raw")
    self.assertEqual(int(enc.nbytes), x.nbytes)
    assert_same_bits(self, jax.jit(codec.decode)(enc), x, dtype)
    self.assertEqual(codec.encode(jnp.ones(3, jnp.bfloat16), "auto").codec, "entropy")

  @parameterized.parameters("int32", "uint8", "bool")
  def test_unsupported_dtype_is_a_clear_error(self, dtype):
    for name in CODECS:
      with self.assertRaisesRegex(TypeError, f"cannot take {dtype}.*codec='auto'"):
        codec.encode(jnp.zeros(4, dtype), name)
      with self.assertRaisesRegex(TypeError, f"cannot take {dtype}"):
        codec.max_nbytes((4,), dtype, name)

  def test_float64_is_a_clear_error(self):
    with jax.enable_x64(True):
      x = jnp.arange(5, dtype=jnp.float64)
      with self.assertRaisesRegex(TypeError, "cannot take float64"):
        codec.encode(x, "entropy")
      assert_same_bits(self, codec.decode(codec.encode(x, "auto")), x)

  def test_unknown_codec(self):
    with self.assertRaisesRegex(ValueError, "unknown codec 'zip'"):
      codec.encode(jnp.ones(3), "zip")

  def test_kill_switch_runs_the_twin(self):
    x = jnp.asarray(make("special", 3000, "float16"))
    for name in CODECS:
      with mock.patch.object(config, "USE_FFI", False):
        jaxpr = str(jax.make_jaxpr(lambda a: codec.encode(a, name))(x))
        self.assertNotIn("ffi_call", jaxpr)
        enc = jax.jit(lambda a: codec.encode(a, name))(x)
        out = jax.jit(codec.decode)(enc)
      assert_same_bits(self, out, x, name)
      ffi = codec.encode(x, name)
      np.testing.assert_array_equal(np.asarray(enc.payload)[:int(enc.nbytes)],
                                    np.asarray(ffi.payload)[:int(ffi.nbytes)])


class CorruptionTest(parameterized.TestCase):
  """Bad bytes fail with an error that names the problem, through the FFI and the twin."""

  def _fails(self, enc, pattern):
    # XLA raises INVALID_ARGUMENT from a handler as ValueError, other codes as
    # JaxRuntimeError; the message is the handler's.
    with self.assertRaisesRegex((jax.errors.JaxRuntimeError, ValueError), pattern):
      jax.block_until_ready(decode_jit(enc))
    with self.assertRaisesRegex(codec.DecodeError, pattern):
      reference.decode(np.asarray(enc.payload), int(enc.nbytes), enc.shape, enc.dtype,
                       enc.codec)

  @parameterized.product(dtype=FLOATS, name=CODECS)
  def test_flipped_bits(self, dtype, name):
    enc = codec.encode(make("weights", 70000, dtype), name)
    rng = np.random.default_rng([SEED, 4])
    n = int(enc.nbytes)
    for _ in range(5):
      payload = np.asarray(enc.payload).copy()
      at = int(rng.integers(32, n))
      payload[at] ^= np.uint8(1 << int(rng.integers(0, 8)))
      self._fails(dataclasses.replace(enc, payload=jnp.asarray(payload)), "checksum mismatch")

  @parameterized.parameters(*CODECS)
  def test_truncated_and_bad_headers(self, name):
    enc = codec.encode(make("weights", 5000, "bfloat16"), name)
    n = int(enc.nbytes)
    replace = lambda **kw: dataclasses.replace(enc, **kw)
    self._fails(replace(payload=enc.payload[:n - 1]), "truncated")
    self._fails(replace(payload=enc.payload[:20]), "truncated")
    self._fails(replace(nbytes=jnp.int32(n - 1)), "size mismatch")
    self._fails(replace(payload=enc.payload.at[0].set(0)), "bad header.*magic")
    self._fails(replace(payload=enc.payload.at[4].set(7)), "bad header: codec")
    self._fails(replace(shape=(4999,)), "bad header: 5000 elements")
    other = "entropy" if name == "fixed" else "fixed"
    self._fails(replace(codec=other), "bad header: codec")
    # Bytes past nbytes are not part of the encoding.
    assert_same_bits(self, decode_jit(replace(payload=enc.payload.at[n:].set(0xFF))),
                     decode_jit(enc))


if __name__ == "__main__":
  absltest.main()
