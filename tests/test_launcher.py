"""jaxcc.launcher on loopback: a jax.distributed job, its output, failures, time limits, teardown.

And ``use_virtual_cpu_devices`` once jax has started (conftest asked for 8).
"""

import os
import textwrap

import jax
import pytest

from jaxcc import launcher
from jaxcc._src.devices import use_virtual_cpu_devices

pytestmark = pytest.mark.multiprocess

JOIN = """
import json
import jax
import numpy as np
from jaxcc.launcher import join
me = join()
n = jax.device_count()
mesh = jax.make_mesh((n,), ("x",))
x = jax.make_array_from_callback((n,), jax.NamedSharding(mesh, jax.P("x")),
                                 lambda i: np.array([i[0].start], np.float32))
total = jax.jit(jax.shard_map(lambda b: jax.lax.psum(b, "x"), mesh=mesh, in_specs=jax.P("x"),
                              out_specs=jax.P()))(x)
print(json.dumps({"me": list(me), "devices": [n, jax.local_device_count()],
                  "sum": float(total.addressable_shards[0].data[0])}))
"""


def _script(tmp_path, name, text):
  path = tmp_path / name
  path.write_text(textwrap.dedent(text))
  return str(path)


def test_a_job_joins_over_gloo_and_returns_each_process_output(tmp_path):
  processes = launcher.launch(_script(tmp_path, "join.py", JOIN), nproc=3, local_devices=2,
                              timeout_s=120)
  results = [p.json() for p in processes]
  assert [p.rank for p in processes] == [0, 1, 2]
  assert [r["me"][1:] for r in results] == [[3, 0, 0], [3, 1, 0], [3, 2, 0]]
  assert all(r["me"][0].startswith("127.0.0.1:") for r in results)
  assert all(r["devices"] == [6, 2] and r["sum"] == 15.0 for r in results), results


def test_a_failing_process_is_named_and_the_others_are_killed(tmp_path):
  pids = tmp_path / "pids"
  script = _script(tmp_path, "fail.py", f"""
      import os, sys, time
      with open({str(pids)!r}, "a") as f:
        f.write(f"{{os.getpid()}}\\n")
      if os.environ[{launcher.PROCESS_ID!r}] == "1":
        time.sleep(0.5)
        sys.exit("rank one gives up")
      time.sleep(600)
      """)
  with pytest.raises(RuntimeError, match=r"launch: rank 1 exited with 1(.|\n)*rank one gives up"):
    launcher.launch(script, nproc=3, timeout_s=120)
  for pid in map(int, pids.read_text().split()):
    with pytest.raises(ProcessLookupError):
      os.kill(pid, 0)


def test_process_0_dies_and_the_others_keep_the_key_value_store_and_take_it_back(tmp_path):
  """The coordination service runs apart: process 0 SIGKILLed, the others use the store on."""
  script = _script(tmp_path, "zero.py", """
      import json, os, signal
      import jax
      from jaxcc import launcher
      from jaxcc._src import compat
      me = launcher.join()
      devices = jax.device_count()  # the CPU client's topology, through the store
      if me.process_id == 0 and me.incarnation == 0:
        compat.kv_set("zero/first", str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
      first = compat.kv_get("zero/first", 60)
      if me.process_id == 0:
        compat.kv_set("zero/back", "1")
      print(json.dumps({"first": first, "back": compat.kv_get("zero/back", 60),
                        "devices": devices}))
      """)
  processes = launcher.launch(script, nproc=3, local_devices=2, respawn={0}, timeout_s=120)
  results = [p.json() for p in processes]
  assert all(r["back"] == "1" and r["first"] == results[0]["first"] for r in results), results
  assert all(r["devices"] == 6 for r in results), results
  assert "incarnation 1" in processes[0].stdout


def test_the_coordination_service_ending_is_named_and_every_process_is_killed(tmp_path):
  pids = tmp_path / "pids"
  script = _script(tmp_path, "service.py", f"""
      import os, signal, time
      from jaxcc import launcher
      me = launcher.join()
      with open({str(pids)!r}, "a") as f:
        f.write(f"{{os.getpid()}}\\n")
      if me.process_id == 1:  # the service is the process that serves this job's address
        for pid in filter(str.isdigit, os.listdir("/proc")):
          with open(f"/proc/{{pid}}/cmdline", "rb") as f:
            argv = f.read().split(b"\\0")
          if b"--serve" in argv and me.coordinator.encode() in argv:
            os.kill(int(pid), signal.SIGKILL)
      time.sleep(600)
      """)
  with pytest.raises(RuntimeError, match="the coordination service exited with -9"):
    launcher.launch(script, nproc=3, timeout_s=120)
  for pid in map(int, pids.read_text().split()):
    with pytest.raises(ProcessLookupError):
      os.kill(pid, 0)


def test_a_job_past_its_time_limit_is_killed_naming_who_still_ran(tmp_path):
  script = _script(tmp_path, "slow.py", f"""
      import os, sys, time
      if os.environ[{launcher.PROCESS_ID!r}] == "0":
        sys.exit(0)
      print("still here", file=sys.stderr, flush=True)
      time.sleep(600)
      """)
  with pytest.raises(TimeoutError, match=r"processes \[1\] still ran after 3 s(.|\n)*still here"):
    launcher.launch(script, nproc=2, timeout_s=3)


def test_a_process_without_json_and_one_not_launched_say_so(tmp_path):
  quiet = launcher.launch(_script(tmp_path, "quiet.py", "print('no json')\n"), nproc=1)
  assert quiet[0].stdout == "no json\n"
  with pytest.raises(RuntimeError, match="rank 0 gave no JSON result"):
    quiet[0].json()
  assert launcher.job() is None
  with pytest.raises(RuntimeError, match="launcher.join: JAXCC_COORDINATOR is not set"):
    launcher.join()


def test_virtual_devices_after_jax_started_need_no_more_than_there_are():
  have = len(jax.devices("cpu"))
  use_virtual_cpu_devices(have)
  with pytest.raises(RuntimeError, match=f"already started with {have} CPU device"):
    use_virtual_cpu_devices(have + 1)
  with pytest.raises(ValueError):
    use_virtual_cpu_devices(0)
