"""Connects the processes of a jax.distributed job for the native executor's TCP transport.

Once per process, when it first lowers a native collective whose ranks span
processes (every process does so in an SPMD program), ``ensure_started``:

1. listens on an ephemeral port of the address this process reaches the
   jax.distributed coordinator from (127.0.0.1 on loopback) and puts
   ``ip:port`` in the key-value store; process 0 puts a fresh 32-byte secret
   and its ``JAXCC_TCP_INTEGRITY`` there too (every process must have the
   same);
2. connects to every higher process and accepts every lower one: one
   connection per process pair, authenticated both ways by a challenge and
   response: the accepting process sends a fresh nonce, the connecting one
   answers with its own nonce and an HMAC under the secret of both process
   ids and both nonces, and the accepting one proves the same with another
   label. A recorded hello fails against the next nonce, and neither side's
   proof passes for the other's. A connection that fails the handshake is
   closed and logged with its address, and nothing it sent reaches a
   collective's buffer. Each connection's key (``session_key``) is an HMAC of
   both nonces under the secret, so it is new for every connection;
3. hands the sockets and their keys to the C++ progress thread
   (``_jaxcc_cpu.tcp_start``), which checks every frame against the schedule
   and, with integrity on, its MAC under the key;
4. keeps the listener open: a process whose connection was lost connects
   again (``reconnect``), passes the same handshake, and its new connection
   replaces the old one (``_jaxcc_cpu.tcp_rejoin``). A process restarted with
   the same id (its address is in the store already) starts its transport
   with no connection, listens, publishes its new address and then connects
   to every other process the same way; one that refuses is dead (its
   connection stays lost). Two processes that open a connection to each
   other at once (both restarted, or both rejoining) keep the one the lower
   process opened: a new connection from the higher one does not replace a
   live one the lower opened less than ``_CROSSING_S`` ago (``adopt``).

Socket policy: 4 MiB send and receive buffers (set on the listener too, so
the window scale covers them), ``TCP_NODELAY`` and ``cubic`` congestion
control per socket (skipped where the kernel lacks or forbids it), and
keepalive: a peer whose host vanished without closing its connection is
found lost within 20 s (probes after 10 s idle, 5 every 2 s) when the
connection is idle, and within ``TCP_USER_TIMEOUT`` (30
s) when data sent to it stays unacknowledged. A killed process' kernel closes
its connections: the others find it lost at once. Pacing is set per call by
the C++ transport from the topology. Every wait ends within
``JAXCC_TIMEOUT_S`` (default 300 s) with an error that names the missing
process.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import logging
import secrets
import socket
import struct
import threading
import time

import jax

from jaxcc._src import compat, config, ffi

logger = logging.getLogger("jaxcc")

_KEY = "jaxcc/tcp"
CHALLENGE = b"JAXCC-CH"
HELLO = b"JAXCC-HI"
ACK = b"JAXCC-OK"
KEY = b"JAXCC-KY"
_NONCE = 32
_CHALLENGE_BYTES = 8 + 4 + _NONCE  # magic, the accepting process' id, its nonce
_HELLO_BYTES = 8 + 8 + _NONCE + 32  # magic, (from, to), the connector's nonce, HMAC-SHA256
_ACK_BYTES = 8 + 8 + 32  # magic, (from, to), HMAC-SHA256
_BUFFER_BYTES = 4 << 20
_KEEPALIVE = (10, 2, 5)  # idle seconds, seconds between probes, probes
_USER_TIMEOUT_MS = 30_000
_CROSSING_S = 10.0  # two connections of one pair opened this close together crossed
_lock = threading.Lock()
_adopt_lock = threading.Lock()
_opened: dict[int, tuple[int, float]] = {}  # per peer: who opened the connection to it, when


def ensure_started() -> None:
  """Start this process' TCP transport unless it runs; every process of the job must call it.

  Raises:
    RuntimeError: jax.distributed is not initialized.
    TimeoutError: a process did not publish its address or connect in time.
  """
  with _lock:
    if ffi.load().cpu.tcp_process() < 0:
      _start()


def tune(sock: socket.socket) -> None:
  """Apply the socket policy: 4 MiB buffers, TCP_NODELAY, cubic where the kernel allows it."""
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _BUFFER_BYTES)
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _BUFFER_BYTES)
  sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
  idle, interval, count = _KEEPALIVE
  sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
  sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
  sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, count)
  sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, _USER_TIMEOUT_MS)
  try:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b"cubic")
  except OSError as e:  # not built into this kernel, or not allowed for this user
    if e.errno not in (errno.ENOENT, errno.EPERM):
      raise


def challenge(me: int, nonce: bytes) -> bytes:
  """The accepting process' first message: its id and a fresh nonce."""
  return CHALLENGE + struct.pack("<i", me) + nonce


