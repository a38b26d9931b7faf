"""Runtime switches, read once from the environment when jaxcc is imported."""

from __future__ import annotations

import os

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _env_flag(name: str, default: bool) -> bool:
  value = os.environ.get(name)
  if value is None or not value.strip():
    return default
  if value.strip().lower() in _TRUE:
    return True
  if value.strip().lower() in _FALSE:
    return False
  raise ValueError(f"{name}={value!r}: expected one of {_TRUE + _FALSE}")


# JAXCC_USE_FFI=0 routes the FFI ops to their pure-JAX twins (kill switch).
USE_FFI: bool = _env_flag("JAXCC_USE_FFI", True)


def timeout_s() -> float:
  """JAXCC_TIMEOUT_S: how long a collective waits for a peer, in seconds (float > 0; 300)."""
  value = os.environ.get("JAXCC_TIMEOUT_S")
  if value is None or not value.strip():
    return 300.0
  try:
    seconds = float(value)
  except ValueError:
    seconds = float("nan")
  if not seconds > 0 or seconds == float("inf"):
    raise ValueError(f"JAXCC_TIMEOUT_S={value!r}: expected a number of seconds > 0")
  return seconds
