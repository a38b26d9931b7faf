"""The topology a measured network traces its programs on, per mesh axis (``MeasuredNetwork.jit``).

A collective called with ``topology=None`` on an axis with an active measured
network plans on its topology. Set only while a program is traced: each
topology has a traced function of its own, so a changed network re-traces once.
"""

from __future__ import annotations

import contextlib
import contextvars

_ACTIVE: contextvars.ContextVar[dict] = contextvars.ContextVar("jaxcc_measured", default={})


def topology(axis_name):
  """The active measured topology of ``axis_name``, or None."""
  return _ACTIVE.get().get(axis_name)


@contextlib.contextmanager
def using(axis_name, topology):
  """Makes ``topology`` the active one of ``axis_name`` inside the block."""
  token = _ACTIVE.set({**_ACTIVE.get(), axis_name: topology})
  try:
    yield
  finally:
    _ACTIVE.reset(token)
