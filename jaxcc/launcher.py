"""Run a Python script as the ``nproc`` processes of one ``jax.distributed`` job.

``launch`` starts them on loopback (coordinator on 127.0.0.1, a free port) or
one per host of an entered ``jaxcc.testbed.Cluster`` (``Cluster.command``; the
coordinator on host 0), each with ``JAX_PLATFORMS=cpu``, ``local_devices``
virtual CPU devices and these variables:

  JAXCC_COORDINATOR    ``host:port`` of process 0's coordinator
  JAXCC_NUM_PROCESSES  the number of processes
  JAXCC_PROCESS_ID     this process' id, 0 to nproc - 1
  JAXCC_INCARNATION    0; 1 in a process that ``respawn`` started once more

The script calls ``join()`` to become its process of the job. A process whose
id is in ``respawn`` may be SIGKILLed once: the launcher then starts it again,
with ``JAXCC_INCARNATION=1``, within the same time limit. Every process
runs in its own process group, in the launcher's session (a session of its
own would put it in a scheduler autogroup of its own, which on a shared host
gave the native transport's progress threads 30-40% less time than in a real
job); before ``launch`` returns or raises (an error, a timeout, an
interrupt) it kills each process group, so no process it started, nor
any child of one, is left behind.
"""

from __future__ import annotations

import functools
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

import jax

from jaxcc._src.devices import virtual_cpu_environ

if TYPE_CHECKING:
  from jaxcc.testbed import Cluster

COORDINATOR, NUM_PROCESSES, PROCESS_ID, INCARNATION = (
    "JAXCC_COORDINATOR", "JAXCC_NUM_PROCESSES", "JAXCC_PROCESS_ID", "JAXCC_INCARNATION")
_TAIL = 4000
_NEXT = "--- jaxcc.launcher: incarnation {} ---\n"  # between a respawned process' outputs


class Process(NamedTuple):
  """What one process of a launch wrote: its id, stdout and stderr."""
  rank: int
  stdout: str
  stderr: str

  def json(self):
    """The JSON value on the last line of stdout; RuntimeError naming the rank if there is none."""
    lines = self.stdout.strip().splitlines()
    try:
      return json.loads(lines[-1])
    except (ValueError, IndexError) as e:
      raise RuntimeError(f"jaxcc.launcher: rank {self.rank} gave no JSON result ({e}); its "
                         f"stderr ends:\n{self.stderr[-_TAIL:]}") from None


class Job(NamedTuple):
  """A process' place in a launched job, as ``launch`` put it in the environment."""
  coordinator: str
  num_processes: int
  process_id: int
  incarnation: int


