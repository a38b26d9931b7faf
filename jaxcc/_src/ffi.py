"""Loads jaxcc's native modules and registers their XLA FFI targets, once.

``_jaxcc_cpu`` is required; its targets are registered for platform "cpu".
``_jaxcc_cuda`` is optional: when it was built (nvcc found at build time), its
targets are registered for "CUDA" and ``HAS_CUDA`` is True. It links cudart
statically and loads without a GPU or driver, so ``HAS_CUDA`` says that the
CUDA handlers exist, not that a GPU does.

Both modules must be built against XLA FFI headers no newer than the running
jaxlib's: XLA rejects such a handler when the backend starts, and that takes
the whole backend down. The check below turns that into an ImportError that
says how to rebuild.
"""

from __future__ import annotations

import os
import re

import jax
import jaxlib

_REBUILD_HINT = (
    "Rebuild jaxcc with the Python and jax that run it: `make` in the jaxcc checkout, or "
    "`python -m pip install --no-build-isolation -e .`.")


def runtime_ffi_api_version() -> tuple[int, int] | None:
  """The XLA FFI C API version (major, minor) of the running jaxlib, if known."""
  path = os.path.join(jax.ffi.include_dir(), "xla", "ffi", "api", "c_api.h")
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
  except OSError:
    return None
  major = re.search(r"#define\s+XLA_FFI_API_MAJOR\s+(\d+)", text)
  minor = re.search(r"#define\s+XLA_FFI_API_MINOR\s+(\d+)", text)
  if major is None or minor is None:
    return None
  return int(major.group(1)), int(minor.group(1))


def _check_api_version(module) -> None:
  built = tuple(int(v) for v in module.ffi_api_version())
  runtime = runtime_ffi_api_version()
  if runtime is None:
    return
  if built[0] != runtime[0] or built[1] > runtime[1]:
    raise ImportError(
        f"jaxcc: {module.__name__} was compiled against XLA FFI API {built[0]}.{built[1]}, but the "
        f"running jaxlib {jaxlib.__version__} provides {runtime[0]}.{runtime[1]}; loading its "
        f"handlers would take the XLA backend down. {_REBUILD_HINT}")


def _register(module, platform: str) -> None:
  for name, capsule in module.registrations().items():
    jax.ffi.register_ffi_target(name, capsule, platform=platform)


try:
  from jaxcc import _jaxcc_cpu
except ImportError as e:
  raise ImportError(
      f"jaxcc: the native module jaxcc._jaxcc_cpu is missing or cannot be loaded ({e}). "
      f"{_REBUILD_HINT}") from e

_check_api_version(_jaxcc_cpu)
_register(_jaxcc_cpu, "cpu")

try:
  from jaxcc import _jaxcc_cuda
except ImportError:  # not built (no nvcc), or no usable CUDA here: CPU only
  _jaxcc_cuda = None

HAS_CUDA: bool = _jaxcc_cuda is not None
if _jaxcc_cuda is not None:
  _check_api_version(_jaxcc_cuda)
  _register(_jaxcc_cuda, "CUDA")
