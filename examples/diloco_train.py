"""Gossip DiLoCo training a character-level transformer on 8 workers with non-IID data.

The model and the text (``jaxcc.bench.char_transformer``): the Python
documentation that ships with CPython cut into 8 contiguous shards (non-IID),
10% of each held out. Each worker holds its own copy of a 2-layer, 64-wide
transformer inside ``jax.shard_map`` over 8 virtual CPU devices and trains it
with

    optax.chain(clip, adamw, jaxcc.optim.gossip_diloco(axis_name="x", sync_every=H, ...))

One jitted program makes each inner step; the optimizer decides on its own
step counter when a round ends. Every round the averaged model is evaluated
on the held-out text. ``benchmarks/diloco_experiment.py`` runs this training
for data parallelism, DiLoCo and every gossip configuration.

Run: ``.venv/bin/python examples/diloco_train.py`` (about 20 s on 2 cores;
``--help`` for the graph, blocking rounds, drops and a failed worker).
"""

from __future__ import annotations

import argparse
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxcc
from jaxcc._src.devices import use_virtual_cpu_devices
from jaxcc.bench.char_transformer import (WORKERS, batches, inner_optimizer, init_params,
                                          load_corpus, loss_fn)

AXIS = "x"


def mean_gradients() -> optax.GradientTransformation:
  """Synchronous data parallelism: an all-reduce of the gradients before the inner optimizer.

  Bytes sent per worker per step: ``2(n-1)/n N`` (ring), N the gradients' bytes.
  """

  def update_fn(updates, state, params=None):
    del params
    return jaxcc.all_reduce(updates, AXIS, op="mean"), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


class History(NamedTuple):
  """What ``train`` measured.

  Attributes:
    steps: the inner steps after which the averaged model was evaluated (0 and
      every round).
    average_loss: held-out loss of the averaged model at those steps.
    consensus: consensus distance of the workers' parameters at those steps.
    worker_loss: held-out loss of each worker's own model at the end (NaN for
      a failed worker).
    train_loss: mean training loss of the workers at every step.
    seconds_per_step: wall-clock time of one inner step of all workers here.
  """
  steps: list
  average_loss: list
  consensus: list
  worker_loss: list
  train_loss: list
  seconds_per_step: float


