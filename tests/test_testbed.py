"""The emulated cluster: 4 jax.distributed processes in shaped network namespaces.

Needs root and iproute2: skipped without them, except under CI (``CI`` set),
where that is a failure.
"""

import json
import os
import subprocess
import time

import pytest

from jaxcc import testbed
from jaxcc.testbed import netns

pytestmark = pytest.mark.multiprocess

WORKER = os.path.join(os.path.dirname(__file__), "testbed_worker.py")
MIB_F32 = 1 << 18


def _require():
  try:
    testbed.require_privileges()
  except RuntimeError as e:
    if os.environ.get("CI"):
      pytest.fail(f"CI must run the testbed test: {e}")
    pytest.skip(str(e))


def _namespaces(prefix):
  out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
  return [line.split()[0] for line in out.splitlines() if line.startswith(prefix)]


def test_psum_and_optcc_agree_on_a_cluster_with_a_straggler():
  _require()
  start = time.monotonic()
  with testbed.Cluster(4, rate="200mbit", stragglers={3: 0.5}) as cluster:
    prefix = f"{netns.PREFIX}{cluster.tag}-"
    assert len(_namespaces(prefix)) == 4
    before = [cluster.bytes(i) for i in range(4)]
    bandwidths = json.dumps(list(cluster.topology.send_bandwidth))
    results = testbed.launch(cluster, WORKER, [bandwidths, MIB_F32, 3], timeout_s=150,
                             env={"JAXCC_TIMEOUT_S": "60"})
    after = [cluster.bytes(i) for i in range(4)]
  assert [r["rank"] for r in results] == [0, 1, 2, 3]
  for b, a in zip(before, after):  # at least one MiB each way per rank per timed run
    assert a[0] - b[0] > 4 * (1 << 20) and a[1] - b[1] > 4 * (1 << 20), (b, a)
  assert all(r["psum"] > 0 and r["optcc"] > 0 for r in results), results
  assert not _namespaces(prefix), "teardown left namespaces behind"
  assert not os.path.exists(os.path.join(netns.NETNS_ETC, f"{prefix}0"))
  print(f"testbed: {results} in {time.monotonic() - start:.1f} s")


def test_without_root_the_error_names_what_is_missing(monkeypatch):
  monkeypatch.setattr(os, "geteuid", lambda: 1000)
  monkeypatch.setattr(netns.shutil, "which", lambda tool: None if tool == "tc" else "/x/ip")
  with pytest.raises(RuntimeError, match=r"needs root .* and the 'tc' command"):
    with testbed.Cluster(2):
      pass


def test_rates_parse_and_stragglers_scale_them():
  c = testbed.Cluster(3, rate="200mbit", stragglers={1: 0.25})
  assert c.rates == (200e6, 50e6, 200e6)
  assert c.topology.send_bandwidth == (25e6, 6.25e6, 25e6)
  assert testbed.parse_rate(1e9) == 1e9
  with pytest.raises(ValueError):
    testbed.parse_rate("fast")


def test_a_failing_rank_kills_the_others_and_is_named(tmp_path):
  _require()
  script = tmp_path / "fail.py"
  script.write_text("import os, sys, time\n"
                    "if os.environ['JAXCC_TESTBED_PROCESS_ID'] == '1':\n"
                    "  sys.exit('rank one gives up')\n"
                    "time.sleep(60)\n")
  start = time.monotonic()
  with pytest.raises(RuntimeError, match=r"rank 1 exited with 1(.|\n)*rank one gives up"):
    with testbed.Cluster(3) as cluster:
      prefix = f"{netns.PREFIX}{cluster.tag}-"
      testbed.launch(cluster, str(script), timeout_s=30)
  assert time.monotonic() - start < 20
  assert not _namespaces(prefix)


def test_cleanup_stale_removes_a_crashed_runs_leftovers():
  _require()
  cluster = testbed.Cluster(2).__enter__()  # a run that died without tearing down
  prefix = f"{netns.PREFIX}{cluster.tag}-"
  removed = testbed.cleanup_stale()
  assert {f"{prefix}0", f"{prefix}1", cluster.bridge} <= set(removed)
  assert not _namespaces(prefix) and not os.path.exists(f"/sys/class/net/{cluster.bridge}")