def proof(kind: bytes, secret: bytes, src: int, dst: int, src_nonce: bytes,
          dst_nonce: bytes) -> bytes:
  """HMAC-SHA256 under ``secret`` of ``kind`` (hello or ack), both ids and both nonces."""
  return hmac.new(secret, kind + struct.pack("<ii", src, dst) + src_nonce + dst_nonce,
                  hashlib.sha256).digest()


def hello(secret: bytes, src: int, dst: int, src_nonce: bytes, dst_nonce: bytes) -> bytes:
  """The connecting process' answer to ``dst``'s challenge ``dst_nonce``."""
  return (HELLO + struct.pack("<ii", src, dst) + src_nonce +
          proof(HELLO, secret, src, dst, src_nonce, dst_nonce))


def ack(secret: bytes, src: int, dst: int, src_nonce: bytes, dst_nonce: bytes) -> bytes:
  """The accepting process' proof to ``dst``, which sent ``dst_nonce`` in its hello."""
  return ACK + struct.pack("<ii", src, dst) + proof(ACK, secret, src, dst, src_nonce, dst_nonce)


def session_key(secret: bytes, acceptor: int, connector: int, acceptor_nonce: bytes,
                connector_nonce: bytes) -> bytes:
  """The key of one connection: HMAC-SHA256 under ``secret`` of both ids and both nonces."""
  return proof(KEY, secret, acceptor, connector, acceptor_nonce, connector_nonce)


def answer(conn: socket.socket, secret: bytes, me: int, allowed: set[int]) -> tuple[int, bytes]:
  """Challenge the connecting process on ``conn``; its id and the connection's key.

  Raises:
    ConnectionRefusedError: the hello does not answer this challenge from a
      process in ``allowed`` with the job's secret.
  """
  nonce = secrets.token_bytes(_NONCE)
  conn.sendall(challenge(me, nonce))
  got = _recv_exact(conn, _HELLO_BYTES)
  src, dst = struct.unpack("<ii", got[8:16])
  their = got[16:16 + _NONCE]
  if (dst != me or src not in allowed or their == nonce
      or not hmac.compare_digest(got, hello(secret, src, me, their, nonce))):
    raise ConnectionRefusedError(
        "its hello does not answer this challenge with the job's secret (a wrong secret or "
        "process id, or a replayed or reflected message)")
  conn.sendall(ack(secret, me, src, nonce, their))
  return src, session_key(secret, me, src, nonce, their)


def accept_peers(listener: socket.socket, secret: bytes, me: int, expected: set[int],
                 deadline: float) -> dict[int, tuple[socket.socket, bytes]]:
  """Accept one authenticated connection from each process in ``expected``: socket and key.

  Each connection gets a fresh challenge; one whose hello is not ``hello``
  of an expected ``q`` not yet connected, for that challenge, is closed and
  logged with its address.
  """
  peers: dict[int, tuple[socket.socket, bytes]] = {}
  while len(peers) < len(expected):
    listener.settimeout(max(deadline - time.monotonic(), 1e-3))
    try:
      conn, addr = listener.accept()
    except socket.timeout:
      missing = sorted(expected - peers.keys())
      raise TimeoutError(
          f"jaxcc: process {me} timed out after {config.timeout_s():g} s waiting for processes "
          f"{missing} to connect (JAXCC_TIMEOUT_S sets the limit)") from None
    try:
      conn.settimeout(min(max(deadline - time.monotonic(), 1e-3), 10.0))
      src, key = answer(conn, secret, me, expected - peers.keys())
    except OSError as e:
      _refused(me, addr, e)
      conn.close()
      continue
    tune(conn)
    peers[src] = (conn, key)
  return peers


def connect_peer(sock: socket.socket, secret: bytes, me: int, q: int) -> bytes:
  """Answer process ``q``'s challenge on the connected ``sock``, check its proof; the key."""
  got = _recv_exact(sock, _CHALLENGE_BYTES)
  theirs = got[12:]
  if got[:8] != CHALLENGE or struct.unpack("<i", got[8:12])[0] != q:
    raise ConnectionRefusedError(f"its first message is not process {q}'s challenge")
  nonce = secrets.token_bytes(_NONCE)
  sock.sendall(hello(secret, me, q, nonce, theirs))
  if not hmac.compare_digest(_recv_exact(sock, _ACK_BYTES), ack(secret, q, me, theirs, nonce)):
    raise ConnectionRefusedError("its answer does not prove the job's secret")
  return session_key(secret, q, me, theirs, nonce)


