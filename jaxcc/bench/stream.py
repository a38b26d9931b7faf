"""One host of a link calibration: stream to the next host while receiving from the previous.

Usage: ``python stream.py CONFIG_JSON``, with CONFIG ``{"addresses": [...], "port": int,
"nbytes": int, "timeout_s": float}``; ``jaxcc.bench.calibration.calibrate`` starts
it on every host of a testbed cluster (with ``jaxcc.launcher.launch``).
Host ``i`` sends ``nbytes`` to host ``i + 1`` (mod n) over one TCP connection
with 4 MiB socket buffers and the namespace's default congestion control, so
every link carries one flow each way at once. It measures what it receives
from the time the first tenth of the bytes had arrived to the last byte,
which leaves out the token bucket's initial burst and TCP's slow start, and
prints ``{"process": i, "received": bytes, "goodput_bps": bits/s}``. Only sockets:
jax's backend never starts.
"""

import json
import socket
import sys
import threading
import time

from jaxcc.launcher import job

_BUFFER_BYTES = 4 << 20
_PIECE = 1 << 20


def main():
  config = json.loads(sys.argv[1])
  addresses, port, nbytes = config["addresses"], config["port"], config["nbytes"]
  me = job().process_id
  deadline = time.monotonic() + config["timeout_s"]
  listener = _socket()
  listener.bind((addresses[me], port))
  listener.listen(1)
  received = {}
  receiver = threading.Thread(target=_receive, args=(listener, nbytes, received))
  receiver.start()
  conn = _socket()
  while True:  # the next host may not listen yet
    try:
      conn.connect((addresses[(me + 1) % len(addresses)], port))
      break
    except (ConnectionRefusedError, OSError):
      if time.monotonic() > deadline:
        raise
      time.sleep(0.05)
      conn.close()
      conn = _socket()
  piece = memoryview(bytearray(_PIECE))
  sent = 0
  while sent < nbytes:
    sent += conn.send(piece[:min(_PIECE, nbytes - sent)])
  conn.shutdown(socket.SHUT_WR)
  receiver.join(max(deadline - time.monotonic(), 0))
  conn.close()
  if receiver.is_alive() or received.get("bytes") != nbytes:
    raise SystemExit(f"stream: host {me} received {received.get('bytes')} of {nbytes} bytes")
  print(json.dumps({"process": me, "received": received["bytes"],
                    "goodput_bps": 8 * (nbytes - received["tenth"][1])
                    / (received["end"] - received["tenth"][0])}),
        flush=True)


def _socket() -> socket.socket:
  sock = socket.socket()
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _BUFFER_BYTES)
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _BUFFER_BYTES)
  return sock


def _receive(listener: socket.socket, nbytes: int, out: dict) -> None:
  """Receive one connection to its end; note when (and how many bytes) a tenth and all had come."""
  conn, _ = listener.accept()
  buf = memoryview(bytearray(_PIECE))
  total, tenth, end = 0, None, None
  while True:
    got = conn.recv_into(buf)
    if not got:
      break
    total += got
    end = time.perf_counter()
    if tenth is None and total >= nbytes / 10:
      tenth = (end, total)
  conn.close()
  out.update(bytes=total, tenth=tenth, end=end)


if __name__ == "__main__":
  main()
