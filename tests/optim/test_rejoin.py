"""jaxcc.optim.rejoin and admit within one process: their refusals and the layout they read.

The protocol itself (a SIGKILLed worker restarted and admitted, its state from its ring
successor; a cut-off one that waits) runs across processes in tests/test_diloco_network.py;
here the cut-off rule reads a transport's answers given by hand.
"""

import logging

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
  back = _rejoin._set_live((cleared,), 0, True)[0]
  assert np.asarray(back.live).all() and back.live.sharding == state.live.sharding
  assert jax.tree.structure(back) == jax.tree.structure(state)


class GivenTransport:
  """What the native module's tcp_lost and tcp_silent_s answer, per process, given by hand."""

  tcp_stuck_floor_s = 0.5

  def __init__(self, lost, silent):
    self.lost, self.silent = lost, silent

  def tcp_lost(self, q):
    return self.lost.get(q, "")

  def tcp_silent_s(self, q):
    return self.silent.get(q, 0.0)


def test_the_dead_vote_in_neither_part_and_the_silent_or_stuck_against():
  stuck = "rank 1 (process 1) sent nothing for 512 ms while ...: stuck past 500 ms; dropped"
  assert _rejoin._reach(GivenTransport({1: stuck}, {2: 0.8, 3: 0.1}), 0, 4) == ([3], [1, 2])
  dead = GivenTransport({1: "process 1 closed it", 2: "recv: Connection reset by peer"}, {})
  assert _rejoin._reach(dead, 0, 4) == ([3], [])
  assert _rejoin._wait_while_cut_off(dead, 0, 4, 5, 1.0) == 0.0  # 2 of the 2 that may live


def test_a_cut_off_worker_waits_until_dropped_or_heard_again_and_equal_parts_fail(
    monkeypatch, caplog):
  monkeypatch.delenv("JAXCC_INCARNATION", raising=False)
  answers = iter([None, None, "0"])  # dropped/0 names incarnation 0 at the third look
  monkeypatch.setattr(_rejoin.compat, "kv_try_get", lambda key: next(answers))
  alone = GivenTransport({}, {1: 1.0, 2: 1.0, 3: 1.0})
  with caplog.at_level(logging.WARNING, "jaxcc"):
    assert 0.15 < _rejoin._wait_while_cut_off(alone, 0, 4, 5, 10.0) < 5.0
  assert "hears processes [] and not [1, 2, 3]" in caplog.text and "majority" in caplog.text

  healing = GivenTransport({}, {1: 1.0, 2: 1.0, 3: 1.0})

  def cut_heals(key):  # the store is cut off too, until the cut heals
    healing.silent = {}
    raise jax.errors.JaxRuntimeError("UNAVAILABLE: Failed to send RPC to coordination service")

  monkeypatch.setattr(_rejoin.compat, "kv_try_get", cut_heals)
  assert 0.05 < _rejoin._wait_while_cut_off(healing, 0, 4, 5, 10.0) < 5.0

  monkeypatch.setattr(_rejoin.compat, "kv_try_get", lambda key: None)
  with pytest.raises(RuntimeError, match=r"cut off for 0.3 s at round 5: it hears processes "
                     r"\[1\], not \[2, 3\]"):
    _rejoin._wait_while_cut_off(GivenTransport({}, {2: 1.0, 3: 1.0}), 0, 4, 5, 0.3)