class Trainer:
  """The corpus, the mesh, the initial model and the evaluation programs, shared by runs."""

  def __init__(self, steps: int, workers: int = WORKERS, seed: int = 0):
    self.steps, self.workers = steps, workers
    self.corpus = load_corpus(workers)
    self.mesh = jax.make_mesh((workers,), (AXIS,), devices=jax.devices()[:workers])
    self.sharded = NamedSharding(self.mesh, P(AXIS))
    self.batches = batches(self.corpus, steps, seed)
    self.params = init_params(len(self.corpus.vocab), seed)
    self.eval_windows = jax.device_put(self.corpus.eval_windows, self.sharded)
    self.all_eval_windows = jax.device_put(self.corpus.eval_windows,
                                           NamedSharding(self.mesh, P()))
    self._evaluate_average = self.on_workers(self._average_body, out_specs=P())
    self._evaluate_workers = self.on_workers(self._workers_body, in_specs=(P(AXIS), P()))

  def on_workers(self, body, in_specs=P(AXIS), out_specs=P(AXIS)):
    """``body`` jitted in shard_map over the workers (worker-stacked arrays carry a leading 1)."""
    return jax.jit(jax.shard_map(body, mesh=self.mesh, in_specs=in_specs, out_specs=out_specs))

  def stacked(self, tree):
    """One copy of ``tree`` per worker, sharded over the workers."""
    return jax.device_put(jax.tree.map(lambda a: jnp.stack([a] * self.workers), tree),
                          self.sharded)

  @staticmethod
  def _average_body(params, weight, windows):
    params, weight = jax.tree.map(lambda a: a[0], (params, weight))
    average = jaxcc.optim.averaged_params(params, AXIS, weight)
    loss = jaxcc.all_reduce(loss_fn(average, windows), AXIS, algorithm="lax") / lax.axis_size(AXIS)
    return loss, jaxcc.optim.consensus_distance(params, AXIS, weight)

  @staticmethod
  def _workers_body(params, windows):
    return loss_fn(jax.tree.map(lambda a: a[0], params), windows)[None]

  def train(self, tx, sync_every: int, failed_worker: int | None = None,
            fail_round: int = 0) -> History:
    """Train every worker with ``tx`` for ``self.steps`` inner steps from the same model.

    ``failed_worker`` (from round ``fail_round``) is left out of the averaged
    model, the consensus distance and the worst worker.
    """

    def body(params, state, windows):
      params, state, windows = jax.tree.map(lambda a: a[0], (params, state, windows))
      loss, grads = jax.value_and_grad(loss_fn)(params, windows)
      updates, state = tx.update(grads, state, params)
      return jax.tree.map(lambda a: a[None], (optax.apply_updates(params, updates), state, loss))

    step = self.on_workers(body)
    params = self.stacked(self.params)
    state = self.on_workers(lambda p: jax.tree.map(
        lambda a: a[None], tx.init(jax.tree.map(lambda a: a[0], p))))(params)
    history = History([], [], [], [], [], 0.0)

    def weight(step_index):
      out = np.ones(self.workers, np.float32)
      if failed_worker is not None and step_index // sync_every >= fail_round:
        out[failed_worker] = 0
      return jax.device_put(out, self.sharded)

    def evaluate(step_index):
      loss, consensus = self._evaluate_average(params, weight(step_index), self.eval_windows)
      history.steps.append(step_index)
      history.average_loss.append(float(loss))
      history.consensus.append(float(consensus))

    evaluate(0)
    losses, elapsed = [], 0.0
    for i in range(self.steps):
      windows = jax.device_put(self.batches[i], self.sharded)
      start = time.perf_counter()
      params, state, loss = step(params, state, windows)
      loss.block_until_ready()
      if i:  # step 0 compiles
        elapsed += time.perf_counter() - start
      losses.append(loss)
      if (i + 1) % sync_every == 0:
        evaluate(i + 1)
    worker_loss = np.asarray(self._evaluate_workers(params, self.all_eval_windows), np.float64)
    if failed_worker is not None:
      worker_loss[failed_worker] = np.nan
    return history._replace(worker_loss=worker_loss.tolist(),
                            train_loss=np.asarray(losses).mean(axis=1).tolist(),
                            seconds_per_step=elapsed / max(1, self.steps - 1))


def main():
  use_virtual_cpu_devices(WORKERS)
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--sync-every", type=int, default=20)
  parser.add_argument("--graph", default="one_peer_exponential", choices=jaxcc.optim.GRAPHS)
  parser.add_argument("--blocking-rounds", type=int, default=1)
  parser.add_argument("--drop-rate", type=float, default=0.0)
  parser.add_argument("--failed-worker", type=int, default=None)
  parser.add_argument("--fail-round", type=int, default=0)
  args = parser.parse_args()

  trainer = Trainer(args.steps)
  tx = optax.chain(inner_optimizer(args.steps), jaxcc.optim.gossip_diloco(
      AXIS, args.sync_every, graph=args.graph, blocking_rounds=args.blocking_rounds,
      drop_rate=args.drop_rate, failed_worker=args.failed_worker, fail_round=args.fail_round,
      algorithm="lax"))
  print(f"{WORKERS} workers, {len(trainer.corpus.vocab)} characters, "
        f"{sum(len(s) for s in trainer.corpus.shards)} training tokens; gossip DiLoCo on "
        f"{args.graph}, H = {args.sync_every}, {args.blocking_rounds} blocking round(s)")
  h = trainer.train(tx, args.sync_every, args.failed_worker, args.fail_round)
  for s, loss, xi in zip(h.steps, h.average_loss, h.consensus):
    print(f"step {s:4d}  averaged-model loss {loss:.4f}  consensus distance {xi:.4f}")
  print(f"worst worker {np.nanmax(h.worker_loss):.4f}, {h.seconds_per_step * 1e3:.0f} ms per step")


if __name__ == "__main__":
  main()
