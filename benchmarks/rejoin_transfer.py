"""Rejoin at wire speed: a restarted gossip worker takes a 100 MB state from a live peer.

3 ``jax.distributed`` processes on the testbed (``jaxcc.testbed.Cluster``, one
host each at ``--rate``, default 1 Gbit/s) train a trivial model (one float32
vector of P parameters, gradient = 0.001 x the parameters) with
``gossip_diloco`` over a ring: the tree a worker holds, params plus the gossip
state (anchor, momentum, mix buffer), is 16 P bytes, 100 MB by default.
Process 1 SIGKILLs itself in round 1; the launcher restarts it, it calls
``jaxcc.optim.rejoin`` and the others ``jaxcc.optim.admit`` every round
(waiting at round 2 for its request), so it comes back at round 4 with the
state of its ring successor, process 2.

Measured: the message's time on the wire at the receiver (first to last byte,
from the transport's frame records: ``tcp_records``) against its bytes at the
link rate; the source's time to pack and queue it (``admit`` at the round it
sends); the restart's whole ``rejoin`` (waiting for the decided round
included). Prints the table and writes ``rejoin_transfer.json`` next to this
file (or under ``--out``). Run as root (or rootless): ``.venv/bin/python
benchmarks/rejoin_transfer.py`` (about a minute).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent


def launch(args) -> dict:
  from jaxcc import testbed
  from jaxcc.launcher import launch as run
  from jaxcc.testbed import parse_rate
  with testbed.Cluster(3, args.rate) as cluster:
    procs = run(__file__, ["--worker", str(args.mbytes)], cluster=cluster, respawn={1},
                timeout_s=600, env={"JAXCC_TIMEOUT_S": "120"})
  records = [p.json() for p in procs]
  back = next(r for r in records if r["rank"] == 1)
  source = next(r for r in records if r["rank"] == back["source"])
  rate = parse_rate(args.rate)
  wire_s = back["message_bytes"] * 8 / rate
  result = {
      "command": " ".join(["benchmarks/rejoin_transfer.py", *sys.argv[1:]]), "rate": args.rate,
      "state_bytes": back["state_bytes"], "message_bytes": back["message_bytes"],
      "source": back["source"], "rejoined_at_round": back["round"],
      "on_the_wire_s": back["on_the_wire_s"], "wire_time_s": wire_s,
      "on_the_wire_over_wire_time": back["on_the_wire_s"] / wire_s,
      "source_pack_and_queue_s": source["admit_s"],
      "pack_to_loaded_s": back["loaded_at"] - source["admit_began_at"],
      "rejoin_call_s": back["rejoin_s"]}
  result["pack_to_loaded_over_wire_time"] = result["pack_to_loaded_s"] / wire_s
  return result


def worker(mbytes: float) -> None:
  import jax

  from jaxcc import launcher
  job = launcher.join()
  import jax.numpy as jnp
  import numpy as np
  import optax
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  import jaxcc
  from jaxcc._src import compat, ffi, tcp_bootstrap

  me, n, every, rounds = job.process_id, job.num_processes, 4, 7
  size = int(mbytes * 1e6 / 16)
  tx = jaxcc.optim.gossip_diloco("x", every, graph="ring", blocking_rounds=0)
  mesh = jax.make_mesh((n,), ("x",), devices=jax.devices())
  sharding = NamedSharding(mesh, P("x"))

  def on_workers(body):
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")))

  def step_body(params, state):
    params, state = jax.tree.map(lambda a: a[0], (params, state))
    updates, state = tx.update(0.001 * params, state, params)
    return jax.tree.map(lambda a: a[None], (optax.apply_updates(params, updates), state))

  init = on_workers(lambda p: jax.tree.map(lambda a: a[None], tx.init(p[0])))
  step = on_workers(step_body)
  params = jax.make_array_from_single_device_arrays(
      (n, size), sharding, [jax.device_put(jnp.ones((1, size), jnp.float32),
                                           jax.local_devices()[0])])
  state = init(params)
  tree = (params, state)
  state_bytes = sum(a.addressable_shards[0].data.nbytes for a in jax.tree.leaves(tree))
  cpu = ffi.load().cpu
  tcp_bootstrap.ensure_started()
  out = {"rank": me, "state_bytes": state_bytes}
  first = 0
  if job.incarnation:
    since = cpu.tcp_records(0)[0]
    began = time.time()
    tree, round_, source = jaxcc.optim.rejoin(tree)
    jax.block_until_ready(tree)
    out.update(rejoin_s=time.time() - began, loaded_at=time.time(), round=round_, source=source)
    _, raw = cpu.tcp_records(since)
    frames = np.frombuffer(raw, np.dtype([("peer", "i4"), ("direction", "i4"), ("op", "i8"),
                                          ("instance", "i8"), ("first", "i8"), ("last", "i8"),
                                          ("bytes", "u8")]))
    got = frames[(frames["op"] == -1) & (frames["direction"] == 0) & (frames["peer"] == source)]
    biggest = got[np.argmax(got["bytes"])]
    out.update(on_the_wire_s=(int(biggest["last"]) - int(biggest["first"])) * 1e-9,
               message_bytes=int(biggest["bytes"]))
    first = round_ * every
  else:
    compat.barrier("rejoin_transfer/compiled", 120)
  admitted = {}
  for i in range(first, rounds * every):
    r, h = divmod(i, every)
    if me == 1 and not job.incarnation and i == every + every // 2:
      os.kill(os.getpid(), signal.SIGKILL)
    if h == 0 and r >= 2:
      began = time.time()
      admission = jaxcc.optim.admit(tree, r, admitted, wait_for=[1] if r == 2 else ())
      tree = admission.tree
      if admission.joined:
        out.update(admit_s=time.time() - began, admit_began_at=began)
    tree = step(*tree)
    jax.block_until_ready(tree)
  cpu.tcp_flush(120)
  compat.kv_set(f"rejoin_transfer/done/{me}", "1", overwrite=True)
  if me == 0:  # the coordinator exits last
    for q in range(1, n):
      compat.kv_get(f"rejoin_transfer/done/{q}", 120)
  print(json.dumps(out), flush=True)
  os._exit(0)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rate", default="1gbit", help="link rate of every host (default 1gbit)")
  parser.add_argument("--mbytes", type=float, default=100.0,
                      help="state size in MB (default 100)")
  parser.add_argument("--out", type=pathlib.Path, default=HERE)
  parser.add_argument("--worker", type=float, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker is not None:
    worker(args.worker)
    return
  result = launch(args)
  print(f"state {result['state_bytes'] / 1e6:.1f} MB from process {result['source']} at "
        f"{args.rate}, rejoined at round {result['rejoined_at_round']}:")
  print(f"  on the wire      {result['on_the_wire_s']:.3f} s = "
        f"{result['on_the_wire_over_wire_time']:.3f}x the wire time "
        f"({result['wire_time_s']:.3f} s for {result['message_bytes'] / 1e6:.1f} MB)")
  print(f"  pack to loaded   {result['pack_to_loaded_s']:.3f} s = "
        f"{result['pack_to_loaded_over_wire_time']:.3f}x (the source packs and queues in "
        f"{result['source_pack_and_queue_s']:.3f} s)")
  print(f"  rejoin() call    {result['rejoin_call_s']:.3f} s (waiting for the decided round)")
  args.out.mkdir(parents=True, exist_ok=True)
  (args.out / "rejoin_transfer.json").write_text(json.dumps(result, indent=1))
  print(f"wrote {args.out / 'rejoin_transfer.json'}")


if __name__ == "__main__":
  main()
