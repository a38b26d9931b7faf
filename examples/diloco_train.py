"""Gossip DiLoCo training a character-level transformer on 8 workers with non-IID data.

The text is the Python documentation that ships with CPython
(``pydoc_data.topics``): its topics, sorted by name and concatenated, are cut
into 8 contiguous shards, so each worker reads about different parts of the
language (non-IID). The last 10% of every shard is held out; the evaluation
set is those held-out parts of all shards. Each worker holds its own copy of a
2-layer, 64-wide transformer inside ``jax.shard_map`` over 8 virtual CPU
devices and trains it with

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
from pydoc_data import topics

import jaxcc
from jaxcc._src.devices import use_virtual_cpu_devices

AXIS = "x"
WORKERS = 8
WIDTH, LAYERS, HEADS, CONTEXT = 64, 2, 4, 64
BATCH = 8                 # sequences per worker per inner step
LEARNING_RATE, WARMUP = 3e-3, 20
HELD_OUT = 0.1            # the fraction of each shard kept for evaluation
EVAL_WINDOWS = 512        # held-out windows of CONTEXT + 1 characters


class Corpus(NamedTuple):
  """The text, tokenised.

  Attributes:
    vocab: the characters, in token order.
    shards: per worker, the int32 tokens of its training text.
    eval_windows: ``(EVAL_WINDOWS, CONTEXT + 1)`` int32 held-out windows.
  """
  vocab: str
  shards: list
  eval_windows: np.ndarray


def load_corpus(workers: int = WORKERS) -> Corpus:
  text = "".join(topics.topics[name] for name in sorted(topics.topics))
  vocab = "".join(sorted(set(text)))
  tokens = np.frombuffer(text.encode("utf-32-le"), np.uint32)
  tokens = np.searchsorted(np.frombuffer(vocab.encode("utf-32-le"), np.uint32), tokens)
  shards, held = [], []
  for part in np.array_split(tokens.astype(np.int32), workers):
    cut = int(len(part) * (1 - HELD_OUT))
    shards.append(part[:cut])
    held.append(part[cut:])
  held = np.concatenate(held)
  starts = np.linspace(0, len(held) - CONTEXT - 1, EVAL_WINDOWS).astype(int)
  return Corpus(vocab, shards, np.stack([held[s:s + CONTEXT + 1] for s in starts]))


def batches(corpus: Corpus, steps: int, seed: int = 0) -> np.ndarray:
  """``(steps, workers, BATCH, CONTEXT + 1)`` random windows, each worker from its own shard."""
  rng = np.random.default_rng(seed)
  out = np.empty((steps, len(corpus.shards), BATCH, CONTEXT + 1), np.int32)
  for w, shard in enumerate(corpus.shards):
    starts = rng.integers(0, len(shard) - CONTEXT - 1, size=(steps, BATCH))
    out[:, w] = shard[starts[..., None] + np.arange(CONTEXT + 1)]
  return out


def init_params(vocab_size: int, seed: int = 0):
  keys = iter(jax.random.split(jax.random.key(seed), 4 + 4 * LAYERS))
  normal = lambda *shape: 0.02 * jax.random.normal(next(keys), shape)  # noqa: E731
  blocks = [{"ln1": jnp.ones(WIDTH), "qkv": normal(WIDTH, 3 * WIDTH), "out": normal(WIDTH, WIDTH),
             "ln2": jnp.ones(WIDTH), "up": normal(WIDTH, 4 * WIDTH), "up_b": jnp.zeros(4 * WIDTH),
             "down": normal(4 * WIDTH, WIDTH), "down_b": jnp.zeros(WIDTH)}
            for _ in range(LAYERS)]
  return {"embed": normal(vocab_size, WIDTH), "pos": normal(CONTEXT, WIDTH), "blocks": blocks,
          "ln_f": jnp.ones(WIDTH), "head": normal(WIDTH, vocab_size)}


def _norm(x, gain):
  x = x - x.mean(-1, keepdims=True)
  return x * lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-5) * gain


def logits_of(params, tokens):
  """A pre-norm causal transformer: ``tokens (B, T)`` to next-character logits ``(B, T, V)``."""
  t = tokens.shape[-1]
  x = params["embed"][tokens] + params["pos"][:t]
  causal = jnp.tril(jnp.ones((t, t), bool))
  heads = lambda a: a.reshape(a.shape[:-1] + (HEADS, WIDTH // HEADS))  # noqa: E731
  for b in params["blocks"]:
    q, k, v = jnp.split(_norm(x, b["ln1"]) @ b["qkv"], 3, axis=-1)
    scores = jnp.einsum("bqhd,bkhd->bhqk", heads(q), heads(k)) / np.sqrt(WIDTH // HEADS)
    weights = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
    x = x + jnp.einsum("bhqk,bkhd->bqhd", weights, heads(v)).reshape(x.shape) @ b["out"]
    x = x + jax.nn.gelu(_norm(x, b["ln2"]) @ b["up"] + b["up_b"]) @ b["down"] + b["down_b"]
  return _norm(x, params["ln_f"]) @ params["head"]


def loss_fn(params, windows):
  """Mean next-character cross-entropy (nats) over ``windows (B, CONTEXT + 1)``."""
  logits = logits_of(params, windows[:, :-1])
  return optax.softmax_cross_entropy_with_integer_labels(logits, windows[:, 1:]).mean()


def inner_optimizer(steps: int) -> optax.GradientTransformation:
  """AdamW as in DiLoCo (betas 0.9/0.95, weight decay 0.1, clipping 1.0), warmup then cosine.

  The warmup is ``WARMUP`` steps, or half of ``steps`` when that is fewer.
  """
  schedule = optax.warmup_cosine_decay_schedule(0.0, LEARNING_RATE, min(WARMUP, steps // 2),
                                                steps, LEARNING_RATE / 10)
  return optax.chain(optax.clip_by_global_norm(1.0),
                     optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=0.1))


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
