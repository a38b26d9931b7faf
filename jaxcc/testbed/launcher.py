"""Run a JAX program as one ``jax.distributed`` process per host of a testbed ``Cluster``.

The script runs as ``ip netns exec <namespace> python script *args`` with
``JAX_PLATFORMS=cpu``, gloo as XLA's CPU collectives, one CPU device
(``XLA_FLAGS`` removed), and these variables, which it passes to
``jax.distributed.initialize(coordinator, num_processes, process_id)``:

  JAXCC_TESTBED_COORDINATOR  ``10.77.0.1:<port>`` (host 0)
  JAXCC_TESTBED_NUM_PROCESSES
  JAXCC_TESTBED_PROCESS_ID

Its result is the JSON object on the last line of its stdout.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence

from jaxcc.testbed.netns import Cluster

_TAIL = 4000


def _tail(f) -> str:
  f.seek(0)
  return f.read()[-_TAIL:]


def launch(cluster: Cluster, script: str, args: Sequence[str] = (), timeout_s: float = 300,
           env: Mapping[str, str] | None = None) -> list:
  """Run ``script`` on every host of ``cluster``; return each rank's JSON result, by rank.

  Args:
    cluster: an entered ``Cluster``.
    script: path of the Python script each process runs.
    args: its command-line arguments, the same on every rank.
    timeout_s: limit for the whole job.
    env: extra environment variables for every process.

  Returns:
    The JSON value each rank printed last on its stdout, in rank order.

  Raises:
    RuntimeError: a rank failed (exited non-zero or printed no JSON); names it with its
      stderr tail. Every other process is killed first.
    TimeoutError: the job ran past ``timeout_s``; names the ranks still running.
  """
  port = random.randint(20000, 40000)  # the namespaces are the job's own: no one else listens
  base = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  base.update(JAX_PLATFORMS="cpu", JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo",
              JAXCC_TESTBED_COORDINATOR=f"{cluster.address(0)}:{port}",
              JAXCC_TESTBED_NUM_PROCESSES=str(cluster.n), **(env or {}))
  outs = [tempfile.TemporaryFile("w+") for _ in range(cluster.n)]
  errs = [tempfile.TemporaryFile("w+") for _ in range(cluster.n)]
  procs = []
  try:
    for i in range(cluster.n):
      procs.append(subprocess.Popen(
          ["ip", "netns", "exec", cluster.netns(i), sys.executable, script, *map(str, args)],
          env=dict(base, JAXCC_TESTBED_PROCESS_ID=str(i)), stdout=outs[i], stderr=errs[i],
          text=True, start_new_session=True))
    deadline = time.monotonic() + timeout_s
    while [p.poll() for p in procs].count(None):
      failed = [i for i, p in enumerate(procs) if p.returncode not in (None, 0)]
      if failed:
        i = failed[0]
        _kill(procs)
        raise RuntimeError(f"testbed: rank {i} exited with {procs[i].returncode}; "
                           f"its stderr ends:\n{_tail(errs[i])}")
      if time.monotonic() > deadline:
        running = [i for i, p in enumerate(procs) if p.poll() is None]
        _kill(procs)
        raise TimeoutError(f"testbed: ranks {running} still ran after {timeout_s} s; rank "
                           f"{running[0]}'s stderr ends:\n{_tail(errs[running[0]])}")
      time.sleep(0.1)
    results = []
    for i, p in enumerate(procs):
      lines = _tail(outs[i]).strip().splitlines()
      try:
        if p.returncode:
          raise ValueError(f"exit status {p.returncode}")
        results.append(json.loads(lines[-1]))
      except (ValueError, IndexError) as e:
        raise RuntimeError(f"testbed: rank {i} gave no JSON result ({e}); its stderr ends:\n"
                           f"{_tail(errs[i])}") from None
    return results
  finally:
    _kill(procs)
    for f in outs + errs:
      f.close()


def _kill(procs: list[subprocess.Popen]) -> None:
  for p in procs:
    if p.poll() is None:
      try:
        os.killpg(p.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
      p.wait()
