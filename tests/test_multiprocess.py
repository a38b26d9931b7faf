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
import types

import pytest

from jaxcc import launcher
from jaxcc._src import tcp_bootstrap

pytestmark = pytest.mark.multiprocess

WORKER = os.path.join(os.path.dirname(__file__), "multiprocess_worker.py")
# The job's limit is scaled by JAXCC_TEST_TIMEOUT_SCALE: `make sanitize` runs the
# workers under ASan, about 1.6 times as slow.
TIMEOUT_S = 150 * float(os.environ.get("JAXCC_TEST_TIMEOUT_SCALE", "1"))


def launch(mode, local_devices=2, **env):
  """Run the worker as 4 processes of ``local_devices`` CPU devices; each one's output, by
  process."""
  return launcher.launch(WORKER, [mode], nproc=4, local_devices=local_devices, env=env,
                         timeout_s=TIMEOUT_S)


def test_every_collective_and_algorithm_matches_xla_and_lax():
  for p in launch("check", JAXCC_TIMEOUT_S="30"):
    assert "OK" in p.stdout, f"process {p.rank}:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}"


@pytest.mark.parametrize("local_devices", [1, 2])
def test_independent_collectives_meet_in_the_same_call_in_50_runs(local_devices):
  for p in launch("independent", local_devices, JAXCC_TIMEOUT_S="30", RUNS="50"):
    assert "OK 50 runs" in p.stdout, f"process {p.rank}:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}"


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


def _acceptor(secret, me=1, expected=frozenset({0})):
  """A listener with ``accept_peers`` running in a thread; its peers dict fills on success."""
  listener = socket.create_server(("127.0.0.1", 0))
  peers = {}
  thread = threading.Thread(target=lambda: peers.update(tcp_bootstrap.accept_peers(
      listener, secret, me, set(expected), time.monotonic() + 30)))
  thread.start()
  return listener, thread, peers


def _challenged(address):
  """A connection to ``address`` and the nonce of the challenge it received."""
  conn = socket.create_connection(address)
  got = conn.recv(100)
  assert got[:8] == tcp_bootstrap.CHALLENGE and len(got) == 44, got
  return conn, got[12:]


def _connect_honestly(secret, listener, accept, peers):
  """Process 0's honest handshake with the acceptor, which then holds it as its one peer."""
  mine = b"n" * 32
  peer, nonce = _challenged(listener.getsockname())
  with peer:
    peer.sendall(tcp_bootstrap.hello(secret, 0, 1, mine, nonce))
    assert peer.recv(100) == tcp_bootstrap.ack(secret, 1, 0, nonce, mine)
    accept.join(30)
  listener.close()
  assert list(peers) == [0]
  peers[0][0].close()


def test_a_connection_without_the_secret_is_closed_and_reported(caplog):
  secret = b"s" * 32
  with caplog.at_level(logging.WARNING, logger="jaxcc"):
    listener, accept, peers = _acceptor(secret)
    address = listener.getsockname()
    intruder, nonce = _challenged(address)
    mine = b"n" * 32
    intruder.sendall(tcp_bootstrap.hello(b"x" * 32, 0, 1, mine, nonce))
    assert intruder.recv(100) == b""  # closed without an answer
    intruder.close()
    _connect_honestly(secret, listener, accept, peers)
  assert any("failed the handshake" in r.getMessage() and "127.0.0.1" in r.getMessage()
             for r in caplog.records)


def test_a_replayed_or_reflected_hello_is_refused(caplog):
  secret = b"s" * 32
  mine = b"n" * 32
  with caplog.at_level(logging.WARNING, logger="jaxcc"):
    listener, accept, peers = _acceptor(secret)
    address = listener.getsockname()
    first, nonce = _challenged(address)
    recorded = tcp_bootstrap.hello(secret, 0, 1, mine, nonce)  # a hello seen on the wire
    first.close()  # the accept of that connection fails: it ends before its hello
    replay, fresh = _challenged(address)
    assert fresh != nonce
    replay.sendall(recorded)
    assert replay.recv(100) == b""
    replay.close()
    reflect, nonce = _challenged(address)
    # The acceptor's own nonce sent back, with the acceptor's label and ids turned around.
    reflect.sendall(tcp_bootstrap.ACK + recorded[8:16] + nonce +
                    tcp_bootstrap.proof(tcp_bootstrap.ACK, secret, 0, 1, nonce, nonce))
    assert reflect.recv(100) == b""
    reflect.close()
    _connect_honestly(secret, listener, accept, peers)
  refused = [r for r in caplog.records if "failed the handshake" in r.getMessage()]
  assert len(refused) == 3, [r.getMessage() for r in refused]


