"""Bit-level comparison helpers shared by the kernel and codec tests."""

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
