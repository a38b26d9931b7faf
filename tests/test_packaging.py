"""jaxcc's sdist installs into a fresh venv, and the installed package works there.

The sdist of this checkout is built with its build backend in this Python (a
frontend without isolation does the same), then ``pip install``-ed into a new
venv: pip builds the wheel (CPU only) in an isolated environment from
[build-system] requires (the oldest supported jax) and installs the runtime
dependencies.
``install_smoke.py`` then runs in that venv from a directory outside the
checkout: the native ring all_reduce against lax.psum, and the installed
distribution's version against ``jaxcc.__version__``.
"""

import os
import pathlib
import shutil
import subprocess
import sys
import tomllib

import pytest

pytestmark = pytest.mark.slow  # minutes, most of them compiling the native module

ROOT = pathlib.Path(__file__).resolve().parents[1]
BUILD_SDIST = "import importlib, sys; importlib.import_module(sys.argv[1]).build_sdist(sys.argv[2])"


def run(args, **kwargs):
  """Runs ``args``; fails the test with its output unless it exits 0; returns its stdout."""
  proc = subprocess.run(args, capture_output=True, text=True, **kwargs)
  assert proc.returncode == 0, f"{args}:\n{proc.stdout}{proc.stderr}"
  return proc.stdout


def test_the_sdist_installs_into_a_fresh_venv_and_runs(tmp_path):
  backend = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["build-backend"]
  run([sys.executable, "-c", BUILD_SDIST, backend, tmp_path / "dist"], cwd=ROOT, timeout=120)
  sdist, = (tmp_path / "dist").glob("jaxcc-*.tar.gz")
  # The fresh venv's jaxcc runs with its defaults and nothing on a path into the checkout.
  # Its build is CPU only: the smoke test runs on CPU, `make` builds the CUDA module, and
  # building it here would add half to this test's time.
  env = {k: v for k, v in os.environ.items() if not (k.startswith("JAXCC_") or k == "PYTHONPATH")}
  env["JAXCC_ENABLE_CUDA"] = "OFF"
  venv = tmp_path / "venv"
  run([sys.executable, "-m", "venv", venv], timeout=120)
  run([venv / "bin" / "python", "-m", "pip", "install", "-q", sdist], env=env, timeout=900)
  shutil.copy(ROOT / "tests" / "install_smoke.py", tmp_path)
  out = run([venv / "bin" / "python", "install_smoke.py"], cwd=tmp_path, env=env, timeout=300)
  assert f"at {venv}/lib/python" in out and "all_reduce ring native == lax.psum" in out, out
