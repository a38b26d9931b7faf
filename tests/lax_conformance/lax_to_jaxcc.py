"""A pytest plugin: the collected test modules call jaxcc where they call lax's collectives.

Loaded with ``-p lax_to_jaxcc``. Once the test modules are imported, and
before any test runs, each module's globals are rebound: ``lax`` (and
``jax.lax``) to a view of ``jax.lax`` whose ``psum``, ``pmean``, ``pmax``,
``pmin``, ``all_gather``, ``psum_scatter`` and ``ppermute`` call jaxcc's; a
name bound to one of those lax functions
(``from jax.lax import psum``) to its wrapper. ``jax.lax`` itself is left as
is: jaxcc calls lax's collectives (its XLA engine, its transposes), so a
global patch would call jaxcc from within jaxcc.

Each wrapper has lax's signature (checked against lax's at run time), with
lax's defaults (``tiled=False``).
"""

from __future__ import annotations

import inspect
import types

import jax
from jax import lax

import jaxcc

_TO_DEFAULT = inspect.signature(lax.all_gather).parameters["to"].default


def wrappers() -> dict:
  """The lax function name -> its jaxcc wrapper, for every function this plugin replaces."""
  return {"psum": _reduction("psum"), "pmean": _reduction("pmean"), "pmax": _reduction("pmax"),
          "pmin": _reduction("pmin"), "all_gather": all_gather, "psum_scatter": psum_scatter,
          "ppermute": ppermute}


def all_gather(x, axis_name, *, axis_index_groups=None, axis=0, tiled=False, to=_TO_DEFAULT):
  """``lax.all_gather`` by ``jaxcc.all_gather``."""
  return jaxcc.all_gather(x, axis_name, axis_index_groups=axis_index_groups, axis=axis,
                          tiled=tiled, to=to)


def psum_scatter(x, axis_name, *, scatter_dimension=0, axis_index_groups=None, tiled=False):
  """``lax.psum_scatter`` by ``jaxcc.psum_scatter``."""
  return jaxcc.psum_scatter(x, axis_name, scatter_dimension=scatter_dimension,
                            axis_index_groups=axis_index_groups, tiled=tiled)


def ppermute(x, axis_name, perm):
  """``lax.ppermute`` by ``jaxcc.ppermute``."""
  return jaxcc.ppermute(x, axis_name, perm)


def pytest_collection_modifyitems(items):
  """Rebinds each collected test module's globals (see the module docstring)."""
  replaced = wrappers()
  _check_signatures(replaced)
  lax_view = _view(lax, replaced)
  jax_view = _view(jax, {"lax": lax_view})
  by_id = {id(getattr(lax, name)): fn for name, fn in replaced.items()}
  for module in {item.module for item in items if getattr(item, "module", None)}:
    for name, value in list(vars(module).items()):
      if value is lax:
        setattr(module, name, lax_view)
      elif value is jax:
        setattr(module, name, jax_view)
      elif id(value) in by_id:
        setattr(module, name, by_id[id(value)])


def _reduction(name):
  """``lax.<name>`` (psum, pmean, pmax or pmin) by ``jaxcc.<name>``."""
  def reduction(x, axis_name, *, axis_index_groups=None):
    return getattr(jaxcc, name)(x, axis_name, axis_index_groups=axis_index_groups)
  reduction.__name__ = reduction.__qualname__ = name
  return reduction


def _check_signatures(replaced):
  for name, fn in replaced.items():
    want = [(p.name, p.kind, p.default)
            for p in inspect.signature(getattr(lax, name)).parameters.values()]
    have = [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]
    if want != have:
      raise RuntimeError(f"lax_to_jaxcc: the wrapper of lax.{name} has parameters {have}, "
                         f"lax's are {want}")


def _view(module, overrides):
  """A module object with ``overrides`` as attributes; every other attribute is ``module``'s."""
  view = types.ModuleType(module.__name__, module.__doc__)
  view.__getattr__ = lambda name: getattr(module, name)
  vars(view).update(overrides)
  return view
