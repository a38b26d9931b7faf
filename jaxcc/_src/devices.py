"""Virtual CPU devices: one process that jax sees as ``n`` CPU devices."""

from __future__ import annotations

import jax

from jaxcc._src import compat


def use_virtual_cpu_devices(n: int) -> None:
  """Make jax start on the CPU with ``n`` virtual devices; call it before jax computes anything.

  Sets ``jax_num_cpu_devices`` (which wins over an ``XLA_FLAGS`` device count)
  and, unless ``JAX_PLATFORMS`` chose platforms, ``jax_platforms`` to "cpu".
  Once jax's backend has started the count is fixed: then this checks that
  there are at least ``n`` CPU devices.

  Raises:
    ValueError: ``n`` is not a positive integer.
    RuntimeError: jax already started with fewer than ``n`` CPU devices.
  """
  if isinstance(n, bool) or not isinstance(n, int) or n < 1:
    raise ValueError(f"use_virtual_cpu_devices: n must be a positive integer, got {n!r}")
  if compat.backends_started():
    have = len(jax.devices("cpu"))
    if have < n:
      raise RuntimeError(
          f"use_virtual_cpu_devices: jax already started with {have} CPU device(s), fewer than "
          f"the {n} asked for; call use_virtual_cpu_devices({n}) before anything runs on jax "
          f"(or start the process with JAX_NUM_CPU_DEVICES={n})")
    return
  if not jax.config.jax_platforms:
    jax.config.update("jax_platforms", "cpu")
  jax.config.update("jax_num_cpu_devices", n)


def virtual_cpu_environ(n: int) -> dict[str, str]:
  """The environment variables that start a new process' jax on the CPU with ``n`` devices."""
  return {"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": str(n)}