def launch(script: str, args: Sequence[str] = (), *, nproc: int | None = None,
           cluster: Cluster | None = None, local_devices: int = 1,
           env: Mapping[str, str] | None = None, timeout_s: float = 300,
           respawn: Collection[int] = ()) -> list[Process]:
  """Run ``python script *args`` as ``nproc`` processes (or one per host of ``cluster``).

  Args:
    script: path of the Python script every process runs.
    args: its command-line arguments, the same on every process.
    nproc: the number of processes on loopback; with ``cluster``, None or its size.
    cluster: an entered ``jaxcc.testbed.Cluster``: one process in each host's namespace.
    local_devices: virtual CPU devices per process.
    env: extra environment variables for every process (over the launcher's).
    timeout_s: limit for the whole job, a restart included.
    respawn: ids of processes that may be SIGKILLed once (status -9) and are then
      started again, the same command with ``JAXCC_INCARNATION=1``; not 0, whose
      process hosts the ``jax.distributed`` coordination service and its key-value store.

  Returns:
    Each process' output, by process id, once all exited with status 0. A respawned
    process' stdout and stderr are its first incarnation's, an ``incarnation 1`` line,
    then its second's, so ``json()`` gives the second's result.

  Raises:
    RuntimeError: a process exited with another status, or was SIGKILLed again; names
      it, its status and its stderr tail. Every other process is killed first.
    TimeoutError: the job ran past ``timeout_s``; names the processes still running.
  """
  if cluster is not None:
    if nproc not in (None, cluster.n):
      raise ValueError(f"jaxcc.launcher.launch: nproc={nproc} but the cluster has {cluster.n} "
                       "hosts; leave nproc out")
    nproc = cluster.n
  for name, value in (("nproc", nproc), ("local_devices", local_devices)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ValueError(f"jaxcc.launcher.launch: {name} must be a positive integer, got "
                       f"{value!r}")
  respawn = frozenset(respawn)
  if 0 in respawn:
    raise ValueError("jaxcc.launcher.launch: process 0 cannot be respawned: it hosts the "
                     "jax.distributed coordination service and its key-value store, and the "
                     "job ends with it")
  wrong = sorted((r for r in respawn if isinstance(r, bool) or r not in range(nproc)), key=str)
  if wrong:
    raise ValueError(f"jaxcc.launcher.launch: respawn ids {wrong} are not process ids "
                     f"0 to {nproc - 1}")
  base = dict(os.environ, **virtual_cpu_environ(local_devices))
  base.update({COORDINATOR: _coordinator(cluster), NUM_PROCESSES: str(nproc)}, **(env or {}))
  outs, errs = [[] for _ in range(nproc)], [[] for _ in range(nproc)]  # one file per incarnation
  procs = []

  def start(i: int) -> subprocess.Popen:
    for files in (outs[i], errs[i]):
      files.append(tempfile.TemporaryFile("w+"))
    where = [] if cluster is None else cluster.command(i)
    return subprocess.Popen(
        [*where, sys.executable, script, *map(str, args)],
        env=dict(base, **{PROCESS_ID: str(i), INCARNATION: str(len(outs[i]) - 1)}),
        stdout=outs[i][-1], stderr=errs[i][-1], text=True, process_group=0)

  def poll() -> list[int | None]:
    """Each process' status, every one polled; a respawn id's first SIGKILL starts it again."""
    for i, p in enumerate(procs):
      if p.poll() == -signal.SIGKILL and i in respawn and len(outs[i]) == 1:
        _kill([p])  # its children too: that incarnation is over
        procs[i] = start(i)
    return [p.returncode for p in procs]

  try:
    for i in range(nproc):
      procs.append(start(i))
    deadline = time.monotonic() + timeout_s
    while None in poll():
      failed = [i for i, p in enumerate(procs) if p.returncode not in (None, 0)]
      if failed:
        raise _failure(procs, failed[0], errs)
      if time.monotonic() > deadline:
        running = [i for i, p in enumerate(procs) if p.poll() is None]
        _kill(procs)
        raise TimeoutError(f"jaxcc.launcher.launch: processes {running} still ran after "
                           f"{timeout_s:g} s; process {running[0]}'s stderr ends:\n"
                           f"{_read(errs[running[0]])[-_TAIL:]}")
      time.sleep(0.05)
    failed = [i for i, p in enumerate(procs) if p.returncode]
    if failed:
      raise _failure(procs, failed[0], errs)
    return [Process(i, _read(o), _read(e)) for i, (o, e) in enumerate(zip(outs, errs))]
  finally:
    _kill(procs)
    for files in outs + errs:
      for f in files:
        f.close()


@functools.cache
def job() -> Job | None:
  """This process' place in the job that ``launch`` started it in; None if it did not."""
  if COORDINATOR not in os.environ:
    return None
  return Job(os.environ[COORDINATOR], int(os.environ[NUM_PROCESSES]),
             int(os.environ[PROCESS_ID]), int(os.environ.get(INCARNATION, "0")))


def join(timeout_s: float = 120) -> Job:
  """Become this process' member of the launched job: ``jax.distributed`` over gloo.

  With more than one process, sets gloo as XLA's CPU collectives and calls
  ``jax.distributed.initialize`` (waiting up to ``timeout_s`` for the others);
  a job of one process has no one to join. Call it before jax computes anything.

  Raises:
    RuntimeError: this process was not started by ``launch``.
  """
  me = job()
  if me is None:
    raise RuntimeError(f"jaxcc.launcher.join: {COORDINATOR} is not set; start this script with "
                       "jaxcc.launcher.launch")
  if me.num_processes > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(me.coordinator, me.num_processes, me.process_id,
                               initialization_timeout=int(timeout_s))
  return me


def _coordinator(cluster: Cluster | None) -> str:
  if cluster is not None:  # the namespaces are the job's own: no one else listens there
    return f"{cluster.address(0)}:{random.randint(20000, 40000)}"
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return f"127.0.0.1:{s.getsockname()[1]}"


def _failure(procs: list[subprocess.Popen], i: int, errs) -> RuntimeError:
  status = procs[i].returncode
  _kill(procs)
  return RuntimeError(f"jaxcc.launcher.launch: rank {i} exited with {status}; its stderr "
                      f"ends:\n{_read(errs[i])[-_TAIL:]}")


def _read(files) -> str:
  """A process' output: each incarnation's text, the later ones after an ``incarnation N`` line."""
  text = ""
  for n, f in enumerate(files):
    f.seek(0)
    if n:
      text += ("\n" if text and not text.endswith("\n") else "") + _NEXT.format(n)
    text += f.read()
  return text


def _kill(procs: list[subprocess.Popen]) -> None:
  """SIGKILL each process' group (its children too) and reap it."""
  for p in procs:
    try:
      os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
      pass
    p.wait()
