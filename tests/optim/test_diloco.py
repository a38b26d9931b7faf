"""diloco against data-parallel SGD and against a plain-JAX reference of the algorithm."""

import jax
import numpy as np
import optax
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxcc import optim

from . import (AXIS, N, assert_trees_close, initial_params, loss, mesh, mixer, on_workers,
               reference, targets, train)


def mean_gradients():
  """Synchronous data parallelism: gradients averaged over the workers before the optimizer."""
  return optax.GradientTransformation(
      lambda params: optax.EmptyState(),
      lambda updates, state, params=None: (jax.tree.map(lambda g: lax.pmean(g, AXIS), updates),
                                           state))


def test_one_step_rounds_without_momentum_are_data_parallel_sgd():
  steps = 12
  ours = train(optax.chain(optax.sgd(0.05), optim.diloco(
      AXIS, 1, outer_learning_rate=1.0, outer_momentum=0.0)), steps)[0]
  data_parallel = train(optax.chain(mean_gradients(), optax.sgd(0.05)), steps)[0]
  assert_trees_close(ours, data_parallel, rtol=1e-5, atol=1e-6)
  for leaf in jax.tree.leaves(ours):
    np.testing.assert_array_equal(leaf, np.broadcast_to(leaf[0], leaf.shape))


@pytest.mark.parametrize("algorithm", ["auto", "lax"])
def test_matches_reference_with_adamw_and_nesterov(algorithm):
  steps, every = 20, 5
  inner = optax.adamw(0.05, weight_decay=0.1)
  params, state = train(optax.chain(inner, optim.diloco(AXIS, every, algorithm=algorithm)), steps)
  want = reference(inner, steps, every, lambda t: lambda tree: tree,
                   lambda t: mixer(np.full((N, N), 1 / N)))
  anchor = optim.outer_params(state)
  assert_trees_close(anchor, want, rtol=1e-4, atol=1e-5)
  # After a sync every worker holds the anchor, and the anchors are equal.
  assert_trees_close(params, anchor, rtol=1e-6, atol=1e-6)
  for leaf in jax.tree.leaves(anchor):
    np.testing.assert_array_equal(leaf, np.broadcast_to(leaf[0], leaf.shape))
  np.testing.assert_array_equal(state[1].count, steps)


def test_inner_updates_pass_through_between_syncs():
  steps = 3
  ours = train(optax.chain(optax.adam(0.05), optim.diloco(AXIS, 4)), steps)[0]
  local = train(optax.adam(0.05), steps)[0]
  assert_trees_close(ours, local, rtol=1e-6)  # up to XLA's fusion choices


@pytest.mark.parametrize("outer", [optim.diloco, optim.gossip_diloco])
def test_one_jitted_step_serves_sync_and_inner_steps(outer):
  tx = optax.chain(optax.adam(0.05), outer(AXIS, 3))

  def step(params, state, target):
    params, state, target = jax.tree.map(lambda a: a[0], (params, state, target))
    updates, new_state = tx.update(jax.grad(loss)(params, target), state, params)
    for old, new in zip(jax.tree.leaves(state), jax.tree.leaves(new_state)):
      assert jax.typeof(old) == jax.typeof(new)
    return jax.tree.map(lambda a: a[None], (optax.apply_updates(params, updates), new_state))

  m = mesh()
  run = jax.jit(jax.shard_map(step, mesh=m, in_specs=P(AXIS), out_specs=P(AXIS)))
  params, state = on_workers(lambda p, t: (p, tx.init(p)))
  target = jax.device_put(targets(), NamedSharding(m, P(AXIS)))
  for _ in range(7):
    params, state = run(params, state, target)
  assert run._cache_size() == 1
  np.testing.assert_allclose(np.asarray(params["w"]), train(tx, 7)[0]["w"], rtol=1e-6)


def test_bad_arguments_fail_with_their_names():
  with pytest.raises(ValueError, match="sync_every"):
    optim.diloco(AXIS, 0)
  with pytest.raises(ValueError, match="outer_momentum"):
    optim.diloco(AXIS, 2, outer_momentum=1.0)
  tx = optim.diloco(AXIS, 2)
  params = initial_params()
  with pytest.raises(NameError, match="shard_map"):
    tx.update(params, tx.init(params), params)
  with pytest.raises(ValueError, match="needs params"):
    on_workers(lambda p, t: tx.update(p, tx.init(p)))
  with pytest.raises(ValueError, match="codec"):
    on_workers(lambda p, t: optim.diloco(AXIS, 1, codec="lz4").update(p, tx.init(p), p))
  with pytest.raises(ValueError, match="one DiLoCoState"):
    optim.outer_params(optax.adam(0.1).init(params))


def test_averaged_params_and_consensus_distance():
  rng = np.random.default_rng(1)
  xs = {"a": rng.normal(size=(N, 4)).astype(np.float32),
        "b": rng.normal(size=(N, 2, 3)).astype(np.float32)}
  xs["a"][5] = np.nan  # a failed worker's parameters must not leak through weight 0
  weight = (np.arange(N) != 5).astype(np.float32)

  def body(x, w):
    x, w = jax.tree.map(lambda a: a[0], (x, w))
    avg = optim.averaged_params(x, AXIS, w)
    return jax.tree.map(lambda a: a[None], (avg, optim.consensus_distance(x, AXIS, w)))

  m = mesh()
  put = lambda a: jax.device_put(a, NamedSharding(m, P(AXIS)))  # noqa: E731
  avg, xi = jax.tree.map(np.asarray, jax.jit(jax.shard_map(
      body, mesh=m, in_specs=P(AXIS), out_specs=P(AXIS)))(put(xs), put(weight)))
  keep = weight > 0
  flat = np.concatenate([xs["a"].reshape(N, -1), xs["b"].reshape(N, -1)], axis=1)[keep]
  np.testing.assert_allclose(avg["a"][0], xs["a"][keep].mean(0), rtol=1e-5)
  np.testing.assert_allclose(avg["b"][3], xs["b"][keep].mean(0), rtol=1e-5)
  want = np.sqrt(np.mean(np.sum((flat - flat.mean(0)) ** 2, axis=1)))
  np.testing.assert_allclose(xi, np.full(N, want), rtol=1e-5)
