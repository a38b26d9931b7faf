"""DiLoCo as an optax transformation chained after the inner optimizer."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.flatten_util import ravel_pytree

from jaxcc._src import compat
from jaxcc.collectives import all_reduce


class DiLoCoState(NamedTuple):
  """State of ``diloco`` on one worker.

  Attributes:
    count: inner steps taken (int32 scalar); step ``k`` (from 0) ends a round
      and syncs when ``(k + 1) % sync_every == 0``.
    anchor: the outer parameters theta of the current round (a tree like the
      params); equal on every worker.
    momentum: the outer Nesterov buffer (a tree like the params).
  """
  count: jax.Array
  anchor: optax.Params
  momentum: optax.Params


def diloco(axis_name: str, sync_every: int, *, outer_learning_rate: float = 0.7,
           outer_momentum: float = 0.9, nesterov: bool = True, algorithm: str = "auto",
           topology=None, codec=None) -> optax.GradientTransformationExtraArgs:
  """DiLoCo's outer step, for ``optax.chain(inner_optimizer, diloco(...))`` inside shard_map.

  Each worker along ``axis_name`` holds its own parameters and trains them
  with the inner optimizer. Every ``sync_every`` (H) inner steps, at the end of
  a round, the pseudo-gradient ``delta_i = anchor - x_i`` (``x_i`` the
  parameters after this step's inner update) is averaged over the workers with
  one all-reduce, and an outer SGD step moves the anchor:

  .. math::

    m \\leftarrow \\mu m + \\bar\\Delta, \\quad
    \\theta \\leftarrow \\theta - \\eta (\\bar\\Delta + \\mu m)

  (Nesterov; ``theta - eta m`` without). The update returned at that step
  moves the parameters to the new anchor, so every worker starts the next
  round from it; on the other steps the inner update passes through. The
  inner optimizer's state is kept across rounds. Initialise the parameters
  identically on every worker. Everything runs in one jitted program: the sync
  is a ``lax.cond`` on the step counter.

  Communication per worker per round: one blocking all-reduce of the
  parameters (N bytes, raveled to one vector), ``2(n-1)/n N`` bytes in
  ``2(n-1)`` steps on a ring (see ``diloco_round_cost``); nothing on the other
  inner steps.

  Args:
    axis_name: the mesh axis of the workers (bound by ``jax.shard_map``).
    sync_every: inner steps per round, H >= 1.
    outer_learning_rate: eta (0.7 in DiLoCo).
    outer_momentum: mu (0.9 in DiLoCo).
    nesterov: Nesterov momentum (DiLoCo) or heavy ball.
    algorithm: the ``jaxcc.all_reduce`` algorithm ("auto", "lax", "ring", ...).
    topology: the ``jaxcc.Topology`` of the axis, passed to ``jaxcc.all_reduce``.
    codec: the codec of the all-reduce, passed to ``jaxcc.all_reduce``.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` whose update needs ``params``.

  References:
    Douillard et al., DiLoCo: Distributed Low-Communication Training of
    Language Models, https://arxiv.org/abs/2311.08105
  """
  api = "jaxcc.optim.diloco"
  check_outer(api, sync_every, outer_learning_rate, outer_momentum)

  def init_fn(params):
    return DiLoCoState(jnp.zeros([], jnp.int32), params, optax.tree.zeros_like(params))

  def update_fn(updates, state, params=None, **extra_args):
    del extra_args
    updates, params, anchor, momentum = on_worker(api, axis_name, updates, params, state.anchor,
                                                  state.momentum)
    x_new = optax.apply_updates(params, updates)

    def sync():
      flat, unravel = ravel_pytree(optax.tree.sub(anchor, x_new))
      n = compat.axis_size(axis_name, api)
      total = all_reduce(flat, axis_name, algorithm=algorithm, topology=topology, codec=codec)
      new_anchor, new_momentum = outer_step(anchor, momentum, unravel(total / n),
                                            outer_learning_rate, outer_momentum, nesterov)
      return move_to(new_anchor, params, updates), new_anchor, new_momentum

    updates, anchor, momentum = lax.cond(state.count % sync_every == sync_every - 1, sync,
                                         lambda: (updates, anchor, momentum))
    return updates, DiLoCoState(state.count + 1, anchor, momentum)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def check_outer(api: str, sync_every, outer_learning_rate, outer_momentum) -> None:
  """Validate the arguments shared by ``diloco`` and ``gossip_diloco``."""
  if isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1:
    raise ValueError(f"{api}: sync_every must be an int >= 1, got {sync_every!r}")
  if not outer_learning_rate > 0:
    raise ValueError(f"{api}: outer_learning_rate must be > 0, got {outer_learning_rate!r}")
  if not 0 <= outer_momentum < 1:
    raise ValueError(f"{api}: outer_momentum must be in [0, 1), got {outer_momentum!r}")


def on_worker(api: str, axis_name: str, updates, params, *trees):
  """The update's trees, each typed as varying along ``axis_name`` (one copy per worker)."""
  if params is None:
    raise ValueError(f"{api}: update needs params (call tx.update(updates, state, params))")
  compat.axis_size(axis_name, api)
  return jax.tree.map(lambda x: compat.make_varying(x, axis_name), (updates, params) + trees)


def outer_step(anchor, momentum, delta, learning_rate: float, mu: float, nesterov: bool):
  """SGD with momentum on the pseudo-gradient; ``optax.sgd(lr, mu, nesterov)``'s arithmetic."""
  momentum = jax.tree.map(lambda m, d: mu * m + d, momentum, delta)
  direction = jax.tree.map(lambda d, m: d + mu * m, delta, momentum) if nesterov else momentum
  anchor = jax.tree.map(lambda a, u: a - learning_rate * u, anchor, direction)
  return anchor, momentum


def move_to(anchor, params, like):
  """The update that takes ``params`` to ``anchor``, in the dtypes of ``like``."""
  return jax.tree.map(lambda a, p, u: (a - p).astype(u.dtype), anchor, params, like)
