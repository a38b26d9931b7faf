"""The emulated cluster: 4 jax.distributed processes in shaped network namespaces.

Needs root and iproute2: skipped without them, except under CI (``CI`` set),
where that is a failure.
"""

import os
import time

import pytest
from testbed_helpers import namespaces, require

from jaxcc import launcher, testbed
from jaxcc.bench import allreduce
from jaxcc.testbed import netns

pytestmark = pytest.mark.multiprocess


def test_psum_and_optcc_agree_on_a_cluster_with_a_straggler():
  require()
  start = time.monotonic()
  with testbed.Cluster(4, rate="200mbit", stragglers={3: 0.5}) as cluster:
    prefix = f"{netns.PREFIX}{cluster.tag}-"
    assert len(namespaces(prefix)) == 4
    before = [cluster.bytes(i) for i in range(4)]
    # The benchmark's worker checks every result against the exact sum.
    results = allreduce.measure(cluster.topology, 1 << 20, ["psum", "optcc"], 3, cluster=cluster)
    after = [cluster.bytes(i) for i in range(4)]
  assert [r["process"] for r in results] == [0, 1, 2, 3]
  for b, a in zip(before, after):  # at least one MiB each way per rank per timed run
    assert a[0] - b[0] > 4 * (1 << 20) and a[1] - b[1] > 4 * (1 << 20), (b, a)
  assert all(min(r["samples"]["psum"] + r["samples"]["optcc"]) > 0 for r in results), results
  assert not namespaces(prefix), "teardown left namespaces behind"
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
  require()
  script = tmp_path / "fail.py"
  script.write_text("import os, sys, time\n"
                    f"if os.environ[{launcher.PROCESS_ID!r}] == '1':\n"
                    "  sys.exit('rank one gives up')\n"
                    "time.sleep(60)\n")
  start = time.monotonic()
  with pytest.raises(RuntimeError, match=r"rank 1 exited with 1(.|\n)*rank one gives up"):
    with testbed.Cluster(3) as cluster:
      prefix = f"{netns.PREFIX}{cluster.tag}-"
      launcher.launch(str(script), cluster=cluster, timeout_s=30)
  assert time.monotonic() - start < 20
  assert not namespaces(prefix)


def test_cleanup_stale_removes_a_crashed_runs_leftovers():
  require()
  cluster = testbed.Cluster(2).__enter__()  # a run that died without tearing down
  prefix = f"{netns.PREFIX}{cluster.tag}-"
  removed = testbed.cleanup_stale()
  assert {f"{prefix}0", f"{prefix}1", cluster.bridge} <= set(removed)
  assert not namespaces(prefix) and not os.path.exists(f"/sys/class/net/{cluster.bridge}")
