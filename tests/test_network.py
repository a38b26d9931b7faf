"""jaxcc.network across processes: the native probe and a measured network on loopback, and a
link changed by ``tc`` while a loop runs on the testbed (root or rootless; under CI it fails
rather than skips)."""

import json
import os
import tempfile
import threading
import time

import pytest
from testbed_helpers import require

from jaxcc import launcher, testbed

pytestmark = pytest.mark.multiprocess

WORKER = os.path.join(os.path.dirname(__file__), "network_worker.py")


def test_a_measured_loop_on_loopback_plans_on_its_probe_and_every_process_agrees():
  out = [p.json() for p in launcher.launch(
      WORKER, [json.dumps({"calls": 6, "fault": -1, "progress": ""})], nproc=3, timeout_s=300,
      env={"JAXCC_TIMEOUT_S": "60"})]
  events = out[0]["events"]
  assert events[0][:2] == [0, "probe"], events
  assert all(o["events"] == events and o["send_bandwidth"] == out[0]["send_bandwidth"]
             for o in out)
  assert all(b > 0 for b in out[0]["send_bandwidth"])
  traced = [tuple(t) for t in out[0]["traced"]]  # a new topology after call k: traced at k + 1
  used = sum(kind == "change" and step < 6 for step, kind, _ in events)
  assert 1 <= len(set(traced)) == len(traced) <= used + 1, (traced, events)


def test_probes_back_to_back_never_stall_a_receiver():
  """Thirty probes in a row on loopback, 8 MiB frames in each second pass: a frame whose last byte
  ended a read's byte budget once stalled its receiver until the timeout (1 probe in 4)."""
  out = [p.json() for p in launcher.launch(
      WORKER, [json.dumps({"probes": 30})], nproc=3, timeout_s=120,
      env={"JAXCC_TIMEOUT_S": "20"})]
  assert all(len(o["probe_seconds"]) == 30 for o in out), out


def test_a_tc_change_is_found_within_a_few_calls_and_the_next_calls_use_the_new_plan():
  require()
  fault, calls = 4, 16
  with testbed.Cluster(4, "200mbit") as cluster, tempfile.TemporaryDirectory() as tmp:
    progress = os.path.join(tmp, "progress")
    open(progress, "w").close()

    def degrade():
      deadline = time.monotonic() + 300
      while time.monotonic() < deadline:
        with open(progress) as f:
          if f.read().strip():
            cluster.set_rate(2, "100mbit")
            return
        time.sleep(0.02)

    threading.Thread(target=degrade, daemon=True).start()
    out = [p.json() for p in launcher.launch(
        WORKER, [json.dumps({"calls": calls, "fault": fault, "progress": progress})],
        cluster=cluster, timeout_s=300, env={"JAXCC_TIMEOUT_S": "60"})]
  events = out[0]["events"]
  changes = [step for step, kind, _ in events if kind == "change"]
  assert changes and fault < changes[0] <= fault + 5, events
  assert all(o["events"] == events for o in out)  # every process agreed, at the same call
  send = out[0]["send_bandwidth"]
  assert 0.4 < send[2] / send[0] < 0.6, send
  traced = out[0]["traced"]  # one trace per topology a call ran on, the last on the new one
  used = [step for step in changes if step < calls]
  assert len(traced) == len(used) + 1 and traced[1] != traced[0], (traced, events)
  if len(used) == len(changes):
    assert traced[-1] == send, (traced, send)
