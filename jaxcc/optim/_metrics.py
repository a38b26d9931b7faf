"""What experiments read off the workers: the averaged model, consensus distance, the anchor."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree

from jaxcc._src import compat
from jaxcc.collectives import all_reduce
from jaxcc.optim._diloco import DiLoCoState
from jaxcc.optim._gossip import GossipDiLoCoState


def averaged_params(params, axis_name: str, weight=1.0):
  """The weighted mean of the workers' parameters (the averaged model), inside shard_map.

  One all-reduce of the raveled parameters and one of the weight: ``2(n-1)/n
  N`` bytes per worker on a ring.

  Args:
    params: this worker's parameters.
    axis_name: the mesh axis of the workers.
    weight: this worker's weight (for example 0 for a failed worker).

  Returns:
    The mean, equal on every worker (typed invariant along ``axis_name``).
  """
  flat, unravel = ravel_pytree(params)
  weight = jnp.asarray(weight, flat.dtype)
  total = all_reduce(_weighted(weight, flat), axis_name, algorithm="lax")
  return unravel(total / all_reduce(weight, axis_name, algorithm="lax"))


def consensus_distance(params, axis_name: str, weight=1.0) -> jax.Array:
  """Xi = sqrt(sum_i w_i |x_i - x_bar|^2 / sum_i w_i), x_bar the weighted mean; inside shard_map.

  The consensus distance of Kong et al. (2021) with unit weights. Two
  all-reduces of N bytes and two of a scalar.

  Args:
    params: this worker's parameters.
    axis_name: the mesh axis of the workers.
    weight: this worker's weight (for example 0 for a failed worker).

  Returns:
    A float scalar, equal on every worker.
  """
  flat, _ = ravel_pytree(params)
  mean, _ = ravel_pytree(averaged_params(params, axis_name, weight))
  weight = jnp.asarray(weight, flat.dtype)
  sq = all_reduce(_weighted(weight, jnp.sum(jnp.square(flat - mean))), axis_name,
                  algorithm="lax")
  return jnp.sqrt(sq / all_reduce(weight, axis_name, algorithm="lax"))


def _weighted(weight, x):
  """``weight * x``, and exactly 0 where the weight is 0 (a failed worker's NaNs do not leak)."""
  return jnp.where(weight != 0, weight * x, 0)


def outer_params(state) -> optax.Params:
  """The anchor (outer parameters) of the one DiLoCo or gossip DiLoCo state inside ``state``.

  ``state`` may be the state of an ``optax.chain`` that contains it.
  """
  kinds = (DiLoCoState, GossipDiLoCoState)
  found = [s for s in jax.tree.leaves(state, is_leaf=lambda s: isinstance(s, kinds))
           if isinstance(s, kinds)]
  if len(found) != 1:
    raise ValueError(f"jaxcc.optim.outer_params: expected one DiLoCoState or GossipDiLoCoState "
                     f"in the state, found {len(found)}")
  return found[0].anchor
