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


def test_elastic_gossip_takes_back_a_killed_worker():
  out = run_example("elastic_gossip.py", "--steps", "60", "--kill", "1@2")
  assert "4 worker processes, gossip DiLoCo, H = 10; worker 1 killed in round 2" in out, out
  for q in (0, 2, 3):  # every round, and the training loss went down
    first, last = re.search(rf"^worker {q}: training loss round 0 (\S+), round 5 (\S+)$", out,
                            re.MULTILINE).groups()
    assert float(last) < float(first), out
  # Killed in round 2, the others wait for it at round 3: it trains rounds 5 on, from its
  # ring successor's state.
  assert re.search(r"^worker 1: training loss round 5 \S+, round 5 \S+; restarted, rejoined "
                   r"at round 5 with the state of worker 2$", out, re.MULTILINE), out


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
