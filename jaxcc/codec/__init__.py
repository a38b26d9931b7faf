"""Lossless float codecs: ``encode(x, codec)`` / ``decode(encoded)``, bit-exact.

See :mod:`jaxcc.codec.api` for the codecs, :mod:`jaxcc.codec.reference`
for the numpy twin of the kernels and :mod:`jaxcc.codec.choice` for what a
collective's ``codec="auto"`` picks.
"""

from jaxcc.codec import reference
from jaxcc.codec.api import (CODEC_DTYPES, CODECS, SUPPORTED_DTYPES, Encoded, decode, encode,
                             fixed_nbytes, max_nbytes)
from jaxcc.codec.choice import auto_choice, declare_ratio
from jaxcc.codec.reference import DecodeError

__all__ = [
    "CODEC_DTYPES",
    "CODECS",
    "SUPPORTED_DTYPES",
    "DecodeError",
    "Encoded",
    "auto_choice",
    "declare_ratio",
    "decode",
    "encode",
    "fixed_nbytes",
    "max_nbytes",
    "reference",
]
