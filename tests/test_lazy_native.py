"""jaxcc without its native modules: the planner and the simulator work, native ops fail clearly.

A subprocess hides ``jaxcc._jaxcc_cpu`` and ``jaxcc._jaxcc_cuda`` (a meta-path
finder that makes importing them raise ImportError, as an unbuilt checkout
does), imports jaxcc, plans and simulates schedules, and then calls each kind
of native op (codec, reduce kernel, native executor) at trace time.
"""

import os
import subprocess
import sys
import types

import pytest

WITHOUT_NATIVE = r"""
import importlib.abc
import sys

HIDDEN = ("jaxcc._jaxcc_cpu", "jaxcc._jaxcc_cuda")


class Hide(importlib.abc.MetaPathFinder):
  def find_spec(self, name, path, target=None):
    if name in HIDDEN:
      raise ImportError(f"no module named {name!r} (hidden by the test)")
    return None


sys.meta_path.insert(0, Hide())

import jax
import jax.numpy as jnp
import numpy as np

import jaxcc
from jaxcc._src import native_executor, reduce

topology = jaxcc.Topology.uniform(4, 25e9).with_straggler(rank=1, fraction=0.5)
for algorithm in ("ring", "optcc"):
  schedule = jaxcc.plan("all_reduce", nbytes=1 << 20, topology=topology, algorithm=algorithm)
  jaxcc.sim.check(schedule)
  assert jaxcc.sim.simulate(schedule, topology).time > 0
assert jaxcc.sim.lower_bound("all_reduce", 1 << 20, topology) > 0
assert not any(name in sys.modules for name in HIDDEN), "the planner loaded a native module"

mesh = jax.make_mesh((4,), ("x",))
schedule = jaxcc.plan("all_reduce", nbytes=4 * 64, topology=jaxcc.Topology.uniform(4, 1.0),
                      algorithm="ring")
native_ops = {
    "codec": lambda: jax.jit(lambda x: jaxcc.codec.encode(x, "entropy").payload).trace(
        jnp.ones(8, jnp.float32)),
    "reduce": lambda: jax.jit(lambda a, b: reduce.reduce_sum([a, b])).trace(
        jnp.ones(8), jnp.ones(8)),
    "collective": lambda: jax.jit(jax.shard_map(
        lambda b: native_executor.run_schedule(b, schedule, "x", ()), mesh=mesh,
        in_specs=jax.P("x"), out_specs=jax.P("x"), check_vma=False)).trace(
            jax.ShapeDtypeStruct((4 * 64,), jnp.float32,
                                 sharding=jax.NamedSharding(mesh, jax.P("x")))),
}
for name, op in native_ops.items():
  try:
    op()
  except ImportError as e:
    print(f"{name}: {e}")
  else:
    print(f"{name}: no error")
"""


def test_planner_and_simulator_need_no_build_and_native_ops_say_how_to_build():
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=4")
  proc = subprocess.run([sys.executable, "-c", WITHOUT_NATIVE], env=env, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  lines = dict(line.split(": ", 1) for line in proc.stdout.splitlines())
  assert set(lines) == {"codec", "reduce", "collective"}, proc.stdout
  for name, message in lines.items():
    assert "jaxcc._jaxcc_cpu is missing" in message, (name, message)
    assert "make install" in message and "--no-build-isolation" in message, (name, message)


def test_a_module_built_from_other_sources_is_refused():
  from jaxcc._src import ffi  # pylint: disable=import-outside-toplevel

  native = ffi.load()
  ffi._check_kernel_ids(native.cpu)  # the build under test matches
  stale = types.SimpleNamespace(
      __name__="jaxcc._jaxcc_cpu", codec_ids=lambda: {"fixed": 1, "entropy": 3},
      codec_dtype_ids=native.cpu.codec_dtype_ids, reducible_dtypes=native.cpu.reducible_dtypes)
  with pytest.raises(ImportError, match=r"built from other sources: its codec ids .*make install"):
    ffi._check_kernel_ids(stale)
