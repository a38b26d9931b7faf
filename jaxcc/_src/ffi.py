"""Loads jaxcc's native modules and registers their XLA FFI targets, on first use.

Importing jaxcc loads nothing native: the planner, the simulator and the
topologies work without a build. Code that emits a native op calls
:func:`load` when it traces or lowers the op, before XLA compiles it; the
first call imports the modules, checks them and registers their targets,
later calls return the same :class:`Native`. The simulator calls
:func:`cpu_module_or_none`: the CPU module where it loads, else None.

``_jaxcc_cpu`` is required; its targets are registered for platform "cpu".
``_jaxcc_cuda`` is optional: when it was built (nvcc found at build time), its
targets are registered for "CUDA". It links cudart statically and loads
without a GPU or driver, so ``cuda is not None`` says that the CUDA handlers
exist, not that a GPU does.

Checks at load, each an ImportError that says how to rebuild:

* Both modules must be built against XLA FFI headers no newer than the
  running jaxlib's: XLA rejects such a handler when the backend starts, and
  that takes the whole backend down.
* The codec ids and the dtypes the kernels take must be those of the Python
  side (``jaxcc.codec.reference.CODEC_IDS`` / ``DTYPE_IDS``,
  ``jaxcc._src.reduce.REDUCIBLE_DTYPES``): a module built from other sources
  would write or read other bytes.

``_jaxcc_cpu``, ``_jaxcc_cuda`` and ``HAS_CUDA`` are also attributes of this
module; reading one loads the modules.

With ``JAXCC_NATIVE_DIR`` set (``config.native_dir()``), both modules are
imported from that directory instead of the installed package, and one missing
there is missing. It is read when this module is imported (``import jaxcc``
does), so ``from jaxcc import _jaxcc_cpu`` gets the module that :func:`load`
gets.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.abc
import importlib.machinery
import os
import re
import sys
import threading
import types

import jax
import jaxlib

from jaxcc._src import config

REBUILD_HINT = (
    "Build jaxcc with the Python and jax that run it: `make install` in the jaxcc checkout, or "
    "`python -m pip install --no-build-isolation -e .`.")


@dataclasses.dataclass(frozen=True)
class Native:
  """The loaded native modules: ``cpu`` always, ``cuda`` when the CUDA module was built."""

  cpu: types.ModuleType
  cuda: types.ModuleType | None


class _NativeDirFinder(importlib.abc.MetaPathFinder):
  """Finds jaxcc's native modules in one directory, ahead of every other finder."""

  NAMES = ("jaxcc._jaxcc_cpu", "jaxcc._jaxcc_cuda")

  def __init__(self, directory: str):
    self.directory = directory

  def find_spec(self, fullname, path=None, target=None):
    if fullname not in self.NAMES:
      return None
    spec = importlib.machinery.PathFinder.find_spec(fullname, [self.directory])
    if spec is None:
      raise ImportError(f"no {fullname} in JAXCC_NATIVE_DIR={self.directory}", name=fullname)
    return spec


_native_dir = config.native_dir()
if _native_dir is not None:
  sys.meta_path.insert(0, _NativeDirFinder(_native_dir))

_lock = threading.Lock()
_native: Native | None = None


def load() -> Native:
  """Import, check and register the native modules once; return them.

  Raises:
    ImportError: the CPU module is missing, or a module does not match the
      running jaxlib or the Python side (the message says how to rebuild).
  """
  global _native
  with _lock:
    if _native is None:
      cpu = _import("_jaxcc_cpu", required=True)
      cuda = _import("_jaxcc_cuda", required=False)
      for module in (cpu, cuda):
        if module is not None:
          _check_api_version(module)
          _check_kernel_ids(module)
      _register(cpu, "cpu")
      if cuda is not None:
        _register(cuda, "CUDA")
      _native = Native(cpu, cuda)
    return _native


def cpu_module_or_none() -> types.ModuleType | None:
  """``load().cpu``, or None where the native modules are missing or do not load."""
  try:
    return load().cpu
  except ImportError:
    return None


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


def __getattr__(name: str):
  if name == "_jaxcc_cpu":
    return load().cpu
  if name == "_jaxcc_cuda":
    return load().cuda
  if name == "HAS_CUDA":
    return load().cuda is not None
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _import(name: str, required: bool) -> types.ModuleType | None:
  try:
    return importlib.import_module(f"jaxcc.{name}")
  except ImportError as e:
    if not required:  # not built (no nvcc), or no usable CUDA here: CPU only
      return None
    raise ImportError(
        f"jaxcc: the native module jaxcc.{name} is missing or cannot be loaded ({e}); jaxcc's "
        f"native ops (executor='native', jaxcc.codec with JAXCC_USE_FFI=1, the reduce kernel) "
        f"need it. {REBUILD_HINT}") from e


def _check_api_version(module) -> None:
  built = tuple(int(v) for v in module.ffi_api_version())
  runtime = runtime_ffi_api_version()
  if runtime is None:
    return
  if built[0] != runtime[0] or built[1] > runtime[1]:
    raise ImportError(
        f"jaxcc: {module.__name__} was compiled against XLA FFI API {built[0]}.{built[1]}, but the "
        f"running jaxlib {jaxlib.__version__} provides {runtime[0]}.{runtime[1]}; loading its "
        f"handlers would take the XLA backend down. {REBUILD_HINT}")


def _check_kernel_ids(module) -> None:
  # Imported here: both modules import this one for load().
  from jaxcc._src import reduce  # pylint: disable=import-outside-toplevel
  from jaxcc.codec import reference  # pylint: disable=import-outside-toplevel

  expected = {
      "codec ids": dict(reference.CODEC_IDS),
      "codec dtype ids": dict(reference.DTYPE_IDS),
      "reducible dtypes": [d.name for d in reduce.REDUCIBLE_DTYPES],
  }
  built = {
      "codec ids": dict(module.codec_ids()),
      "codec dtype ids": dict(module.codec_dtype_ids()),
      "reducible dtypes": list(module.reducible_dtypes()),
  }
  for what, want in expected.items():
    if built[what] != want:
      raise ImportError(
          f"jaxcc: {module.__name__} was built from other sources: its {what} are "
          f"{built[what]}, the Python side's {want}. {REBUILD_HINT}")


def _register(module, platform: str) -> None:
  for name, capsule in module.registrations().items():
    jax.ffi.register_ffi_target(name, capsule, platform=platform)
