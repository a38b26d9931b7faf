"""The pieces the native executor sends over TCP (xla_ffi/cpu/piece_codec.h).

Segmented pieces are jaxcc codec encodings of 65536-element segments back to
back; split pieces (bf16/f32 "entropy") follow the split layout. Both are
checked byte for byte against the numpy twin, round tripped bit for bit on
adversarial data, and must fail, never decode, when corrupted or truncated.
"""

import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

import bitwise
from jaxcc import _jaxcc_cpu
from jaxcc._src.reduce import reduce_sum_reference
from jaxcc.codec import reference

SEGMENT = reference.ENTROPY_BLOCK
SEED = np.random.SeedSequence().entropy
# One element, a partial segment, and segments with a partial last one.
SIZES = (1, 4099, 2 * SEGMENT + 3)


def make(kind, n, dtype):
  return bitwise.float_data(kind, n, dtype, np.random.default_rng([SEED, n]))


def encode(x, codec, split):
  name = np.dtype(x.dtype).name
  return _jaxcc_cpu.piece_encode(reference.CODEC_IDS[codec], reference.DTYPE_IDS[name],
                                 x.tobytes(), split)


def segmented(x, codec):
  """The segmented layout's twin: codec encodings of SEGMENT elements back to back."""
  return b"".join(reference.encode(x[i:i + SEGMENT], codec).tobytes()
                  for i in range(0, x.size, SEGMENT))


def sparse(x):
  """piece_codec.cc's rule: +0.0 is 1/16 or more of up to 4096 evenly strided elements."""
  sample = x.reshape(-1)[::max(1, x.size // 4096)]
  return np.count_nonzero(sample.view(f"u{x.itemsize}") == 0) * 16 >= sample.size


def decode(data, x, codec):
  name = np.dtype(x.dtype).name
  out = _jaxcc_cpu.piece_decode(reference.CODEC_IDS[codec], reference.DTYPE_IDS[name], data,
                                x.size)
  return np.frombuffer(out, x.dtype)


class PieceCodecTest(parameterized.TestCase):

  @parameterized.product(codec=("fixed", "entropy"), dtype=("bfloat16", "float16", "float32"),
                         kind=("special", "bits", "sparse"), n=SIZES)
  def test_a_segmented_piece_is_codec_encodings_back_to_back(self, codec, dtype, kind, n):
    x = make(kind, n, dtype)
    got = encode(x, codec, split=False)
    self.assertEqual(got, segmented(x, codec), f"seed={SEED}")
    bitwise.assert_same_bits(self, decode(got, x, codec), x, f"seed={SEED}")

  @parameterized.product(dtype=("bfloat16", "float32"), kind=("special", "bits", "weights"),
                         n=SIZES)
  def test_a_split_piece_matches_the_twin_and_round_trips(self, dtype, kind, n):
    """Split unless sparse (a one-element piece of +0.0 is)."""
    x = make(kind, n, dtype)
    got = encode(x, "entropy", split=True)
    want = segmented(x, "entropy") if sparse(x) else reference.split_encode(x).tobytes()
    self.assertEqual(got, want, f"seed={SEED}")
    bitwise.assert_same_bits(self, decode(got, x, "entropy"), x, f"seed={SEED}")

  @parameterized.parameters(("float16", "weights", "entropy"), ("bfloat16", "sparse", "entropy"),
                            ("float32", "weights", "fixed"))
  def test_only_dense_bf16_and_f32_entropy_pieces_split(self, dtype, kind, codec):
    x = make(kind, 4099, dtype)
    self.assertEqual(encode(x, codec, split=True), encode(x, codec, split=False))

  @parameterized.product(codec=("fixed", "entropy"), dtype=("bfloat16", "float16", "float32"),
                         k=(1, 3), n=SIZES)
  def test_a_reduce_hop_sums_and_re_encodes_in_one_pass(self, codec, dtype, k, n):
    """Pieces split and segmented alike are summed in jaxcc_reduce's order and rounding (its
    pure-JAX twin gives the bits), and the sum is encoded as a send would encode it."""
    name = reference.CODEC_IDS[codec], reference.DTYPE_IDS[dtype]
    own, *xs = (make(kind, n, dtype) for kind in ["weights", "special", "weights", "bits"][:k + 1])
    pieces = [encode(x, codec, split=i % 2 == 0) for i, x in enumerate(xs)]
    total, encoded = _jaxcc_cpu.piece_decode_reduce(*name, pieces, own.tobytes(), True)
    want = np.asarray(reduce_sum_reference([jnp.asarray(v) for v in [own, *xs]]))
    self.assertEqual(total, want.tobytes(), f"seed={SEED}")
    self.assertEqual(encoded, encode(want, codec, split=False), f"seed={SEED}")
    alone, nothing = _jaxcc_cpu.piece_decode_reduce(*name, pieces, own.tobytes(), False)
    self.assertEqual((alone, nothing), (total, b""))

  def test_a_reduce_hop_names_the_piece_that_does_not_decode(self):
    own, x = make("weights", 4099, "bfloat16"), make("weights", 4099, "bfloat16")
    good = encode(x, "entropy", split=False)
    bad = good[:-1] + bytes([good[-1] ^ 4])
    with self.assertRaisesRegex(ValueError, "cannot sum piece 1: .*checksum"):
      _jaxcc_cpu.piece_decode_reduce(2, 1, [good, bad], own.tobytes(), True)

  @parameterized.product(split=(False, True), codec=("fixed", "entropy"))
  def test_a_corrupted_or_truncated_piece_fails(self, split, codec):
    x = make("weights", 2 * SEGMENT + 3, "bfloat16")
    data = bytearray(encode(x, codec, split))
    self.assertEqual(data[:4] == b"JCS1", split and codec == "entropy")
    rng = np.random.default_rng([SEED, 1])
    for at in [0, 8, 16, 40, len(data) // 2, len(data) - 9, len(data) - 1,
               *rng.integers(0, len(data), 24)]:
      bad = bytearray(data)
      bad[at] ^= 1 << int(rng.integers(8))
      with self.assertRaisesRegex(ValueError, "cannot decode the piece", msg=f"byte {at}"):
        decode(bytes(bad), x, codec)
    for cut in (bytes(data[:-1]), bytes(data[:len(data) // 2]), bytes(data[:20]),
                bytes(data) + b"\0"):
      with self.assertRaisesRegex(ValueError, "cannot decode the piece"):
        decode(cut, x, codec)


if __name__ == "__main__":
  absltest.main()
