"""jaxcc.optim.rejoin and admit within one process: their refusals and the layout they read.

The protocol itself (a SIGKILLed worker restarted and admitted, its state from its ring
successor) runs across processes in tests/test_diloco_network.py.
"""

import jax
import numpy as np
import pytest

from jaxcc import optim
from jaxcc.optim import _rejoin

from . import N, on_workers


def gossip_state():
  tx = optim.gossip_diloco("x", 4)
  return on_workers(lambda params, target: tx.init(params))


def test_rejoin_refuses_a_process_that_did_not_restart(monkeypatch):
  monkeypatch.delenv("JAXCC_INCARNATION", raising=False)
  with pytest.raises(ValueError, match="process 0 is not a restarted one"):
    optim.rejoin({"w": np.zeros(3)})
  with pytest.raises(ValueError, match="rejoin: the tree holds no GossipDiLoCoState"):
    optim.rejoin({"w": np.zeros(3)}, incarnation=1)  # before any wait on the network


def test_admit_needs_a_gossip_state():
  with pytest.raises(ValueError, match="holds no GossipDiLoCoState"):
    optim.admit({"w": np.zeros(3)}, 0, {})


def test_live_views_are_read_and_set_through_the_sharding():
  state = gossip_state()
  assert state.live.shape == (N, N) and _rejoin._rank_processes(state.live) == [0] * N
  assert _rejoin._ranks_of(state, 0) == list(range(N))
  cleared = state._replace(live=_rejoin._with_local_shards(
      state.live, [np.zeros(s.data.shape, bool) for s in state.live.addressable_shards]))
  assert not np.asarray(cleared.live).any()
  assert _rejoin._live_processes(cleared.live, 1) == [False]
  back = _rejoin._set_live((cleared,), 0)[0]
  assert np.asarray(back.live).all() and back.live.sharding == state.live.sharding
  assert jax.tree.structure(back) == jax.tree.structure(state)