def test_a_connector_refuses_an_acceptor_without_the_secret():
  listener = socket.create_server(("127.0.0.1", 0))
  server = threading.Thread(target=lambda: _fake_acceptor(listener))
  server.start()
  with socket.create_connection(listener.getsockname()) as conn:
    with pytest.raises(ConnectionRefusedError, match="does not prove the job's secret"):
      tcp_bootstrap.connect_peer(conn, b"s" * 32, 0, 1)
  server.join(30)
  listener.close()


def _fake_acceptor(listener):
  conn, _ = listener.accept()
  with conn:
    conn.sendall(tcp_bootstrap.challenge(1, b"c" * 32))
    got = conn.recv(100)
    conn.sendall(tcp_bootstrap.ack(b"x" * 32, 1, 0, b"c" * 32, got[16:48]))


def test_the_open_listener_hands_each_authenticated_reconnect_to_the_transport(monkeypatch,
                                                                                caplog):
  secret = b"s" * 32
  handed = []
  monkeypatch.setattr(tcp_bootstrap.ffi, "load", lambda: types.SimpleNamespace(
      cpu=types.SimpleNamespace(tcp_rejoin=lambda q, fd, key: handed.append((q, key)))))
  listener = socket.create_server(("127.0.0.1", 0))
  threading.Thread(target=tcp_bootstrap.serve, args=(listener, secret, 0, 3),
                   daemon=True).start()
  with caplog.at_level(logging.WARNING, logger="jaxcc"):
    with socket.create_connection(listener.getsockname()) as intruder:
      intruder.settimeout(10)
      with pytest.raises(ConnectionError):  # closed without an answer
        tcp_bootstrap.connect_peer(intruder, b"x" * 32, 2, 0)
    keys = []
    for q in (2, 1, 2):  # each reconnect gets a fresh challenge, so a fresh key
      with socket.create_connection(listener.getsockname()) as conn:
        conn.settimeout(10)
        keys.append((q, tcp_bootstrap.connect_peer(conn, secret, q, 0)))
        deadline = time.monotonic() + 10
        while len(handed) < len(keys) and time.monotonic() < deadline:
          time.sleep(0.01)
  listener.close()
  assert handed == keys and len({key for _, key in keys}) == 3
  assert any("failed the handshake" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("order", ["lower_first", "higher_first"])
def test_two_connections_that_cross_leave_both_sides_the_lower_process_one(monkeypatch, order):
  """Processes 1 and 2 open a connection to each other at once: each side adopts both, in
  either order, and both keep the one process 1 opened; later, or once it is lost, a
  connection from process 2 replaces it."""
  kept, lost = {}, set()
  monkeypatch.setattr(tcp_bootstrap.ffi, "load", lambda: types.SimpleNamespace(
      cpu=types.SimpleNamespace(tcp_rejoin=lambda q, fd, key: kept.__setitem__(q, key),
                                tcp_lost=lambda q: "closed" if q in lost else "")))
  monkeypatch.setattr(tcp_bootstrap, "_opened", {})
  for me, q in ((1, 2), (2, 1)):
    tcp_bootstrap._opened.clear()
    kept.clear()
    opened = [(1, b"by 1"), (2, b"by 2")]
    for opener, key in opened if order == "lower_first" else opened[::-1]:
      sock = _one_end()
      tcp_bootstrap.adopt(me, q, sock, key, opener=opener)
      assert sock.fileno() == -1  # taken over or closed
    assert kept == {q: b"by 1"}, (me, order)
  with monkeypatch.context() as m:  # not at once: the later one replaces it
    m.setattr(tcp_bootstrap, "_CROSSING_S", 0.0)
    assert tcp_bootstrap.adopt(1, 2, _one_end(), b"later", opener=2)
  tcp_bootstrap._opened[2] = (1, time.monotonic())
  lost.add(2)  # nor once it is lost
  assert tcp_bootstrap.adopt(1, 2, _one_end(), b"after", opener=2)
  assert kept[2] == b"after"


def _one_end() -> socket.socket:
  a, b = socket.socketpair()
  b.close()
  return a
