"""The scripts in examples/ run end to end as their own processes, at sizes small enough for CI."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from jaxcc import testbed

pytestmark = pytest.mark.multiprocess

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def run_example(name, *args):
  """Runs ``examples/<name>`` with this Python and environment; returns its stdout."""
  proc = subprocess.run([sys.executable, str(EXAMPLES / name), *args], cwd=EXAMPLES.parent,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  return proc.stdout


def test_diloco_train_trains_a_few_steps():
  out = run_example("diloco_train.py", "--steps", "4", "--sync-every", "2")
  losses = {int(step): float(loss) for step, loss in
            re.findall(r"^step\s+(\d+)\s+averaged-model loss (\S+)", out, re.MULTILINE)}
  assert sorted(losses) == [0, 2, 4], out
  assert losses[4] < losses[0], out
  assert re.search(r"^worst worker \d+\.\d+, \d+ ms per step$", out, re.MULTILINE), out


def test_demo_matches_psum_and_measures_the_emulated_network():
  out = run_example("demo.py", "--mib", "1")  # exits non-zero if a result differs from psum
  assert "on 8 virtual CPU devices: equal to lax.psum" in out, out
  try:
    testbed.mode()
  except RuntimeError as e:
    if os.environ.get("CI"):
      pytest.fail(f"CI must run the demo on the emulated network: {e}")
    assert "simulated only:" in out, out
    return
  measured = re.findall(r"^(psum|ring|optcc) +\d+ms +[\d.]+ +\d+ms  = exact sum", out, re.MULTILINE)
  assert measured == ["psum", "ring", "optcc"], out
