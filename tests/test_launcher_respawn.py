"""jaxcc.launcher's respawn: a listed process SIGKILLed once starts again, process 0 too, up to
max_restarts times; one more kill fails."""

import os

import pytest

from jaxcc import launcher

pytestmark = pytest.mark.multiprocess

# argv: the rank that SIGKILLs itself, in how many incarnations, and a file for every
# process' pid (then the others wait to be killed) or "".
SCRIPT = """\
import json, os, signal, sys, time
from jaxcc import launcher
me = launcher.job()
victim, kills, pids = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
if pids:
  with open(pids, "a") as f:
    f.write(f"{os.getpid()}\\n")
if me.process_id == victim and me.incarnation < kills:
  print(f"incarnation {me.incarnation} dies", flush=True)
  print(f"incarnation {me.incarnation} stderr", file=sys.stderr, flush=True)
  os.kill(os.getpid(), signal.SIGKILL)
if pids:
  time.sleep(600)
print(json.dumps({"rank": me.process_id, "incarnation": me.incarnation,
                  "env": os.environ[%r]}))
""" % launcher.INCARNATION


def _script(tmp_path):
  path = tmp_path / "respawn.py"
  path.write_text(SCRIPT)
  return str(path)


def _all_gone(pids):
  for pid in map(int, pids.read_text().split()):
    with pytest.raises(ProcessLookupError):
      os.kill(pid, 0)


@pytest.mark.parametrize("victim", [2, 0])
def test_a_respawned_process_killed_once_runs_again_and_gives_its_second_result(tmp_path, victim):
  processes = launcher.launch(_script(tmp_path), [victim, 1, ""], nproc=3, respawn={victim},
                              timeout_s=60)
  assert [p.json() for p in processes] == [
      {"rank": q, "incarnation": int(q == victim), "env": str(int(q == victim))}
      for q in range(3)]
  assert processes[victim].stdout.startswith(
      "incarnation 0 dies\n--- jaxcc.launcher: incarnation 1 ---\n{"), processes[victim].stdout
  assert processes[victim].stderr.startswith(
      "incarnation 0 stderr\n--- jaxcc.launcher: incarnation 1 ---\n"), processes[victim].stderr
  assert "jaxcc.launcher: incarnation" not in processes[1].stdout + processes[1].stderr


def test_a_respawned_process_killed_twice_fails_the_job_and_the_others_are_killed(tmp_path):
  pids = tmp_path / "pids"
  with pytest.raises(RuntimeError, match=r"rank 2 exited with -9(.|\n)*incarnation 1 stderr"):
    launcher.launch(_script(tmp_path), [2, 2, pids], nproc=3, respawn={2}, timeout_s=60)
  assert len(pids.read_text().split()) == 4
  _all_gone(pids)


def test_max_restarts_lets_a_process_die_that_many_times(tmp_path):
  processes = launcher.launch(_script(tmp_path), [1, 2, ""], nproc=3, respawn={1},
                              max_restarts=2, timeout_s=60)
  assert processes[1].json() == {"rank": 1, "incarnation": 2, "env": "2"}
  assert processes[1].stdout.startswith(
      "incarnation 0 dies\n--- jaxcc.launcher: incarnation 1 ---\nincarnation 1 dies\n"
      "--- jaxcc.launcher: incarnation 2 ---\n{"), processes[1].stdout


def test_a_killed_process_not_listed_fails_the_job_and_the_others_are_killed(tmp_path):
  pids = tmp_path / "pids"
  with pytest.raises(RuntimeError, match=r"rank 1 exited with -9(.|\n)*incarnation 0 stderr"):
    launcher.launch(_script(tmp_path), [1, 1, pids], nproc=3, respawn={2}, timeout_s=60)
  _all_gone(pids)


@pytest.mark.parametrize("respawn, match", [({5}, r"respawn ids \[5\]"),
                                            ({-1, 1}, r"respawn ids \[-1\]")])
def test_ids_outside_the_job_cannot_be_respawned(tmp_path, respawn, match):
  with pytest.raises(ValueError, match=match):
    launcher.launch(_script(tmp_path), [2, 1, ""], nproc=3, respawn=respawn)


@pytest.mark.parametrize("max_restarts", [-1, True, 1.5])
def test_max_restarts_is_a_count(tmp_path, max_restarts):
  with pytest.raises(ValueError, match="max_restarts must be an integer >= 0"):
    launcher.launch(_script(tmp_path), [2, 1, ""], nproc=3, respawn={2},
                    max_restarts=max_restarts)


@pytest.mark.parametrize("value, incarnation", [(None, 0), ("1", 1)])
def test_job_reads_the_incarnation_0_when_absent(monkeypatch, value, incarnation):
  for name, v in ((launcher.COORDINATOR, "127.0.0.1:1"), (launcher.NUM_PROCESSES, "3"),
                  (launcher.PROCESS_ID, "2"), (launcher.INCARNATION, value)):
    if v is None:
      monkeypatch.delenv(name, raising=False)
    else:
      monkeypatch.setenv(name, v)
  launcher.job.cache_clear()
  try:
    assert launcher.job() == launcher.Job("127.0.0.1:1", 3, 2, incarnation)
  finally:
    launcher.job.cache_clear()
