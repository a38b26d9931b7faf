"""lax's names for jaxcc's reductions, with lax's signatures and defaults.

``jaxcc.psum``, ``pmean``, ``pmax`` and ``pmin`` are ``jaxcc.all_reduce``
with ``op`` fixed; ``jaxcc.psum_scatter`` is ``jaxcc.reduce_scatter`` with
lax's ``tiled=False``; ``jaxcc.pbroadcast`` is ``jaxcc.broadcast``, typed
varying as lax's result is. Each also takes jaxcc's keyword options (``algorithm``,
``executor``, ``topology``, ``codec``, ``bucket_bytes``). Bytes sent and steps
are those of the collective they call.
"""

from __future__ import annotations

import jax

from jaxcc._src import compat
from jaxcc.collectives.all_reduce import all_reduce
from jaxcc.collectives.broadcast import broadcast
from jaxcc.collectives.reduce_scatter import reduce_scatter


def psum(x, axis_name, *, axis_index_groups=None, **options):
  """``lax.psum``: ``jaxcc.all_reduce(x, axis_name, op="sum")``."""
  compat.bound_axes(axis_name, "jaxcc.psum")  # an unbound axis names this function
  return all_reduce(x, axis_name, op="sum", axis_index_groups=axis_index_groups, **options)


def pmean(x, axis_name, *, axis_index_groups=None, **options):
  """``lax.pmean``: ``jaxcc.all_reduce(x, axis_name, op="mean")``."""
  compat.bound_axes(axis_name, "jaxcc.pmean")  # an unbound axis names this function
  return all_reduce(x, axis_name, op="mean", axis_index_groups=axis_index_groups, **options)


def pmax(x, axis_name, *, axis_index_groups=None, **options):
  """``lax.pmax``: ``jaxcc.all_reduce(x, axis_name, op="max")``."""
  compat.bound_axes(axis_name, "jaxcc.pmax")  # an unbound axis names this function
  return all_reduce(x, axis_name, op="max", axis_index_groups=axis_index_groups, **options)


def pmin(x, axis_name, *, axis_index_groups=None, **options):
  """``lax.pmin``: ``jaxcc.all_reduce(x, axis_name, op="min")``."""
  compat.bound_axes(axis_name, "jaxcc.pmin")  # an unbound axis names this function
  return all_reduce(x, axis_name, op="min", axis_index_groups=axis_index_groups, **options)


def psum_scatter(x, axis_name, *, scatter_dimension=0, axis_index_groups=None, tiled=False,
                 **options):
  """``lax.psum_scatter``: ``jaxcc.reduce_scatter`` with lax's default ``tiled=False``."""
  compat.bound_axes(axis_name, "jaxcc.psum_scatter")  # an unbound axis names this function
  return reduce_scatter(x, axis_name, scatter_dimension=scatter_dimension,
                        axis_index_groups=axis_index_groups, tiled=tiled, **options)


def pbroadcast(x, axis_name, source, **options):
  """``lax.pbroadcast``: ``jaxcc.broadcast(x, axis_name, root=source)``, typed varying along the
  axes as lax's result (XLA:CPU has no lowering of lax's)."""
  compat.bound_axes(axis_name, "jaxcc.pbroadcast")  # an unbound axis names this function
  y = broadcast(x, axis_name, root=source, **options)
  return jax.tree.map(lambda v: compat.make_varying(v, axis_name), y)