def connect(q: int, address: str, secret: bytes, me: int, family: socket.AddressFamily,
            deadline: float) -> tuple[socket.socket, bytes]:
  """A connection to process ``q`` listening at ``address`` ("[ip]:port"), and its key."""
  host, port = address.rsplit(":", 1)
  sock = socket.socket(family, socket.SOCK_STREAM)
  try:
    tune(sock)
    with _naming(me, q, "accept the connection and answer the handshake"):
      sock.settimeout(max(deadline - time.monotonic(), 1e-3))
      sock.connect((host.strip("[]"), int(port)))
      key = connect_peer(sock, secret, me, q)
  except BaseException:
    sock.close()
    raise
  return sock, key


def reconnect(q: int) -> None:
  """Connect this process' TCP transport to process ``q`` again (its connection was lost).

  ``q`` replaces its connection to this process by the new one once the
  handshake passes; so does this process (see ``adopt`` for two that cross).
  """
  me = jax.process_index()
  deadline = time.monotonic() + config.timeout_s()
  family, _ = _local_address(compat.coordinator_address())
  secret = bytes.fromhex(_kv_get(f"{_KEY}/secret", 0, deadline))
  sock, key = connect(q, _kv_get(f"{_KEY}/addr/{q}", q, deadline), secret, me, family, deadline)
  adopt(me, q, sock, key, opener=me)


def adopt(me: int, q: int, sock: socket.socket, key: bytes, opener: int) -> bool:
  """Makes ``sock`` (authenticated, to process ``q``, opened by ``opener``) this process'
  connection to ``q``, unless it crossed one the lower of the two opened: then it closes
  ``sock`` and returns False.

  Two connections of one pair cross where each side opened one at once (both
  restarted or rejoining). Each side sees both, in either order; both keep the
  lower process' one: a connection from the higher does not replace a live one
  from the lower opened less than ``_CROSSING_S`` ago. A dead peer's restart
  finds its old connection lost, and a connection rejoined after a cut is older.
  """
  cpu = ffi.load().cpu
  with _adopt_lock:
    by, at = _opened.get(q, (None, 0.0))
    if (opener == max(me, q) and by == min(me, q) and time.monotonic() - at < _CROSSING_S
        and not cpu.tcp_lost(q)):
      sock.close()
      logger.info("jaxcc: process %d keeps the TCP connection it crossed with process %d's",
                  me, q)
      return False
    cpu.tcp_rejoin(q, sock.detach(), key)
    _opened[q] = (opener, time.monotonic())
  return True


def serve(listener: socket.socket, secret: bytes, me: int, n: int) -> None:
  """Answer every later connection on ``listener``: each that passes rejoins (runs forever)."""
  others = set(range(n)) - {me}
  while True:
    try:
      conn, addr = listener.accept()
    except OSError as e:
      logger.warning("jaxcc: process %d stops accepting TCP connections: %s", me, e)
      return
    try:
      conn.settimeout(10.0)
      q, key = answer(conn, secret, me, others)
      tune(conn)
      if not adopt(me, q, conn, key, opener=q):
        continue
    except (OSError, RuntimeError) as e:
      _refused(me, addr, e)
      conn.close()
      continue
    logger.info("jaxcc: process %d took a new TCP connection from process %d (%s)", me, q, addr)


def _refused(me: int, addr, error: Exception) -> None:
  logger.warning("jaxcc: process %d closed a TCP connection from %s that failed the "
                 "handshake: %s", me, addr, error)


def _start() -> None:
  address = compat.coordinator_address()
  if address is None:
    raise RuntimeError("jaxcc: the native executor across processes needs "
                       "jax.distributed.initialize() first")
  me, n = jax.process_index(), jax.process_count()
  deadline = time.monotonic() + config.timeout_s()
  integrity = config.tcp_integrity()
  family, host = _local_address(address)
  listener = socket.socket(family, socket.SOCK_STREAM)
  peers: dict[int, tuple[socket.socket, bytes]] = {}
  try:
    tune(listener)
    listener.bind((host, 0))
    listener.listen(n)
    if compat.kv_try_get(f"{_KEY}/addr/{me}") is not None:
      _restart(listener, host, family, integrity, deadline)
      return
    compat.kv_set(f"{_KEY}/addr/{me}", f"[{host}]:{listener.getsockname()[1]}")
    if me == 0:
      compat.kv_set(f"{_KEY}/secret", secrets.token_hex(32))
      compat.kv_set(f"{_KEY}/integrity", integrity)
    secret = _job_secret(me, integrity, deadline)
    # Connect up, then accept: the highest process accepts first, so every
    # challenge a connector waits for comes from a process that is accepting.
    for q in range(me + 1, n):
      peers[q] = connect(q, _kv_get(f"{_KEY}/addr/{q}", q, deadline), secret, me, family,
                         deadline)
    peers.update(accept_peers(listener, secret, me, set(range(me)), deadline))
    fds, keys = [-1] * n, [b""] * n
    for q, (sock, key) in peers.items():
      fds[q], keys[q] = sock.detach(), key
    ffi.load().cpu.tcp_start(me, fds, keys, integrity == "hmac")
  except BaseException:
    listener.close()
    raise
  finally:
    for sock, _ in peers.values():
      sock.close()
  now = time.monotonic()
  _opened.update({q: (min(me, q), now) for q in peers})
  _serve_in_background(listener, secret, me, n)
  logger.info("jaxcc: TCP transport of process %d up on %s with %d peers (integrity %s)", me,
              host, n - 1, integrity)


