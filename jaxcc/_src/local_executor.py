"""TEMPORARY stand-in until the in-process handler lands: runs the direct schedule natively."""
from __future__ import annotations
import numpy as np
from jaxcc._src import native_executor
from jaxcc import planner
from jaxcc.topology import Topology


def _direct(collective, x, axis_name, axis_size, group_axes, **kw):
  if collective == "ppermute":
    sched = planner.schedule(collective, x.shape[0] // 2, np.dtype(x.dtype).itemsize, Topology.uniform(axis_size, 25e9), "direct", chunks=1, **kw)
    return native_executor.run_schedule(x, sched, axis_name, group_axes)
  sched = planner.schedule(collective, x.shape[0], np.dtype(x.dtype).itemsize,
                       Topology.uniform(axis_size, 25e9), "direct", chunks=1, **kw)
  return native_executor.run_schedule(x, sched, axis_name, group_axes)


def all_reduce(x, axis_name, axis_size, group_axes, op="sum"):
  assert op == "sum"
  return _direct("all_reduce", x, axis_name, axis_size, group_axes)


def reduce_scatter(x, axis_name, axis_size, group_axes, scatter_dimension, tiled, op="sum"):
  from jax import lax
  assert op == "sum"
  full = _direct("reduce_scatter", x, axis_name, axis_size, group_axes)
  n = x.shape[0] // axis_size
  return lax.dynamic_slice(full, (lax.axis_index(axis_name) * n,), (n,))


def all_gather(x, axis_name, axis_size, group_axes, gather_dimension, tiled):
  import jax.numpy as jnp
  from jax import lax
  from jaxcc._src.bits import as_bits, word_of
  buf = lax.dynamic_update_slice(jnp.zeros((axis_size * x.shape[0],), word_of(x.dtype)), as_bits(x),
                                 (lax.axis_index(axis_name) * x.shape[0],))
  return _direct("all_gather", lax.bitcast_convert_type(buf, x.dtype), axis_name, axis_size, group_axes)


def broadcast(x, axis_name, axis_size, group_axes, root):
  return _direct("broadcast", x.reshape(-1), axis_name, axis_size, group_axes, root=root).reshape(x.shape)


def ppermute(x, axis_name, axis_size, group_axes, perm):
  import jax.numpy as jnp
  from jax import lax
  from jaxcc._src.bits import as_bits
  bits = as_bits(x.reshape(-1))
  buf = lax.bitcast_convert_type(jnp.concatenate([bits, jnp.zeros_like(bits)]), x.dtype)
  got = as_bits(_direct("ppermute", buf, axis_name, axis_size, group_axes, perm=perm))[x.size:]
  stays = [s for s, d in perm if s == d]
  if stays:
    got = jnp.where(jnp.isin(lax.axis_index(axis_name), jnp.asarray(stays)), bits, got)
  return lax.bitcast_convert_type(got, x.dtype).reshape(x.shape)
