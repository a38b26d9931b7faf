"""One process of tests/test_tcp_fuzz.py: jaxcc against a hostile peer written in Python.

Usage: python tests/tcp_fuzz_worker.py SEED, started by ``jaxcc.launcher.launch`` as 2
processes of one CPU device each.

Process 0 runs jaxcc: a native all_gather over the 2 ranks, once per case. Process 1 is
the fuzz peer: it completes the real handshake (``tcp_bootstrap``) but speaks the frame
protocol itself. For each case it reads the frame jaxcc sent it (so it learns the op id,
instance and digest), sends rank 1's frame honestly or broken as the case says (a field
mutated, truncated, stalled, garbage, a MAC that does not verify), waits until process 0's
collective ended, and closes the connection; process 0 recovers (``jaxcc.recover``) and
connects again (``tcp_bootstrap.reconnect``) before the next case. Every broken case is
followed by an honest one, which must give the right result. Process 0 prints one JSON
line per case, then "OK".
"""

import hashlib
import hmac
import json
import random
import socket
import struct
import sys
import time

from jaxcc.launcher import join

SEED = int(sys.argv[1])
JOB = join(timeout_s=60)
PID = JOB.process_id

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxcc  # noqa: E402
from jaxcc._src import compat, config, ffi, tcp_bootstrap  # noqa: E402

M = 1000  # float32 elements per rank: a piece of 4000 bytes
HEADER = struct.Struct("<IIqqqqiiqQQ")  # tcp_engine.h: WireHeader
MAGIC, DATA, PART, BEAT = 0x4d43584a, 1, 3, 4
FIELDS = ("magic", "kind", "op_id", "instance", "group", "step", "src", "dst", "digest",
          "length", "bound")
INTEGRITY = config.tcp_integrity() == "hmac"
TIMEOUT_S = config.timeout_s()


class Peer:
  """Process 1's end of the connection: frames in and out, numbered for the MACs."""

  def __init__(self, sock, key):
    self.sock, self.key = sock, key
    self.sent = self.received = 0
    sock.settimeout(TIMEOUT_S + 30)

  def mac(self, number, header, payload):
    return hmac.new(self.key, struct.pack("<Q", number) + header + payload,
                    hashlib.sha256).digest()

  def read(self):
    """The next data frame from process 0 (its fields and payload); abort and beat frames
    skipped."""
    while True:
      header = self._exact(HEADER.size)
      fields = HEADER.unpack(header)
      payload = self._exact(fields[9])
      if INTEGRITY:
        assert self._exact(32) == self.mac(self.received, header, payload), "jaxcc's MAC"
      self.received += 1
      if fields[1] == DATA:
        return fields, payload

  def frame(self, fields, payload, number=None):
    header = HEADER.pack(*fields)
    self.sent += 1
    if not INTEGRITY:
      return header + payload
    return header + payload + self.mac(self.sent - 1 if number is None else number, header,
                                       payload)

  def _exact(self, n):
    data = b""
    while len(data) < n:
      chunk = self.sock.recv(n - len(data))
      if not chunk:
        raise ConnectionError("process 0 closed the connection")
      data += chunk
    return data


def replace(fields, **changes):
  values = dict(zip(FIELDS, fields))
  values.update(changes)
  return tuple(values[f] for f in FIELDS)


def cases(rng):
  """(name, send(peer, honest fields, payload), expected: a regex the error matches ("ok" where
  the collective may also succeed), or "any": refused or harmless)."""
  def field(name, value, expect):
    return (f"{name}={value}", lambda peer, h, x: peer.sock.sendall(
        peer.frame(replace(h, **{name: value(h) if callable(value) else value}), x)), expect)

  stray = r"frame\(s\) for calls that have not started here"
  fixed = [
      field("magic", 0x12345678, r"process 1 sent a frame whose magic 305419896 is not"),
      field("kind", 7, r"whose kind 7 is none of data, part, abort or beat"),
      field("kind", BEAT, r"whose length 4000 is not a beat's 0"),
      ("beats", lambda peer, h, x: peer.sock.sendall(b"".join(
          [peer.frame(replace(h, kind=BEAT, length=0), b"") for _ in range(3)] +
          [peer.frame(h, x)])), None),  # a live peer's beats before its piece: harmless
      field("kind", PART, r"whose kind is a part of a split piece, but the call's pieces are raw"),
      field("step", 5, r"whose step is not one at which the schedule sends rank 0 a piece"),
      field("src", 7, r"whose src is not one of the call's 2 ranks"),
      field("src", 0, r"whose src is a rank of process 0, not of the process that sent it"),
      field("src", -1, r"whose src is negative"),
      field("dst", 1, r"whose dst is not a rank of this process"),
      field("dst", 9, r"whose dst is not a rank of this process"),
      field("op_id", lambda h: h[2] + 1000, stray),
      field("instance", lambda h: h[3] + 5, stray),
      field("instance", lambda h: h[3] - 1, r"whose instance ended here already"),
      field("group", 3, stray),
      field("digest", lambda h: h[8] ^ 1, r"process 1 planned a different schedule"),
      field("length", 3996, r"whose length 3996 is not the piece's 4000 bytes"),
      field("length", 1 << 41, r"whose length 2199023255552 is more than 2\^40 bytes"),
      field("bound", 1 << 20, r"whose bound 1048576 is more than the 4000 bytes"),
      ("duplicate", lambda peer, h, x: peer.sock.sendall(peer.frame(h, x) + peer.frame(h, x)),
       r"ok|step's piece came already|instance ended here already"),  # ok: done before the 2nd
      ("header cut", lambda peer, h, x: _cut(peer, peer.frame(h, x), 30),
       r"closed it in the middle of a frame \(30 of 72 header bytes\)"),
      ("payload cut", lambda peer, h, x: _cut(peer, peer.frame(h, x), 72 + 1500),
       r"in the middle of a frame \(72 of 72 header bytes, 1500 of 4000 payload bytes\)"),
      ("payload stall", lambda peer, h, x: peer.sock.sendall(peer.frame(h, x)[:72 + 2000]),
       r"stuck waiting for the piece of rank 1 \(process 1\), whose process sent nothing for"),
      ("beats, no piece", _beats_only,  # alive, so not stuck: the timeout ends the wait
       rf"timed out after {TIMEOUT_S:g} s waiting for the piece of rank 1 \(process 1\)"),
      ("garbage", lambda peer, h, x: peer.sock.sendall(rng.randbytes(72 + 4000)),
       r"process 1 sent a frame whose magic"),
  ]
  if INTEGRITY:
    fixed += [
        ("payload bit", lambda peer, h, x: peer.sock.sendall(
            _flip(peer.frame(h, x), 72 + 123)), r"whose MAC does not verify"),
        ("header bit", lambda peer, h, x: peer.sock.sendall(
            _flip(peer.frame(h, x), 64)), r"whose MAC does not verify"),  # bound 0 -> 16
        ("renumbered", lambda peer, h, x: peer.sock.sendall(peer.frame(h, x, number=7)),
         r"whose MAC does not verify"),
    ]
  randomized = []
  for _ in range(24):  # a random field set to a random value: refused or harmless
    name = rng.choice(FIELDS)
    value = rng.choice([0, 1, -1, 2, 3, 4000, 1 << 31, rng.getrandbits(63)])
    if name in ("magic", "kind", "length", "bound"):
      value &= (1 << 32) - 1 if name in ("magic", "kind") else (1 << 64) - 1
    if name in ("src", "dst"):
      value = max(-(1 << 31), min(value, (1 << 31) - 1))
    randomized.append(field(name, value, "any"))
  return fixed + randomized


