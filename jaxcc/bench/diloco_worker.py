"""One worker process of ``jaxcc bench diloco`` (started by ``jaxcc.launcher``; one CPU device).

Trains the char transformer on its own shard with one method, every exchange
over jaxcc's TCP transport, and prints one JSON line: per inner step its wall
time and the time its calls were blocked on the network
(``tcp_blocked_ns``), per round the time it ended, and what it saw of a
killed peer. Each round's outer parameters go to ``<out>/w<rank>_r<round>.npy``
for the driver to average and evaluate.

With a fault, every gossip worker calls ``jaxcc.optim.admit`` at the start
of each round (from round ``rejoin`` where a killed worker rejoins); with
``rejoin`` (a round) the others' ``admit`` waits at that round for the
faulty worker to ask to rejoin (its restart, or itself back from a stop or
a cut), so that a short run does not end before it is back. A stopped worker
(``stop``: rank, round and seconds; halfway through the round a child of it
SIGSTOPs it and SIGCONTs it that many seconds later) is dropped as stuck by
the peers that wait for it and, back, rejoins through ``admit``. A cut-off
worker (``partition``: rank, round and seconds; on the testbed only) sets
its host's link down halfway through the round and up again that many
seconds later, training on meanwhile: its peers drop it as stuck, it finds
itself cut off from the majority in ``admit``, waits there, and rejoins once
the link is back. A killed worker (``kill``: rank, or a list of ranks killed
at once, and round; it SIGKILLs itself halfway through the round) is
restarted by the launcher. With ``rejoin`` the restart takes its state back
with ``jaxcc.optim.rejoin``: it rejoins two rounds after ``rejoin``, its
state sent by its ring successor. With ``kill_in_rejoin`` too the restart SIGKILLs
itself once its peers decided the round it rejoins at, before its state
comes, and its next restart rejoins: the survivors wait at round
``rejoin + 3`` for it to ask. A cut-off worker that jax's
coordination agent ended (the launcher restarts it) rejoins likewise.
Otherwise the restart exits at once. A slow worker (``slow``: rank and
factor) takes ``factor`` times as long per inner step (it sleeps ``factor -
1`` times each step's unblocked time after it): its peers wait for it and
never drop it (its transport beats). The first step compiles and is not
slowed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import jax

from jaxcc import launcher

_KV = "jaxcc/bench/diloco"


def main():
  cfg = json.loads(sys.argv[1])
  job = launcher.job()
  if job.incarnation and cfg.get("rejoin") is None and not cfg.get("partition"):
    print(json.dumps({"rank": job.process_id, "restarted": False}))
    return
  launcher.join()
  import jax.numpy as jnp
  import numpy as np
  import optax
  from jax.flatten_util import ravel_pytree
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  import jaxcc
  from jaxcc._src import compat, ffi
  from jaxcc.bench import char_transformer as ct

  axis, n, me = "x", job.num_processes, job.process_id
  cpu = ffi.load().cpu
  steps, every, codec = cfg["steps"], cfg["sync_every"], cfg.get("codec")
  method = cfg["method"]
  corpus = ct.load_corpus(n)
  data = ct.batches(corpus, steps, cfg.get("seed", 0), cfg.get("batch", ct.BATCH))[:, me]
  params0 = ct.init_params(len(corpus.vocab), 0, cfg.get("width", ct.WIDTH),
                           cfg.get("layers", ct.LAYERS))
  inner = ct.inner_optimizer(steps)
  if method == "data_parallel":
    mean = optax.GradientTransformation(
        lambda p: optax.EmptyState(),
        lambda u, s, p=None: (jaxcc.all_reduce(u, axis, op="mean", codec=codec), s))
    tx = optax.chain(mean, inner)
  elif method == "diloco":
    tx = optax.chain(inner, jaxcc.optim.diloco(axis, every, codec=codec,
                                               algorithm=cfg.get("algorithm", "auto")))
  elif method == "local":
    tx = inner
  else:
    tx = optax.chain(inner, jaxcc.optim.gossip_diloco(
        axis, every, graph=cfg.get("graph", "one_peer_exponential"),
        blocking_rounds=int(method[-1]), codec=codec, drop_rate=cfg.get("drop_rate", 0.0)))

  mesh = jax.make_mesh((n,), (axis,), devices=jax.devices())
  sharding = NamedSharding(mesh, P(axis))

  def to_global(tree):
    return jax.tree.map(
        lambda a: jax.make_array_from_process_local_data(sharding, np.asarray(a)[None]), tree)

  def to_local(tree):
    return jax.tree.map(lambda a: np.asarray(a.addressable_shards[0].data)[0], tree)

  def on_workers(body):
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(axis), out_specs=P(axis)))

  def step_body(params, state, windows):
    params, state, windows = jax.tree.map(lambda a: a[0], (params, state, windows))
    loss, grads = jax.value_and_grad(ct.loss_fn)(params, windows)
    updates, state = tx.update(grads, state, params)
    return jax.tree.map(lambda a: a[None], (optax.apply_updates(params, updates), state, loss))

  init = on_workers(lambda p: jax.tree.map(lambda a: a[None], tx.init(
      jax.tree.map(lambda a: a[0], p))))
  step = on_workers(step_body)
  params = to_global(params0)
  state = init(params)
  gossip = method.startswith("gossip")

  def outer(params, state):
    return jaxcc.optim.outer_params(state) if method == "diloco" or gossip else params

  kill = cfg.get("kill")  # [rank or ranks, round]
  stop = cfg.get("stop")  # [rank, round, seconds]
  rejoin = cfg.get("rejoin")
  slow = cfg.get("slow")  # [rank, factor]
  partition = cfg.get("partition")  # [rank, round, seconds]
  fault = kill or stop or partition
  victims = [] if not fault else fault[0] if isinstance(fault[0], list) else [fault[0]]
  first = 0
  record = {"rank": me, "method": method, "incarnation": job.incarnation, "step": [], "wall": [],
            "blocked": [], "cpu": [], "loss": [], "round_end": {}, "lost": {}, "failed": None}
  if job.incarnation:  # the restarted victim: its state from a live peer
    if cfg.get("kill_in_rejoin") and job.incarnation == 1:
      _kill_once_decided(me, cfg["out"])
    # Compiled first, the step and what a round's end runs: once admitted, its peers wait
    # for its pieces.
    step = step.lower(params, state, to_global(data[0])).compile()
    ravel_pytree(to_local(outer(params, state)))
    began = time.time()
    (params, state), t_join, source = jaxcc.optim.rejoin((params, state),
                                                         timeout_s=cfg.get("timeout_s", 300))
    first = t_join * every
    record.update(rejoined_at_round=t_join, rejoin_source=source,
                  rejoin_s=time.time() - began)
  admitted = {}
  i = first
  while i < steps:
    r, h = divmod(i, every)
    if me in victims and job.incarnation == 0 and i == fault[1] * every + every // 2:
      happened = {"rank": me, "time": time.time(), "step": i}
      if kill:
        _die(os.path.join(cfg["out"], f"killed_{me}.json"), happened)
      name = "stopped" if stop else "partitioned"
      with open(os.path.join(cfg["out"], f"{name}.json"), "w") as f:
        json.dump(dict(happened, seconds=fault[2]), f)
      if stop:
        subprocess.run(["sh", "-c", f"kill -STOP {os.getpid()}; sleep {stop[2]}; "
                       f"kill -CONT {os.getpid()}"], check=True)  # this process stops in it
        record["resumed_at"] = time.time()
      else:
        _set_link("down")

        def heal():
          _set_link("up")
          record["healed_at"] = time.time()

        threading.Timer(partition[2], heal).start()
    if h == 0 and gossip and fault and r >= (rejoin if kill and rejoin is not None else 0):
      wait = r == rejoin or (cfg.get("kill_in_rejoin") and r == rejoin + 3)
      try:
        (params, state), joined, resume_at, cut_off_s = jaxcc.optim.admit(
            (params, state), r, admitted, wait_for=victims if wait else (),
            timeout_s=cfg.get("timeout_s", 300))
      except (TimeoutError, RuntimeError) as e:
        record["failed"] = {"step": i, "time": time.time(), "error": str(e)[:600]}
        break
      if cut_off_s:
        record.setdefault("cut_off", []).append({"round": r, "seconds": cut_off_s})
      for q in joined:
        record.setdefault("admitted", []).append({"round": r, "rank": q,
                                                  "incarnation": admitted[q]})
      if resume_at is not None:  # this process was dropped as stuck and rejoined
        record.update(rejoined_at_round=resume_at, rejoin_source=None)
        i = resume_at * every
        continue
    windows = to_global(data[i])
    t0, b0, c0 = time.perf_counter(), cpu.tcp_blocked_ns(), time.process_time()
    try:
      params, state, loss = step(params, state, windows)
      loss = float(to_local(loss))
    except jax.errors.JaxRuntimeError as e:
      record["failed"] = {"step": i, "time": time.time(), "error": str(e).splitlines()[0][:600]}
      jaxcc.recover()
      break
    if i == first:  # it compiled: the training's clock starts after it, on every worker at once
      if not job.incarnation:
        compat.barrier(f"{_KV}/compiled", cfg.get("timeout_s", 300))
      record["start_time"] = time.time()
    record["step"].append(i)
    blocked = (cpu.tcp_blocked_ns() - b0) * 1e-9
    if slow and me == slow[0] and i != first:  # the first step's time is its compile
      time.sleep((slow[1] - 1) * max(0.0, time.perf_counter() - t0 - blocked))
    record["wall"].append(time.perf_counter() - t0)
    record["blocked"].append(blocked)
    record["cpu"].append(time.process_time() - c0)
    record["loss"].append(loss)
    for q in range(n):
      at = cpu.tcp_lost_at(q) if q != me else 0.0
      if at and str(q) not in record["lost"]:
        record["lost"][str(q)] = {"lost_at": at, "seen_at": time.time(), "step": i,
                                  "why": cpu.tcp_lost(q)}
    if h == every - 1:
      flat, _ = ravel_pytree(to_local(outer(params, state)))
      np.save(os.path.join(cfg["out"], f"w{me}_r{r}.npy"), np.asarray(flat, np.float32))
      record["round_end"][str(r)] = time.time()
    i += 1
  record["end_time"] = time.time()
  cpu.tcp_flush(cfg.get("timeout_s", 300))  # the last pieces leave before the process ends
  print(json.dumps(record), flush=True)
  # No shutdown: its RPCs and the wait for a failed call's token would fail on a lost peer.
  os._exit(0)


def _die(path: str, happened: dict) -> None:
  """Writes ``happened`` to ``path``, then SIGKILLs this process."""
  with open(path, "w") as f:
    json.dump(happened, f)
  os.kill(os.getpid(), signal.SIGKILL)


def _kill_once_decided(me: int, out: str) -> None:
  """Kills this process (in a thread) once its peers decided the round it rejoins at: they
  wait for it and its source is to send it its state."""
  from jaxcc._src import compat
  from jaxcc.optim import _rejoin

  def watch():
    while compat.kv_try_get(f"{_rejoin._KV}/decision/{me}/1") is None:
      time.sleep(0.01)
    _die(os.path.join(out, "killed_in_rejoin.json"), {"rank": me, "time": time.time()})

  threading.Thread(target=watch, daemon=True).start()


def _set_link(state: str) -> None:
  """Sets this testbed host's link (eth0 in its network namespace) up or down: down, every
  packet to or from the host is dropped, so its peers and it hear nothing of each other."""
  subprocess.run(["ip", "link", "set", "eth0", state], check=True)


if __name__ == "__main__":
  main()
