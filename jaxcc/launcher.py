"""Run a Python script as the ``nproc`` processes of one ``jax.distributed`` job.

``launch`` starts the job's coordination service (the ``jax.distributed``
key-value store and heartbeats) in a process of its own, apart from the
workers, then the workers: on loopback (the service on 127.0.0.1, a free
port) or one per host of an entered ``jaxcc.testbed.Cluster``
(``Cluster.command``; the service in host 0's namespace), each with
``JAX_PLATFORMS=cpu``, ``local_devices`` virtual CPU devices and these
variables:

  JAXCC_COORDINATOR    ``host:port`` of the job's coordination service
  JAXCC_NUM_PROCESSES  the number of processes
  JAXCC_PROCESS_ID     this process' id, 0 to nproc - 1
  JAXCC_INCARNATION    0; k in a process that ``respawn`` started k more times

The script calls ``join()`` to become its process of the job: a client of
the service, process 0 like any other, so any worker may die without ending
the job. The service marks every worker recoverable: a dead worker is
reported to no other (jaxcc's TCP transport finds lost peers itself). If the
service process dies, every worker's coordination agent ends its process at
once (jaxlib aborts on a lost service and offers no hook: its
``missed_heartbeat_callback`` cannot be called from Python), and ``launch``
raises naming the service; so does a worker's agent, for its own process
only, once its connection to the service breaks (a cut of 20 s on the
testbed may: the service resets it). A process whose id is in ``respawn`` may be
SIGKILLed or so aborted up to ``max_restarts`` times: the launcher then starts
it again, with ``JAXCC_INCARNATION`` one more, within the same time limit.
Every process runs in its own process group, in the launcher's session (a
session of its own would put it in a scheduler autogroup of its own, which on
a shared host gave the native transport's progress threads 30-40% less time
than in a real job); before ``launch`` returns or raises (an error, a
timeout, an interrupt) it kills each process group, the service's too, so no
process it started, nor any child of one, is left behind.
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

from jaxcc._src import compat
from jaxcc._src.devices import virtual_cpu_environ

if TYPE_CHECKING:
  from jaxcc.testbed import Cluster

COORDINATOR, NUM_PROCESSES, PROCESS_ID, INCARNATION = (
    "JAXCC_COORDINATOR", "JAXCC_NUM_PROCESSES", "JAXCC_PROCESS_ID", "JAXCC_INCARNATION")
HEARTBEAT_TIMEOUT_S = 100  # jax's default: a worker silent this long is marked failed
_TAIL = 4000
_DEATHS = (-signal.SIGKILL, -signal.SIGABRT)  # the statuses of a process respawn restarts
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
           respawn: Collection[int] = (), max_restarts: int = 1) -> list[Process]:
  """Run ``python script *args`` as ``nproc`` processes (or one per host of ``cluster``).

  Args:
    script: path of the Python script every process runs.
    args: its command-line arguments, the same on every process.
    nproc: the number of processes on loopback; with ``cluster``, None or its size.
    cluster: an entered ``jaxcc.testbed.Cluster``: one process in each host's namespace.
    local_devices: virtual CPU devices per process.
    env: extra environment variables for every process (over the launcher's).
    timeout_s: limit for the whole job, a restart included.
    respawn: ids of processes that may die, SIGKILLed or aborted (status -9 or -6:
      jax's coordination agent aborts a process whose connection to the service broke,
      as a cut of 20 s may break it), and are then started again, the same command with
      ``JAXCC_INCARNATION`` one more (1 after the first death); process 0 too.
    max_restarts: how many times each of them may be started again.

  Returns:
    Each process' output, by process id, once all exited with status 0. A respawned
    process' stdout and stderr are its incarnations' in turn, each after an
    ``incarnation k`` line but the first, so ``json()`` gives the last one's result.

  Raises:
    RuntimeError: a process exited with another status, or died past its restarts, or the
      coordination service ended; names it, its status and its stderr tail. Every other
      process is killed first.
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
  if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
    raise ValueError(f"jaxcc.launcher.launch: max_restarts must be an integer >= 0, got "
                     f"{max_restarts!r}")
  respawn = frozenset(respawn)
  wrong = sorted((r for r in respawn if isinstance(r, bool) or r not in range(nproc)), key=str)
  if wrong:
    raise ValueError(f"jaxcc.launcher.launch: respawn ids {wrong} are not process ids "
                     f"0 to {nproc - 1}")
  base = dict(os.environ, **virtual_cpu_environ(local_devices))
  coordinator = _coordinator(cluster)
  base.update({COORDINATOR: coordinator, NUM_PROCESSES: str(nproc)}, **(env or {}))
  outs, errs = [[] for _ in range(nproc)], [[] for _ in range(nproc)]  # one file per incarnation
  procs = []
  service_log = tempfile.TemporaryFile("w+")
  services = [subprocess.Popen(  # a job of one process joins no service
      [*([] if cluster is None else cluster.command(0)), sys.executable, "-m", __name__,
       "--serve", coordinator, str(nproc)],
      env=base, stdout=service_log, stderr=subprocess.STDOUT, text=True,
      process_group=0)] if nproc > 1 else []

  def start(i: int) -> subprocess.Popen:
    for files in (outs[i], errs[i]):
      files.append(tempfile.TemporaryFile("w+"))
    where = [] if cluster is None else cluster.command(i)
    return subprocess.Popen(
        [*where, sys.executable, script, *map(str, args)],
        env=dict(base, **{PROCESS_ID: str(i), INCARNATION: str(len(outs[i]) - 1)}),
        stdout=outs[i][-1], stderr=errs[i][-1], text=True, process_group=0)

  def poll() -> list[int | None]:
    """Each process' status, every one polled; a respawn id's death starts it again, up to
    ``max_restarts`` times."""
    for i, p in enumerate(procs):
      if p.poll() in _DEATHS and i in respawn and len(outs[i]) <= max_restarts:
        _kill([p])  # its children too: that incarnation is over
        procs[i] = start(i)
    return [p.returncode for p in procs]

  try:
    for i in range(nproc):
      procs.append(start(i))
    deadline = time.monotonic() + timeout_s
    while None in poll():
      if any(s.poll() is not None for s in services):
        _kill(procs)
        service_log.seek(0)
        raise RuntimeError(f"jaxcc.launcher.launch: the coordination service exited with "
                           f"{services[0].returncode}; its output ends:\n"
                           f"{service_log.read()[-_TAIL:]}")
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
    _kill(procs + services)
    service_log.close()
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

  With more than one process, sets gloo as XLA's CPU collectives and connects
  to the launcher's coordination service as a client (``jax.distributed``
  initialized, waiting up to ``timeout_s`` for the others; process 0 hosts no
  service); a job of one process has no one to join. Call it before jax
  computes anything.

  Raises:
    RuntimeError: this process was not started by ``launch``.
  """
  me = job()
  if me is None:
    raise RuntimeError(f"jaxcc.launcher.join: {COORDINATOR} is not set; start this script with "
                       "jaxcc.launcher.launch")
  if me.num_processes > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    compat.connect_to_coordination(me.coordinator, me.num_processes, me.process_id,
                                   int(timeout_s), HEARTBEAT_TIMEOUT_S, me.incarnation > 0)
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


def _serve(address: str, num_processes: int) -> None:
  """The job's coordination service, until the launcher kills it."""
  service = compat.serve_coordination(address, num_processes, HEARTBEAT_TIMEOUT_S)
  try:
    signal.pause()
  finally:
    service.shutdown()


if __name__ == "__main__":
  if sys.argv[1:2] != ["--serve"] or len(sys.argv) != 4:
    sys.exit("usage: python -m jaxcc.launcher --serve HOST:PORT NUM_PROCESSES")
  _serve(sys.argv[2], int(sys.argv[3]))
