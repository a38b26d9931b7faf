"""Every ``JAXCC_*`` setting jaxcc reads, each parsed and validated here, once per read.

* ``JAXCC_USE_FFI`` (``USE_FFI``, read at import): ``0`` routes the FFI ops to
  their pure-JAX twins (kill switch).
* ``JAXCC_TIMEOUT_S`` (``timeout_s()``, read at each call): the limit of every
  wait of a native collective and of its bootstrap, in seconds (a float > 0;
  default 300). The handlers get it as the ``timeout_ms`` attribute.
* ``JAXCC_SPLIT_SEND_BYTES`` (``split_send_bytes()``, read at each call):
  pieces of at least this many raw bytes may go over TCP in two parts (an
  int >= 0; 0 never splits; default 262144). The CPU handler gets it as the
  ``split_send_bytes`` attribute.
* ``JAXCC_INTRA_ENGINE`` (``intra_engine()``, read at each call): the engine
  of a hierarchical collective's intra-cluster phases where the clusters are
  the groups of the outer mesh axis: "xla" (XLA's collectives over the inner
  axes, the border executor), "native" (the whole schedule on jaxcc's engine)
  or "auto" (default: "xla" on the GPU, where the inner axes are NCCL's;
  "native" on the CPU, where the whole schedule measured faster).
* ``JAXCC_EXCHANGE`` (``exchange()``, read at each lowering of a gossip
  exchange): "native" (default: on the CPU the exchange is an FFI call of the
  CPU module) or "host" (host callbacks into the same native code, the path
  every other backend takes).
* ``JAXCC_TESTBED_MODE`` (``testbed_mode()``, read when a testbed cluster is
  entered): "auto" (default: "root" as root, else "rootless"), "root" (the
  host's network namespaces) or "rootless" (inside an unprivileged user
  namespace, as any user).
* ``JAXCC_TCP_INTEGRITY`` (``tcp_integrity()``, read when the TCP transport
  starts): "off" (default) or "hmac": every frame on the TCP connections
  carries an HMAC-SHA256 under its connection's key. Every process of a job
  must set the same.
* ``JAXCC_NATIVE_DIR`` (``native_dir()``, read when jaxcc is imported): a
  directory to import the native modules from instead of the installed
  package, such as the sanitized build that ``make sanitize`` puts in
  build/sanitize (unset: the installed modules).

The functions read the environment each time they are called, at the lowering
of each collective, so a value set between two lowerings holds for the second.
An empty value means the default; any other value that does not parse is a
ValueError naming the variable and the values it takes.
"""

from __future__ import annotations

import math
import os

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_DEFAULT_TIMEOUT_S = 300.0
_DEFAULT_SPLIT_SEND_BYTES = 1 << 18


def _env(name: str) -> str | None:
  """The stripped value of ``name``; None when unset or empty."""
  value = os.environ.get(name)
  if value is None or not value.strip():
    return None
  return value.strip()


def _env_flag(name: str, default: bool) -> bool:
  value = _env(name)
  if value is None:
    return default
  if value.lower() in _TRUE:
    return True
  if value.lower() in _FALSE:
    return False
  raise ValueError(f"{name}={value!r}: expected one of {_TRUE + _FALSE}")


def timeout_s() -> float:
  """``JAXCC_TIMEOUT_S``: the limit of every wait, in seconds (a float > 0, default 300)."""
  value = _env("JAXCC_TIMEOUT_S")
  if value is None:
    return _DEFAULT_TIMEOUT_S
  try:
    seconds = float(value)
  except ValueError:
    seconds = math.nan
  if not (seconds > 0 and math.isfinite(seconds)):
    raise ValueError(f"JAXCC_TIMEOUT_S={value!r}: expected a number of seconds > 0, e.g. 300 "
                     f"or 0.5 (unset: {_DEFAULT_TIMEOUT_S:g})")
  return seconds


def timeout_ms() -> int:
  """``timeout_s()`` in milliseconds, rounded up: the handlers' ``timeout_ms`` attribute."""
  return math.ceil(timeout_s() * 1000)


def split_send_bytes() -> int:
  """``JAXCC_SPLIT_SEND_BYTES``: the raw size from which a piece may be sent split (int >= 0)."""
  value = _env("JAXCC_SPLIT_SEND_BYTES")
  if value is None:
    return _DEFAULT_SPLIT_SEND_BYTES
  try:
    nbytes = int(value)
  except ValueError:
    nbytes = -1
  if nbytes < 0:
    raise ValueError(f"JAXCC_SPLIT_SEND_BYTES={value!r}: expected a whole number of bytes >= 0 "
                     f"(0: never split; unset: {_DEFAULT_SPLIT_SEND_BYTES})")
  return nbytes


def _env_choice(name: str, choices: tuple[str, ...]) -> str:
  """The value of ``name``, one of ``choices``; the first when unset."""
  value = _env(name)
  if value is None:
    return choices[0]
  if value not in choices:
    raise ValueError(f"{name}={value!r}: expected one of {choices} (unset: {choices[0]})")
  return value


INTRA_ENGINES = ("auto", "xla", "native")
EXCHANGE_PATHS = ("native", "host")
TESTBED_MODES = ("auto", "root", "rootless")
TCP_INTEGRITY = ("off", "hmac")


def intra_engine() -> str:
  """``JAXCC_INTRA_ENGINE``: "auto" (default), "xla" or "native"."""
  return _env_choice("JAXCC_INTRA_ENGINE", INTRA_ENGINES)


def exchange() -> str:
  """``JAXCC_EXCHANGE``: "native" (default) or "host"."""
  return _env_choice("JAXCC_EXCHANGE", EXCHANGE_PATHS)


def testbed_mode() -> str:
  """``JAXCC_TESTBED_MODE``: "auto" (default), "root" or "rootless"."""
  return _env_choice("JAXCC_TESTBED_MODE", TESTBED_MODES)


def tcp_integrity() -> str:
  """``JAXCC_TCP_INTEGRITY``: "off" (default) or "hmac"."""
  return _env_choice("JAXCC_TCP_INTEGRITY", TCP_INTEGRITY)


def native_dir() -> str | None:
  """``JAXCC_NATIVE_DIR``: the directory of the native modules to import (absolute), or None."""
  value = _env("JAXCC_NATIVE_DIR")
  if value is None:
    return None
  if not os.path.isdir(value):
    raise ValueError(f"JAXCC_NATIVE_DIR={value!r}: expected a directory holding _jaxcc_cpu "
                     f"(unset: the installed modules)")
  return os.path.abspath(value)


USE_FFI: bool = _env_flag("JAXCC_USE_FFI", True)