def honest(peer, h, x):
  peer.sock.sendall(peer.frame(h, x))


def _cut(peer, data, n):
  peer.sock.sendall(data[:n])
  peer.sock.shutdown(socket.SHUT_WR)


def _beats_only(peer, h, x):
  """A live peer that never sends its piece: a beat every 100 ms until past the timeout."""
  end = time.monotonic() + TIMEOUT_S + 0.5
  try:
    while time.monotonic() < end:
      peer.sock.sendall(peer.frame(replace(h, kind=BEAT, length=0), b""))
      time.sleep(0.1)
  except OSError:
    pass  # process 0 closed the connection


def _flip(data, at):
  return data[:at] + bytes([data[at] ^ 0x10]) + data[at + 1:]


def victim(schedule):
  mesh = jax.make_mesh((2,), ("x",))
  f = jax.jit(jax.shard_map(
      lambda b: jaxcc.all_gather(b, "x", axis=0, tiled=True, algorithm="ring",
                                 executor="native"),
      mesh=mesh, in_specs=P("x"), out_specs=P("x")))  # each rank's whole result
  host = np.arange(2 * M, dtype=np.float32)
  x = jax.make_array_from_callback(host.shape, NamedSharding(mesh, P("x")), lambda i: host[i])
  refused = {}
  for i, (name, _, expect) in enumerate(schedule):
    start = time.monotonic()
    try:
      got = np.asarray(f(x).addressable_shards[0].data)
      result = "ok" if np.array_equal(got, host) else f"WRONG: {got[M:M + 4]}"
    except jax.errors.JaxRuntimeError as e:
      result = str(e)
    seconds = time.monotonic() - start
    jaxcc.recover()
    compat.kv_set(f"fuzz/done/{i}", "1")
    tcp_bootstrap.reconnect(1)
    print(json.dumps({"case": name, "expect": expect, "result": result, "seconds": seconds}),
          flush=True)
    if expect is not None and result != "ok":
      refused[name] = result
  print(f"OK {len(schedule)} cases, {len(refused)} refused", flush=True)


def fuzz_peer(schedule):
  listener = socket.create_server(("127.0.0.1", 0))
  compat.kv_set("jaxcc/tcp/addr/1", f"[127.0.0.1]:{listener.getsockname()[1]}")
  deadline = time.monotonic() + 60
  secret = bytes.fromhex(compat.kv_get("jaxcc/tcp/secret", 60))
  (sock, key), = tcp_bootstrap.accept_peers(listener, secret, 1, {0}, deadline).values()
  mine = np.arange(M, 2 * M, dtype=np.float32).tobytes()
  for i, (_, send, _) in enumerate(schedule):
    peer = Peer(sock, key)
    theirs, _ = peer.read()  # rank 0's piece for rank 1: the call's op id, instance, digest
    honest = replace(theirs, src=1, dst=0, length=len(mine), bound=0)
    send(peer, honest, mine)
    compat.kv_get(f"fuzz/done/{i}", TIMEOUT_S + 60)
    sock.close()
    listener.settimeout(60)
    conn, _ = listener.accept()
    conn.settimeout(10)
    _, key = tcp_bootstrap.answer(conn, secret, 1, {0})
    sock = conn
  sock.close()


def main():
  rng = random.Random(SEED)
  schedule = [("honest", honest, None)]
  for case in cases(rng):
    schedule += [case, ("honest after " + case[0], honest, None)]
  ffi.load()
  jax.devices()  # every process of the job starts its backend (they exchange topologies)
  if PID == 0:
    victim(schedule)
  else:
    fuzz_peer(schedule)
  jax.distributed.shutdown()


if __name__ == "__main__":
  main()
