"""The native executor across processes: 4 jax.distributed processes x 2 CPU devices on loopback.

Each test launches tests/multiprocess_worker.py with ``jaxcc.launcher``, so
gloo is XLA's CPU collectives and lax and the XLA executor run across
processes too.
"""

import logging
import os
import re
import socket
import threading
import time

import pytest

from jaxcc import launcher
from jaxcc._src import tcp_bootstrap

pytestmark = pytest.mark.multiprocess

WORKER = os.path.join(os.path.dirname(__file__), "multiprocess_worker.py")


def launch(mode, **env):
  """Run the worker as 4 processes of 2 CPU devices; each one's output, by process."""
  return launcher.launch(WORKER, [mode], nproc=4, local_devices=2, env=env, timeout_s=150)


def test_every_collective_and_algorithm_matches_xla_and_lax():
  for p in launch("check", JAXCC_TIMEOUT_S="30"):
    assert "OK" in p.stdout, f"process {p.rank}:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}"


def test_a_killed_process_fails_its_peers_naming_it_within_the_timeout():
  start = time.monotonic()
  results = launch("kill", JAXCC_TIMEOUT_S="5")
  for p in results[:-1]:
    m = re.search(r"FAILED after ([\d.]+) s: (.*)", p.stdout, re.S)
    assert m, f"process {p.rank}:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}"
    assert float(m.group(1)) < 5 + 3, m.group(0)
    assert re.search(r"rank [67] \(process 3\)", m.group(2)), m.group(2)
    assert re.search(r"step \d+", m.group(2)), m.group(2)
  assert time.monotonic() - start < 90


def test_a_connection_without_the_secret_is_closed_and_reported(caplog):
  secret = b"s" * 32
  listener = socket.create_server(("127.0.0.1", 0))
  address = listener.getsockname()
  peers = {}
  accept = threading.Thread(target=lambda: peers.update(tcp_bootstrap.accept_peers(
      listener, secret, 1, {0}, time.monotonic() + 30)))
  with caplog.at_level(logging.WARNING, logger="jaxcc"):
    accept.start()
    with socket.create_connection(address) as intruder:
      intruder.sendall(tcp_bootstrap.handshake(b"JAXCC-HI", b"x" * 32, 0, 1))
      assert intruder.recv(100) == b""  # closed without an answer
    with socket.create_connection(address) as peer:
      peer.sendall(tcp_bootstrap.handshake(b"JAXCC-HI", secret, 0, 1))
      assert peer.recv(100) == tcp_bootstrap.handshake(b"JAXCC-OK", secret, 1, 0)
      accept.join(30)
  listener.close()
  assert list(peers) == [0]
  peers[0].close()
  assert any("failed the handshake" in r.getMessage() for r in caplog.records)
