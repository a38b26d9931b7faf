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


def _all_reduce_as(name: str, op: str):
  """``lax.<name>`` as ``jaxcc.all_reduce(x, axis_name, op=op)``; an unbound axis names
  ``jaxcc.<name>``."""
  def reduction(x, axis_name, *, axis_index_groups=None, **options):
    compat.bound_axes(axis_name, f"jaxcc.{name}")
    return all_reduce(x, axis_name, op=op, axis_index_groups=axis_index_groups, **options)

  reduction.__name__ = reduction.__qualname__ = name
  reduction.__doc__ = f"``lax.{name}``: ``jaxcc.all_reduce(x, axis_name, op={op!r})``."
  return reduction


psum = _all_reduce_as("psum", "sum")
pmean = _all_reduce_as("pmean", "mean")
pmax = _all_reduce_as("pmax", "max")
pmin = _all_reduce_as("pmin", "min")


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
