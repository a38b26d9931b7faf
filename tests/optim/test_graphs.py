"""Mixing matrices and round costs: doubly stochastic, the one-peer product, hand-counted bytes."""

import math

import jax
import numpy as np
import pytest

from jaxcc.optim import (GRAPHS, RoundCost, diloco_round_cost, gossip_round_cost,
                         mixing_matrix)


@pytest.mark.parametrize("graph", GRAPHS)
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 16])
def test_mixing_matrices_are_doubly_stochastic_with_self_weight(graph, n):
  for r in range(5):
    w = mixing_matrix(graph, n, r)
    np.testing.assert_allclose(w.sum(axis=0), 1, rtol=1e-12)
    np.testing.assert_allclose(w.sum(axis=1), 1, rtol=1e-12)
    assert (w >= 0).all() and (np.diag(w) > 0).all()


def test_graph_degrees():
  peers = {g: int((mixing_matrix(g, 8)[0] > 0).sum()) - 1 for g in GRAPHS}
  assert peers == {"complete": 7, "ring": 2, "exponential": 3, "one_peer_exponential": 1}
  assert int((mixing_matrix("ring", 2)[0] > 0).sum()) == 2  # i - 1 and i + 1 are one peer
  w = mixing_matrix("one_peer_exponential", 8, 4)  # round 4: hop 2^(4 mod 3) = 2
  assert w[5, 3] == w[5, 5] == 0.5


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_log2n_consecutive_one_peer_rounds_give_the_mean(n):
  for start in range(4):
    w = np.eye(n)
    for r in range(start, start + int(math.log2(n))):
      w = mixing_matrix("one_peer_exponential", n, r) @ w
    np.testing.assert_allclose(w, np.full((n, n), 1 / n), atol=1e-12)


def test_contraction_factors_for_8_workers():
  rho = {g: np.linalg.svd(mixing_matrix(g, 8) - 1 / 8, compute_uv=False)[0] for g in GRAPHS}
  np.testing.assert_allclose([rho[g] for g in GRAPHS], [0, 0.805, 0.5, 0.924], atol=1e-3)


def test_round_costs_by_hand():
  params = {"w": jax.ShapeDtypeStruct((10, 10), np.float32),
            "b": jax.ShapeDtypeStruct((3,), np.float32)}  # 103 floats, 412 bytes
  assert diloco_round_cost(params, 8) == RoundCost(0, 2 * 7 / 8 * 412, 0, 14)
  # H = 10: 5 fragments of ceil(103 / 5) = 21 floats, 420 bytes per peer.
  assert gossip_round_cost(params, 8, "one_peer_exponential", 1, 10) == RoundCost(420, 412, 5, 1)
  assert gossip_round_cost(params, 8, "ring", 2, 10) == RoundCost(840, 1648, 10, 4)
  assert gossip_round_cost(params, 8, "exponential", 0, 10) == RoundCost(1260, 0, 15, 0)
  assert gossip_round_cost(params, 8, "complete", 1, 10) == RoundCost(
      1.75 * 420, 1.75 * 412, 70, 14)


def test_unknown_graph_names_the_choices():
  with pytest.raises(ValueError, match="graph must be one of"):
    mixing_matrix("star", 8)
