"""Bit-level helpers shared by the kernel and codec tests (and tests/gpu): comparisons,
adversarial float data and the segments of an encoded piece."""

import jax.numpy as jnp
import numpy as np


def uint_of(dtype) -> np.dtype:
  """The unsigned integer dtype as wide as ``dtype``."""
  return np.dtype(f"uint{8 * np.dtype(dtype).itemsize}")


def bits(x) -> np.ndarray:
  """The raw bits of an array, as unsigned integers of the same width."""
  x = np.asarray(x)
  return x.view(uint_of(x.dtype))


def assert_same_bits(test, actual, expected, msg=""):
  """Fails ``test`` unless dtype, shape and every bit agree; names the first difference."""
  actual, expected = np.asarray(actual), np.asarray(expected)
  test.assertEqual(actual.dtype, expected.dtype, msg)
  test.assertEqual(actual.shape, expected.shape, msg)
  diff = np.flatnonzero(bits(actual) != bits(expected))
  if diff.size:
    i = diff[0]
    test.fail(f"{diff.size} of {actual.size} elements differ, first at flat index {i}: "
              f"{bits(actual).flat[i]:#x} != {bits(expected).flat[i]:#x} ({msg})")


# Bit patterns per dtype: NaNs with payloads (quiet and signalling, both signs), infinities,
# -0.0 and 0.0, subnormals, the normal limits and a few ordinary values.
SPECIAL_BITS = {
    "float32": (0x7FC00001, 0x7F800001, 0xFFA12345, 0xFFC00000, 0x7F800000, 0xFF800000,
                0x80000000, 0x00000000, 0x00000001, 0x807FFFFF, 0x00800000, 0x7F7FFFFF,
                0xFF7FFFFF, 0x7F7FFFFE, 0x3F800000, 0x33800000),
    "bfloat16": (0x7FC1, 0x7F81, 0xFFA5, 0xFFC0, 0x7F80, 0xFF80, 0x8000, 0x0000, 0x0001, 0x807F,
                 0x0080, 0x7F7F, 0xFF7F, 0x7F7E, 0x3F80, 0x3B80),
    "float16": (0x7E01, 0x7C01, 0xFD55, 0xFE00, 0x7C00, 0xFC00, 0x8000, 0x0000, 0x0001, 0x83FF,
                0x0400, 0x7BFF, 0xFBFF, 0x7BFE, 0x3C00, 0x1400),
}


def float_data(kind: str, n: int, dtype, rng) -> np.ndarray:
  """n values of one kind: normal, weights, bits, special, sparse, zeros or negzero."""
  dtype = np.dtype(jnp.dtype(dtype))
  u = uint_of(dtype)
  if kind == "bits":
    return rng.integers(0, np.iinfo(u).max, n, dtype=u, endpoint=True).view(dtype)
  if kind == "zeros":
    return np.zeros(n, dtype)
  if kind == "negzero":
    return np.full(n, -0.0, dtype)
  x = rng.standard_normal(n).astype(np.float32)
  if kind == "weights":
    x *= 0.05
  if kind == "sparse":
    x[rng.random(n) >= 0.03] = 0.0
  x = x.astype(dtype)
  if kind == "special":
    special = np.array(SPECIAL_BITS[dtype.name], u).view(dtype)
    where = rng.random(n) < 0.2
    x[where] = rng.choice(special, size=int(where.sum()))
  return x


def segment_sizes(data: bytes) -> list[int]:
  """The nbytes in the header of each segment of a segmented piece (xla_ffi/include/jaxcc/
  piece_layout.h): its encodings back to back."""
  sizes, at = [], 0
  while at < len(data):
    sizes.append(int.from_bytes(data[at + 16:at + 24], "little"))
    at += sizes[-1]
  return sizes
