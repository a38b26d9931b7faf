"""The emulated cluster: 4 jax.distributed processes in shaped network namespaces.

Needs root and iproute2: skipped without them, except under CI (``CI`` set),
where that is a failure.
"""

import os
import subprocess
import sys
import time

import pytest
from testbed_helpers import namespaces, require

import jaxcc
from jaxcc import launcher, testbed
from jaxcc.bench import collective
from jaxcc.schedules.hierarchical import cross_cluster_bytes
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
    results = collective.measure("all_reduce", cluster.topology, 1 << 20, ["psum", "optcc"], 3,
                                 cluster=cluster)
    after = [cluster.bytes(i) for i in range(4)]
  assert [r["process"] for r in results] == [0, 1, 2, 3]
  for b, a in zip(before, after):  # at least one MiB each way per rank per timed run
    assert a[0] - b[0] > 4 * (1 << 20) and a[1] - b[1] > 4 * (1 << 20), (b, a)
  assert all(min(r["samples"]["psum"] + r["samples"]["optcc"]) > 0 for r in results), results
  assert not namespaces(prefix), "teardown left namespaces behind"
  print(f"testbed: {results} in {time.monotonic() - start:.1f} s")


def test_the_rootless_mode_builds_the_same_cluster_and_leaves_nothing(monkeypatch):
  require()
  monkeypatch.setenv("JAXCC_TESTBED_MODE", "rootless")  # as any user; here forced as root
  with testbed.Cluster(4, rate="200mbit", stragglers={3: 0.5}, clusters=(2, 2),
                       inter_rate="100mbit") as cluster:
    assert cluster.mode == "rootless"
    assert sorted(cluster.namespaces()) == [f"{netns.PREFIX}{cluster.tag}-{i}" for i in range(4)]
    assert not namespaces(f"{netns.PREFIX}{cluster.tag}-"), "built in the host's namespaces"
    results = collective.measure("all_reduce", cluster.topology, 1 << 20, ["psum", "optcc"], 2,
                                 cluster=cluster)
    sent, received = cluster.bytes(3)
    inter = cluster.level_bytes(3)["inter"]
    holder = cluster._holder
  assert [r["process"] for r in results] == [0, 1, 2, 3]
  assert sent > 2 * (1 << 20) and received > 2 * (1 << 20), (sent, received)
  assert inter[0] > 1 << 19 and inter[1] > 1 << 19, inter
  assert holder.poll() is not None and cluster.namespaces() == []


def test_without_the_tools_the_error_names_them(monkeypatch):
  monkeypatch.setattr(netns.shutil, "which",
                      lambda tool, path=None: None if tool == "tc" else f"/x/{tool}")
  with pytest.raises(RuntimeError, match=r"needs the commands 'tc' \(iproute2\)"):
    with testbed.Cluster(2):
      pass


def test_without_root_or_user_namespaces_the_error_says_how_to_enable_them(monkeypatch):
  monkeypatch.setattr(os, "geteuid", lambda: 1000)
  monkeypatch.setattr(netns.shutil, "which", lambda tool, path=None: f"/x/{tool}")
  monkeypatch.setattr(netns.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
      a[0], 1, "", "unshare: unshare failed: Operation not permitted"))
  with pytest.raises(RuntimeError, match=r"needs root or unprivileged user namespaces.*"
                                         r"Operation not permitted.*sysctl -w"):
    with testbed.Cluster(2):
      pass
  monkeypatch.setenv("JAXCC_TESTBED_MODE", "root")
  with pytest.raises(RuntimeError, match="JAXCC_TESTBED_MODE=root needs root"):
    testbed.mode()


def test_rates_parse_and_stragglers_scale_them():
  c = testbed.Cluster(3, rate="200mbit", stragglers={1: 0.25})
  assert c.rates == (200e6, 50e6, 200e6)
  assert c.topology.send_bandwidth == (25e6, 6.25e6, 25e6)
  assert testbed.parse_rate(1e9) == 1e9
  clustered = testbed.Cluster(5, rate="200mbit", stragglers={1: 0.5}, clusters=(2, 3),
                              inter_rate="20mbit", inter_stragglers={3: 0.25})
  assert clustered.topology == jaxcc.Topology.clusters([2, 3], 25e6, 2.5e6).with_straggler(
      1, 0.5, "intra").with_straggler(3, 0.25, "inter")
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


def test_two_clusters_sum_like_numpy_and_count_the_formulas_cross_cluster_bytes():
  require()
  nbytes = 1 << 20
  rows = collective.run("all_reduce", 4, nbytes, rate="200mbit", clusters=(2, 2),
                        inter_rate="50mbit", algorithms=["hierarchical"], repeats=1,
                        testbed=True, link_efficiency=1.0, progress=False)
  # The worker checked every rank's result against numpy's exact sum.
  for r in rows:
    expected = cross_cluster_bytes("all_reduce", nbytes, 2)
    assert r["inter_cluster_bytes_expected"] == expected, r
    # Above the payload, measured at 1 and 4 MiB: 1.7% of it (TCP/IP headers, ACKs) and 27 KB
    # whatever the size (the line-up psums over gloo, frame headers, beats): 3.0% at 1 MiB.
    assert 1.0 <= r["inter_cluster_bytes_measured"] / expected < 1.05, r
    assert r["measured_s"] > 0.8 * r["lower_bound_s"], r


def test_a_clustered_host_has_two_ports_counted_apart():
  require()
  with testbed.Cluster(3, rate="200mbit", clusters=(2, 1), inter_rate="20mbit",
                       inter_stragglers={2: 0.5}) as cluster:
    assert cluster.link_rate(0, 1) == 200e6 and cluster.link_rate(0, 2) == 10e6
    topology = cluster.topology
    assert topology.cluster == (0, 0, 1) and topology.inter_send_bandwidth == (2.5e6, 2.5e6, 1.25e6)
    before = [cluster.level_bytes(i) for i in range(3)]
    script = ("import socket, sys\n"
              "s = socket.create_connection(sys.argv[1:3])\n"
              "s.sendall(bytes(1 << 20)); s.close()\n")
    server = subprocess.Popen(["ip", "netns", "exec", cluster.netns(2), sys.executable, "-c",
                               "import socket\nl = socket.create_server(('', 5201))\n"
                               "c, _ = l.accept()\nwhile c.recv(1 << 16): pass\n"])
    time.sleep(0.5)
    subprocess.run(["ip", "netns", "exec", cluster.netns(0), sys.executable, "-c", script,
                    cluster.address(2), "5201"], check=True, timeout=30)
    server.wait(timeout=30)
    after = [cluster.level_bytes(i) for i in range(3)]
    cluster.set_rate(2, "40mbit", level="inter")
    assert cluster.inter_rates[2] == 40e6
  sent = after[0]["inter"][0] - before[0]["inter"][0]
  received = after[2]["inter"][1] - before[2]["inter"][1]
  assert 1 << 20 <= sent < 1.03 * (1 << 20) and 1 << 20 <= received < 1.03 * (1 << 20)
  assert after[0]["intra"][0] - before[0]["intra"][0] < 10_000  # nothing went to rank 1
  with pytest.raises(ValueError, match="sum to n"):
    testbed.Cluster(3, clusters=(2, 2))
  with pytest.raises(ValueError, match="need clusters"):
    testbed.Cluster(3, inter_rate="20mbit")