def _restart(listener: socket.socket, host: str, family: socket.AddressFamily, integrity: str,
             deadline: float) -> None:
  """A restarted process' start: the transport with no connection, the listener answering,
  then its address published and a connection opened to every other process; one that
  refuses is dead, and its connection stays lost (it connects to this one if it restarts)."""
  me, n = jax.process_index(), jax.process_count()
  secret = _job_secret(me, integrity, deadline)
  ffi.load().cpu.tcp_start(me, [-1] * n, [b""] * n, integrity == "hmac",
                           unconnected="not connected since this process restarted")
  _serve_in_background(listener, secret, me, n)
  compat.kv_set(f"{_KEY}/addr/{me}", f"[{host}]:{listener.getsockname()[1]}", overwrite=True)
  dead = []
  for q in set(range(n)) - {me}:
    try:
      sock, key = connect(q, _kv_get(f"{_KEY}/addr/{q}", q, deadline), secret, me, family,
                          deadline)
    except ConnectionError as e:
      if not isinstance(e.__cause__, ConnectionRefusedError):
        raise
      dead.append(q)
      continue
    adopt(me, q, sock, key, opener=me)
  logger.info("jaxcc: TCP transport of process %d up again on %s; processes %s refused it",
              me, host, dead)


def _job_secret(me: int, integrity: str, deadline: float) -> bytes:
  """The job's secret, once process 0 put it; checks that ``integrity`` is the job's."""
  secret = bytes.fromhex(_kv_get(f"{_KEY}/secret", 0, deadline))
  job_integrity = _kv_get(f"{_KEY}/integrity", 0, deadline)
  if integrity != job_integrity:
    raise ValueError(f"jaxcc: JAXCC_TCP_INTEGRITY is {integrity!r} on process {me} but "
                     f"{job_integrity!r} on process 0; every process must set the same")
  return secret


def _serve_in_background(listener: socket.socket, secret: bytes, me: int, n: int) -> None:
  listener.settimeout(None)
  threading.Thread(target=serve, args=(listener, secret, me, n), daemon=True,
                   name="jaxcc-tcp-listener").start()


@contextlib.contextmanager
def _naming(me: int, q: int, doing: str):
  """Turns a socket error while waiting for process ``q`` into one that names it."""
  try:
    yield
  except socket.timeout:
    raise TimeoutError(f"jaxcc: process {me} timed out after {config.timeout_s():g} s waiting "
                       f"for process {q} to {doing} (JAXCC_TIMEOUT_S sets the limit)") from None
  except OSError as e:
    raise ConnectionError(f"jaxcc: process {me} could not connect the TCP transport to process "
                          f"{q}, which did not {doing}: {e}") from e


def _kv_get(key: str, owner: int, deadline: float) -> str:
  try:
    return compat.kv_get(key, max(deadline - time.monotonic(), 1e-3))
  except TimeoutError as e:
    raise TimeoutError(f"jaxcc: timed out after {config.timeout_s():g} s waiting for process "
                       f"{owner} to start its TCP transport (JAXCC_TIMEOUT_S sets the limit): "
                       f"{e}") from e


def _local_address(coordinator: str) -> tuple[socket.AddressFamily, str]:
  """The address family and IP this process reaches ``coordinator`` (host:port) from."""
  host, port = coordinator.rsplit(":", 1)
  family, _, _, _, sockaddr = socket.getaddrinfo(host.strip("[]"), int(port),
                                                 type=socket.SOCK_DGRAM)[0]
  with socket.socket(family, socket.SOCK_DGRAM) as probe:
    probe.connect(sockaddr)  # UDP: picks the route and source address, sends nothing
    return family, probe.getsockname()[0]


def _recv_exact(sock: socket.socket, size: int) -> bytes:
  data = b""
  while len(data) < size:
    chunk = sock.recv(size - len(data))
    if not chunk:
      raise ConnectionError("connection closed during the handshake")
    data += chunk
  return data
