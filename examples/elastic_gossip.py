"""Elastic gossip DiLoCo: worker processes that die, restart and rejoin while the others train on.

The parent runs the job with ``jaxcc.launcher``: the coordination service in
a process of its own, so any worker may die, process 0 too, and ``--workers``
processes on loopback, one CPU device each. Each trains the character-level
transformer of ``examples/diloco_train.py`` on its own shard with

    optax.chain(clip, adamw, jaxcc.optim.gossip_diloco(axis_name="x", sync_every=H))

every exchange over jaxcc's TCP transport, and calls ``jaxcc.optim.admit`` at
the start of every round. ``--kill RANK@ROUND`` SIGKILLs that worker halfway
through the round: its peers find it lost and mix without it; the launcher
starts it again, and it calls ``jaxcc.optim.rejoin``, which brings it a live
peer's parameters and optimizer state and the round to resume at. The others
wait for it to ask at the next round (``admit``'s ``wait_for``: a run this
short could end before the restart is up), and it trains from two rounds on.

Run: ``.venv/bin/python examples/elastic_gossip.py`` (about 30 s on 2 cores;
``--help`` for the sizes and the worker to kill).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

import numpy as np

AXIS = "x"


def train(steps: int, sync_every: int, kill: tuple[int, int] | None) -> dict:
  """One worker of the job, from ``jaxcc.launcher.join`` to its last step."""
  from jaxcc import launcher
  job = launcher.join()
  import jax
  import optax
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  import jaxcc
  from jaxcc.bench.char_transformer import (batches, init_params, inner_optimizer, load_corpus,
                                            loss_fn)

  me, n = job.process_id, job.num_processes
  corpus = load_corpus(n)
  data = batches(corpus, steps)[:, me]
  tx = optax.chain(inner_optimizer(steps), jaxcc.optim.gossip_diloco(AXIS, sync_every))
  mesh = jax.make_mesh((n,), (AXIS,), devices=jax.devices())
  sharding = NamedSharding(mesh, P(AXIS))

  def stacked(tree):
    """This process' ``tree`` as its row of global arrays sharded over the workers."""
    return jax.tree.map(
        lambda a: jax.make_array_from_process_local_data(sharding, np.asarray(a)[None]), tree)

  def on_workers(body):
    def per_worker(*args):
      out = body(*jax.tree.map(lambda a: a[0], args))
      return jax.tree.map(lambda a: a[None], out)
    return jax.jit(jax.shard_map(per_worker, mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS)))

  def step_body(params, state, windows):
    loss, grads = jax.value_and_grad(loss_fn)(params, windows)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss

  step = on_workers(step_body)
  params = stacked(init_params(len(corpus.vocab)))
  state = on_workers(tx.init)(params)
  out = {"rank": me, "incarnation": job.incarnation, "losses": {}}
  i = 0
  if job.incarnation:
    # Compiled before it asks: from the round its peers decide, they wait for its pieces.
    step = step.lower(params, state, stacked(data[0])).compile()
    (params, state), round_, source = jaxcc.optim.rejoin((params, state))
    out.update(rejoined_at_round=round_, source=source)
    i = round_ * sync_every
  admitted = {}
  while i < steps:
    r, h = divmod(i, sync_every)
    if h == 0:
      wait_for = [kill[0]] if kill and r == kill[1] + 1 and me != kill[0] else ()
      admission = jaxcc.optim.admit((params, state), r, admitted, wait_for=wait_for)
      params, state = admission.tree
      if admission.resume_at is not None:  # dropped as stuck, and back
        i = admission.resume_at * sync_every
        continue
    if kill and (me, r, h) == (kill[0], kill[1], sync_every // 2) and not job.incarnation:
      os.kill(os.getpid(), signal.SIGKILL)
    params, state, loss = step(params, state, stacked(data[i]))
    out["losses"].setdefault(r, []).append(float(loss.addressable_shards[0].data[0]))
    i += 1
  out["losses"] = {r: float(np.mean(v)) for r, v in out["losses"].items()}
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workers", type=int, default=4)
  parser.add_argument("--steps", type=int, default=100)
  parser.add_argument("--sync-every", type=int, default=10)
  parser.add_argument("--kill", default="1@2", metavar="RANK@ROUND",
                      help="the worker SIGKILLed halfway through that round ('' for none)")
  parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args()
  kill = tuple(map(int, args.kill.split("@"))) if args.kill else None
  if args.worker:
    print(json.dumps(train(args.steps, args.sync_every, kill)), flush=True)
    # No jax.distributed shutdown: its barrier would wait on a lost peer. A worker that ends
    # first is a lost peer to those still in their last round: a lost message, no error.
    os._exit(0)

  from jaxcc import launcher
  processes = launcher.launch(__file__, ["--worker", *sys.argv[1:]], nproc=args.workers,
                              respawn={kill[0]} if kill else (), timeout_s=600)
  print(f"{args.workers} worker processes, gossip DiLoCo, H = {args.sync_every}"
        + (f"; worker {kill[0]} killed in round {kill[1]}" if kill else ""))
  for p in processes:
    got = p.json()
    losses = got["losses"]
    line = (f"worker {got['rank']}: training loss round {min(map(int, losses))} "
            f"{losses[min(losses, key=int)]:.4f}, round {max(map(int, losses))} "
            f"{losses[max(losses, key=int)]:.4f}")
    if got["incarnation"]:
      line += (f"; restarted, rejoined at round {got['rejoined_at_round']} with the state of "
               f"worker {got['source']}")
    print(line)


if __name__ == "__main__":
  main()
