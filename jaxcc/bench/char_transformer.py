"""The character-level transformer and the non-IID text of the DiLoCo experiments.

The text is the Python documentation that ships with CPython
(``pydoc_data.topics``): its topics, sorted by name and concatenated, are cut
into one contiguous shard per worker, so each worker reads about different
parts of the language (non-IID). The last 10% of every shard is held out; the
evaluation set is those held-out parts of all shards. The model is a
pre-norm causal transformer (2 layers, 64 wide by default: 116k parameters).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from pydoc_data import topics

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


def batches(corpus: Corpus, steps: int, seed: int = 0, batch: int = BATCH) -> np.ndarray:
  """``(steps, workers, batch, CONTEXT + 1)`` random windows, each worker from its own shard."""
  rng = np.random.default_rng(seed)
  out = np.empty((steps, len(corpus.shards), batch, CONTEXT + 1), np.int32)
  for w, shard in enumerate(corpus.shards):
    starts = rng.integers(0, len(shard) - CONTEXT - 1, size=(steps, batch))
    out[:, w] = shard[starts[..., None] + np.arange(CONTEXT + 1)]
  return out


def init_params(vocab_size: int, seed: int = 0, width: int = WIDTH, layers: int = LAYERS):
  """The initial parameters: ``layers`` blocks of ``width`` (a multiple of the 4 heads)."""
  keys = iter(jax.random.split(jax.random.key(seed), 4 + 4 * layers))
  normal = lambda *shape: 0.02 * jax.random.normal(next(keys), shape)  # noqa: E731
  w = width
  blocks = [{"ln1": jnp.ones(w), "qkv": normal(w, 3 * w), "out": normal(w, w),
             "ln2": jnp.ones(w), "up": normal(w, 4 * w), "up_b": jnp.zeros(4 * w),
             "down": normal(4 * w, w), "down_b": jnp.zeros(w)}
            for _ in range(layers)]
  return {"embed": normal(vocab_size, w), "pos": normal(CONTEXT, w), "blocks": blocks,
          "ln_f": jnp.ones(w), "head": normal(w, vocab_size)}


def _norm(x, gain):
  x = x - x.mean(-1, keepdims=True)
  return x * lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-5) * gain


def logits_of(params, tokens):
  """A pre-norm causal transformer: ``tokens (B, T)`` to next-character logits ``(B, T, V)``."""
  t, width = tokens.shape[-1], params["embed"].shape[-1]
  x = params["embed"][tokens] + params["pos"][:t]
  causal = jnp.tril(jnp.ones((t, t), bool))
  heads = lambda a: a.reshape(a.shape[:-1] + (HEADS, width // HEADS))  # noqa: E731
  for b in params["blocks"]:
    q, k, v = jnp.split(_norm(x, b["ln1"]) @ b["qkv"], 3, axis=-1)
    scores = jnp.einsum("bqhd,bkhd->bhqk", heads(q), heads(k)) / np.sqrt(width // HEADS)
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
