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
