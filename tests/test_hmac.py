"""The native HMAC-SHA256 (xla_ffi/cpu/hmac_sha256.h) against Python's hmac.

The binding feeds the message in pieces of 1, 63, 64, 65 and 1000 bytes, then
the rest, so every length below crosses the block buffering differently.
"""

import hashlib
import hmac
import random

import pytest

from jaxcc._src import ffi

KEY_LENGTHS = (0, 1, 32, 63, 64, 65, 200)
DATA_LENGTHS = (0, 1, 55, 56, 63, 64, 65, 119, 120, 127, 128, 1000, (1 << 20) + 3)

# RFC 4231 test cases 1, 2 and 6: (key, data, HMAC-SHA256), in hex.
RFC4231 = (
    ("0b" * 20, "4869205468657265",
     "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"),
    ("4a656665", "7768617420646f2079612077616e7420666f72206e6f7468696e673f",
     "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"),
    ("aa" * 131,
     "54657374205573696e67204c6172676572205468616e20426c6f636b2d53697a65"
     "204b6579202d2048617368204b6579204669727374",
     "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"),
)


def native_hmac(key, data):
  return ffi.load().cpu.hmac_sha256(key, data)


@pytest.mark.parametrize("key_length", KEY_LENGTHS)
def test_matches_python_hmac(key_length):
  rng = random.Random(key_length)
  key = rng.randbytes(key_length)
  for n in DATA_LENGTHS:
    data = rng.randbytes(n)
    assert native_hmac(key, data) == hmac.new(key, data, hashlib.sha256).digest(), (key_length, n)


@pytest.mark.parametrize("key, data, tag", RFC4231)
def test_rfc4231(key, data, tag):
  assert native_hmac(bytes.fromhex(key), bytes.fromhex(data)).hex() == tag
