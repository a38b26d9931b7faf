"""gossip_diloco: exactly DiLoCo on the complete graph, the reference on the others, failures."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax

from jaxcc import optim
from jaxcc.optim._mixing import Mixer

from . import (AXIS, N, assert_trees_close, max_relative_difference, mesh, mixer, on_workers,
               reference, targets, train)

STEPS, EVERY = 20, 5
INNER = optax.adamw(0.05, weight_decay=0.1)


@functools.cache
def diloco_anchor():
  return optim.outer_params(train(optax.chain(INNER, optim.diloco(AXIS, EVERY)), STEPS)[1])


def gossip_anchor(**kwargs):
  tx = optax.chain(INNER, optim.gossip_diloco(AXIS, EVERY, **kwargs))
  return optim.outer_params(train(tx, STEPS)[1])


@pytest.mark.parametrize("blocking_rounds", [1, 2])
def test_complete_graph_is_diloco(blocking_rounds):
  got = gossip_anchor(graph="complete", blocking_rounds=blocking_rounds)
  assert max_relative_difference(got, diloco_anchor()) <= 1e-6


def test_log2n_blocking_one_peer_rounds_are_diloco():
  got = gossip_anchor(graph="one_peer_exponential", blocking_rounds=3)  # 2^3 = N workers
  assert max_relative_difference(got, diloco_anchor()) <= 1e-5


@pytest.mark.parametrize("graph,blocking_rounds", [
    ("ring", 1), ("exponential", 0), ("one_peer_exponential", 2), ("complete", 0)])
def test_matches_reference(graph, blocking_rounds):
  """Anchors mixed by W1(t), pseudo-gradients by W2 on the hops ending at t; Nesterov per worker."""
  w = functools.partial(optim.mixing_matrix, graph, N)

  def mix_delta(t):
    mixes = [mixer(w(t + r + 1 - blocking_rounds)) for r in range(blocking_rounds)]
    return lambda tree: functools.reduce(lambda acc, f: f(acc), mixes, tree)

  want = reference(INNER, STEPS, EVERY, lambda t: mixer(w(t)), mix_delta)
  got = gossip_anchor(graph=graph, blocking_rounds=blocking_rounds)
  assert_trees_close(got, want, rtol=1e-4, atol=1e-5)
  # Doubly stochastic mixing keeps the workers' mean on DiLoCo's outer recursion, but the
  # workers disagree.
  assert max(float(np.std(leaf, axis=0).max()) for leaf in jax.tree.leaves(got)) > 1e-3


def effective_matrices(graph, rounds, **failures):
  """W_t of the overlapped mix in rounds 0..rounds-1 as the workers mix: row i from worker i."""

  def fn(params, target):
    del params, target
    m = Mixer("test", AXIS, graph, codec=None, algorithm="lax", topology=None, **failures)
    eye = lax.pcast(jnp.eye(N), AXIS, to="varying")[m.me]

    def one(_, t):
      return None, m.mix(eye, t, 0, t % m.num_phases, jnp.ones(N, bool))[0]

    return lax.scan(one, None, jnp.arange(rounds))[1]

  return np.asarray(on_workers(fn)).transpose(1, 0, 2)  # (rounds, receiver, sender)


@pytest.mark.parametrize("graph", ["ring", "one_peer_exponential", "complete"])
def test_drops_and_a_failed_worker_renormalise(graph):
  rounds, failed, fail_round = 120, 2, 60
  kw = dict(drop_rate=0.3, failed_worker=failed, fail_round=fail_round, seed=7)
  w = effective_matrices(graph, rounds, **kw)
  np.testing.assert_allclose(w.sum(axis=2), 1, rtol=1e-6)
  np.testing.assert_array_equal(w, effective_matrices(graph, rounds, **kw))  # deterministic
  assert (w != effective_matrices(graph, rounds, **{**kw, "seed": 8})).any()
  # Only graph edges carry weight.
  for t in range(rounds):
    assert (w[t][optim.mixing_matrix(graph, N, t) == 0] == 0).all()
  # From fail_round on, the failed worker keeps its own vector and nobody mixes it in.
  np.testing.assert_array_equal(w[fail_round:, failed], np.eye(N)[failed][None].repeat(60, 0))
  others = np.delete(np.arange(N), failed)
  assert (w[fail_round:, others, failed] == 0).all()
  # About 30% of the messages are lost before the failure.
  full = np.stack([optim.mixing_matrix(graph, N, t) for t in range(fail_round)])
  sent = (full > 0) & ~np.eye(N, dtype=bool)
  if graph == "complete":  # a lost contribution is lost for every receiver
    lost = np.mean(w[:fail_round, (failed + 1) % N] == 0, where=~np.eye(N, dtype=bool)[failed + 1])
  else:
    lost = np.mean(w[:fail_round][sent] == 0)
  assert 0.22 < lost < 0.38


def test_failed_worker_is_isolated_from_round_0():
  tx = optax.chain(INNER, optim.gossip_diloco(AXIS, EVERY, graph="one_peer_exponential",
                                              failed_worker=3, fail_round=0))
  poisoned = targets()
  poisoned["w"][3] = np.nan
  clean = optim.outer_params(train(tx, STEPS)[1])
  got = optim.outer_params(train(tx, STEPS, target=poisoned)[1])
  keep = np.arange(N) != 3
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(clean)):
    np.testing.assert_array_equal(a[keep], b[keep])
  assert not np.isfinite(got["w"][3]).all()


def test_training_with_drops_is_deterministic():
  tx = optax.chain(INNER, optim.gossip_diloco(AXIS, EVERY, drop_rate=0.3, seed=3))
  a = train(tx, STEPS)
  assert_trees_close(a, train(tx, STEPS), rtol=0)
  mean = jax.tree.map(lambda x: x.mean(0), optim.outer_params(a[1]))
  assert max_relative_difference(mean, jax.tree.map(lambda x: x[0], diloco_anchor())) < 0.5


def test_bad_arguments_fail_with_their_names():
  for kwargs, match in [({"graph": "star"}, "graph"), ({"blocking_rounds": -1}, "blocking_rounds"),
                        ({"drop_rate": 1.0}, "drop_rate"), ({"fail_round": -1}, "fail_round")]:
    with pytest.raises(ValueError, match=match):
      optim.gossip_diloco(AXIS, 4, **kwargs)
  for kwargs, match in [({"failed_worker": N}, "failed_worker"), ({"codec": "lz4"}, "codec")]:
    tx = optim.gossip_diloco(AXIS, 4, **kwargs)
    with pytest.raises(ValueError, match=match):
      on_workers(lambda p, t: tx.update(p, tx.init(p), p))


def test_state_layout():
  tx = optim.gossip_diloco(AXIS, 4)
  params = {"a": jnp.ones((3, 3)), "b": jnp.ones(2, jnp.bfloat16)}
  state = tx.init(params)
  # 2 fragments of the 11 parameters; outside shard_map no live tracking.
  assert state.mix_buffer.shape == (2, 6) and state.mix_buffer.dtype == jnp.float32
  assert state.live.shape == (0,) and (np.asarray(state.handles) == -1).all()
  assert state.handles.shape == (2,)
  inside = on_workers(lambda p, t: tx.init(p))
  assert inside.live.shape == (N, N)
  assert optim.outer_params((optax.adam(0.1).init(params), state)) is params
