"""A small non-IID problem trained by 8 workers inside shard_map, and its plain-JAX reference.

Each worker fits its own target under a curved loss (a weighted quadratic
plus a cosine), so workers pull apart between syncs. Parameters are a tree
with odd leaf sizes (the anchor's fragments need padding).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

N = 8
AXIS = "x"


def mesh(n=N):
  return jax.make_mesh((n,), (AXIS,), devices=jax.devices()[:n])


def targets(n=N, seed=0):
  rng = np.random.default_rng(seed)
  return {"w": rng.normal(size=(n, 3, 5)).astype(np.float32),
          "b": rng.normal(size=(n, 7)).astype(np.float32)}


def initial_params():
  return {"w": np.full((3, 5), 0.1, np.float32), "b": np.linspace(-1, 1, 7, dtype=np.float32)}


def loss(params, target):
  total = 0.0
  for k in params:
    scale = 1 + jnp.arange(params[k].size, dtype=jnp.float32).reshape(params[k].shape) / 4
    total += jnp.sum(scale * jnp.square(params[k] - target[k])) / 2
    total += 0.1 * jnp.sum(jnp.cos(3 * params[k]))
  return total


def on_workers(fn, n=N, target=None):
  """``fn(params, target)`` per worker inside a jitted shard_map; stacked targets and outputs."""

  def body(target):
    target = jax.tree.map(lambda a: a[0], target)
    params = jax.tree.map(lambda a: lax.pcast(jnp.asarray(a), AXIS, to="varying"),
                          initial_params())
    return jax.tree.map(lambda a: a[None], fn(params, target))

  m = mesh(n)
  run = jax.jit(jax.shard_map(body, mesh=m, in_specs=P(AXIS), out_specs=P(AXIS)))
  target = targets(n) if target is None else target
  return run(jax.device_put(target, NamedSharding(m, P(AXIS))))


def train(tx, steps, n=N, target=None):
  """``steps`` steps of ``tx`` from ``initial_params`` on every worker: (params, state), stacked.

  The scan's carry also checks that ``tx.update`` keeps the state's types.
  """

  def fn(params, target):
    def step(carry, _):
      params, state = carry
      updates, state = tx.update(jax.grad(loss)(params, target), state, params)
      return (optax.apply_updates(params, updates), state), None

    return lax.scan(step, (params, tx.init(params)), length=steps)[0]

  return jax.tree.map(np.asarray, on_workers(fn, n, target))


def mixer(W):
  """Mixing with the matrix ``W`` along the leading (worker) axis of every leaf."""
  return lambda tree: jax.tree.map(lambda a: jnp.einsum("ij,j...->i...", W, a), tree)


def reference(inner, steps, sync_every, mix_anchor, mix_delta, outer_learning_rate=0.7,
              outer_momentum=0.9, n=N):
  """The documented algorithm on stacked arrays: vmapped inner steps, mixes as matrices.

  ``mix_anchor(t)`` and ``mix_delta(t)`` return the functions that mix round
  t's anchors and pseudo-gradients; the outer step is ``optax.sgd`` with
  Nesterov momentum, one per worker. Returns the stacked anchors.
  """
  target = targets(n)
  x = jax.tree.map(lambda a: jnp.broadcast_to(a, (n,) + a.shape), initial_params())
  inner_state, anchor = jax.vmap(inner.init)(x), x
  outer = optax.sgd(outer_learning_rate, outer_momentum, nesterov=True)
  outer_state = jax.vmap(outer.init)(anchor)

  @jax.jit
  def inner_step(x, inner_state):
    g = jax.vmap(jax.grad(loss))(x, target)
    updates, inner_state = jax.vmap(inner.update)(g, inner_state, x)
    return optax.apply_updates(x, updates), inner_state

  for t in range(steps // sync_every):
    for _ in range(sync_every):
      x, inner_state = inner_step(x, inner_state)
    delta = mix_delta(t)(optax.tree.sub(anchor, x))
    updates, outer_state = jax.vmap(outer.update)(delta, outer_state)
    anchor = optax.apply_updates(mix_anchor(t)(anchor), updates)
    x = anchor
  return jax.tree.map(np.asarray, anchor)


def assert_trees_close(a, b, rtol, atol=0.0):
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, err_msg=jax.tree_util.keystr(path))


def max_relative_difference(a, b):
  return max(float(np.max(np.abs(x - y)) / np.max(np.abs(y)))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
