"""The native executor (one jaxcc_collective call per collective) against the XLA executor.

Both run the same schedule with the same reduction order, so their results
must have the same bits; a rank that never arrives must fail within the
timeout with an error that names it.
"""

import os
import re
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxcc
from jaxcc import Topology
from jaxcc._src import native_executor, xla_executor
from jaxcc.schedules import optcc
from jaxcc.schedules.ir import DST, SRC, Schedule

DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16, jnp.int32)
SEED = np.random.SeedSequence().entropy


def mesh_of(p):
  return jax.make_mesh((p,), ("x",), devices=jax.devices()[:p])


def inputs(p, shape, rng):
  out = []
  for dt in DTYPES:
    host = rng.normal(size=(p * shape[0],) + shape[1:]) * 50
    out.append(host.astype(dt))
  return out


def run_both(p, fn, arrays, out_spec):
  mesh = mesh_of(p)
  xs = [jax.device_put(a, NamedSharding(mesh, P("x"))) for a in arrays]
  results = []
  for executor in ("native", "xla"):
    f = jax.jit(jax.shard_map(lambda *bs: tuple(fn(b, executor) for b in bs), mesh=mesh,
                              in_specs=(P("x"),) * len(xs), out_specs=(out_spec,) * len(xs)))
    results.append([np.asarray(y) for y in f(*xs)])
  return results


def assert_same_bits(native, xla, what):
  for dt, a, b in zip(DTYPES, native, xla):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes(), f"{what} {jnp.dtype(dt).name}: native != xla (seed {SEED})"


CASES = [(coll, alg, p) for p in (1, 2, 3, 4, 8)
         for coll, algs in (("all_reduce", ("ring", "direct", "optcc", "r2ccl")),
                            ("reduce_scatter", ("ring", "direct")),
                            ("all_gather", ("ring", "direct")),
                            ("broadcast", ("ring", "direct")))
         for alg in algs]


@pytest.mark.parametrize("collective, algorithm, p", CASES)
def test_native_equals_xla_bit_for_bit(collective, algorithm, p):
  rng = np.random.default_rng([SEED, p, len(collective), len(algorithm)])
  topo = Topology.uniform(p, 1e10).with_straggler(p - 1, 0.4) if p > 1 else None
  fns = {
      "all_reduce": (lambda b, ex: jaxcc.all_reduce(b, "x", algorithm=algorithm, executor=ex,
                                                    topology=topo), (13, 7), P()),
      "reduce_scatter": (lambda b, ex: jaxcc.reduce_scatter(
          b, "x", scatter_dimension=1, algorithm=algorithm, executor=ex), (3, 3 * p), P("x")),
      "all_gather": (lambda b, ex: jaxcc.all_gather(b, "x", axis=1, algorithm=algorithm,
                                                    executor=ex), (3, 5), P("x")),
      "broadcast": (lambda b, ex: jaxcc.broadcast(b, "x", root=p - 1, algorithm=algorithm,
                                                  executor=ex), (9,), P()),
  }
  fn, shape, spec = fns[collective]
  native, xla = run_both(p, fn, inputs(p, shape, rng), spec)
  assert_same_bits(native, xla, f"{collective}/{algorithm}/p={p}")


@pytest.mark.parametrize("chunks", [1, 3])
def test_optcc_grid_form_runs_on_both_executors(chunks):
  """OptCC's grid form (rows, then columns, and back; leaves through a rotating row), which
  ``optcc`` takes from 512 owners on, forced on 8 ranks: a 2 x 3 grid and two leaves."""
  p, length = 8, 1003
  topo = Topology.uniform(p, 1e10).with_straggler(3, 0.3)
  grid, leaves = optcc.grid_layout(topo.bandwidth, min_owners=4)
  assert grid.shape == (2, 3) and len(leaves) == 2
  rng = np.random.default_rng([SEED, chunks])
  arrays = inputs(p, (length,), rng)
  schedules = {np.dtype(a.dtype).itemsize: optcc._grid_optcc(
      length, p, np.dtype(a.dtype).itemsize, chunks, grid, leaves) for a in arrays}

  def fn(b, executor):
    sched = schedules[np.dtype(b.dtype).itemsize]
    if executor == "native":
      return native_executor.run_schedule(b, sched, "x", ())
    return xla_executor.run_schedule(b, sched, "x")

  native, xla = run_both(p, fn, arrays, P("x"))
  assert_same_bits(native, xla, f"optcc grid, {chunks} chunks")
  for a, y in zip(arrays, native):
    want = np.asarray(a, np.float64).reshape(p, -1).sum(0)
    got = np.asarray(y, np.float64).reshape(p, -1)
    tol = 0 if np.dtype(a.dtype).kind == "i" else 0.02 * np.abs(want).max()
    np.testing.assert_allclose(got, np.broadcast_to(want, got.shape), atol=tol)


def test_independent_collectives_and_xla_psum_in_one_program():
  mesh = mesh_of(8)
  rng = np.random.default_rng(SEED)
  xs = [jax.device_put(rng.normal(size=(8 * (100 + i),)).astype(np.float32),
                       NamedSharding(mesh, P("x"))) for i in range(5)]
  algorithms = ("ring", "direct", "optcc", "r2ccl", "ring")

  def body(*bs):
    outs = [jaxcc.all_reduce(b, "x", algorithm=a, executor="native")
            for b, a in zip(bs, algorithms)]
    return tuple(outs) + (lax.psum(bs[0], "x"),)

  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"),) * 5, out_specs=(P(),) * 6))
  for _ in range(10):
    outs = f(*xs)
  for x, y in zip(xs, outs):
    np.testing.assert_allclose(np.asarray(y), np.asarray(x).reshape(8, -1).sum(0), rtol=1e-5,
                               atol=1e-4)
  np.testing.assert_allclose(np.asarray(outs[0]), np.asarray(outs[-1]), rtol=1e-5, atol=1e-5)


def test_inside_scan_and_on_a_2d_mesh():
  mesh = jax.make_mesh((2, 4), ("a", "x"))
  host = np.random.default_rng(SEED).normal(size=(4, 40)).astype(np.float32)
  x = jax.device_put(host, NamedSharding(mesh, P("a", "x")))

  def run(executor):
    def step(c, _):
      y = jaxcc.all_reduce(c, "x", algorithm="optcc", executor=executor)
      return c + 0.125 * y, None
    f = jax.shard_map(lambda b: lax.scan(step, b, None, length=4)[0], mesh=mesh,
                      in_specs=P("a", "x"), out_specs=P("a", "x"))
    return np.asarray(jax.jit(f)(x))

  assert run("native").tobytes() == run("xla").tobytes()


MISSING_RANK = """
from jaxcc._src.devices import use_virtual_cpu_devices
use_virtual_cpu_devices(4)
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
import jaxcc
from jaxcc._src import native_executor
sched = jaxcc.plan("all_reduce", 4 * 40, jaxcc.Topology.uniform(5, 1.0), "ring")
mesh = jax.make_mesh((4,), ("x",))
x = jax.device_put(np.ones((4 * 40,), np.float32), NamedSharding(mesh, P("x")))
f = jax.jit(jax.shard_map(lambda b: native_executor.run_schedule(b, sched, "x", ()),
                          mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False))
np.asarray(f(x))
"""


def test_a_missing_rank_times_out_naming_it():
  """A schedule for 5 ranks run by 4 devices: everyone waits for rank 4, then fails."""
  env = dict(os.environ, JAXCC_TIMEOUT_S="2")
  start = time.monotonic()
  proc = subprocess.run([sys.executable, "-c", MISSING_RANK], env=env, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode != 0
  assert re.search(r"timed out after 2 s at step \d+ waiting for rank \d.*never joined: rank 4",
                   proc.stderr), proc.stderr
  assert time.monotonic() - start < 60


OTHER_TABLE_VERSION = """
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
import jaxcc
from jaxcc._src import native_executor
from jaxcc.schedules.ir import TABLE_VERSION
sched = jaxcc.plan("all_reduce", 4 * 6, jaxcc.Topology.uniform(2, 1.0), "ring")
wire = sched.serialized.copy()
wire[1] = TABLE_VERSION + 1
sched.__dict__["serialized"] = wire  # as a table written by another build of jaxcc
mesh = jax.make_mesh((2,), ("x",))
x = jax.device_put(np.ones((2 * 6,), np.float32), NamedSharding(mesh, P("x")))
f = jax.jit(jax.shard_map(lambda b: native_executor.run_schedule(b, sched, "x", ()),
                          mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False))
np.asarray(f(x))
"""


def test_native_executor_rejects_a_table_of_another_version():
  """In a subprocess: a failed native call fails the later jaxcc programs of its process."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  proc = subprocess.run([sys.executable, "-c", OTHER_TABLE_VERSION], env=env, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode != 0
  assert ("schedule table magic/version mismatch: rebuild jaxcc (found version 2, this build "
          "reads version 1)") in proc.stderr, proc.stderr


def test_xla_executor_rejects_a_table_without_header():
  s = jaxcc.plan("all_reduce", 4 * 41, Topology.uniform(3, 1.0), "direct", chunks=1)
  sched = Schedule(s.collective, s.nranks, s.length, s.itemsize, s.algorithm, s.table,
                   s.num_steps)
  sched.__dict__["serialized"] = s.table.reshape(-1)  # rows only, as before the header
  mesh = mesh_of(3)
  f = jax.jit(jax.shard_map(lambda b: xla_executor.run_schedule(b, sched, "x"), mesh=mesh,
                            in_specs=P("x"), out_specs=P("x"), check_vma=False))
  x = jax.device_put(np.ones(3 * 41, np.float32), NamedSharding(mesh, P("x")))
  with pytest.raises(ValueError, match=r"^jaxcc.all_reduce: schedule table magic/version "
                     r"mismatch: rebuild jaxcc \(found no jaxcc table header"):
    f.lower(x)


def test_native_needs_one_process_and_manual_axes():
  mesh = jax.make_mesh((2, 4), ("a", "x"),
                       axis_types=(jax.sharding.AxisType.Auto, jax.sharding.AxisType.Explicit))
  x = jax.device_put(np.ones((8, 4), np.float32), NamedSharding(mesh, P(None, "x")))
  f = jax.jit(jax.shard_map(lambda b: jaxcc.all_reduce(b, "x", executor="native"), mesh=mesh,
                            in_specs=P(None, "x"), out_specs=P(), axis_names={"x"}))
  with pytest.raises(NotImplementedError, match="axes are all manual"):
    f(x)



def test_one_token_orders_every_native_call_of_a_program():
  """Independent collectives still run in program order: each call takes the previous one's token."""
  mesh = mesh_of(4)

  def body(a, b):
    return (jaxcc.all_reduce(a, "x", algorithm="ring", executor="native"), lax.psum(b, "x"),
            jaxcc.all_gather(b, "x", executor="native"))

  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P("x")),
                            out_specs=(P(), P(), P("x"))))
  x = jax.device_put(np.arange(8, dtype=np.float32), NamedSharding(mesh, P("x")))
  text = f.lower(x, x).as_text()
  # The schedule interpreter (jaxcc_collective) and the in-process path (jaxcc_local_collective).
  calls = [line for line in text.splitlines()
           if "@jaxcc_collective" in line or "@jaxcc_local_collective" in line]
  assert len(calls) == 2, text
  first = re.match(r"\s*(%\S+?)(?::\d+)?\s*=", calls[0]).group(1)
  assert "!stablehlo.token" in calls[0] and f"({first}#0," in calls[1], calls
  y = f(x, x)
  np.testing.assert_array_equal(np.asarray(y[0]), np.asarray(y[1]))


def test_pacing_splits_each_port_by_bytes_with_a_floor():
  """Pairs share a port by the bytes they carry; none is paced below half an even split."""
  topo = Topology.uniform(4, 25e6).with_straggler(1, 0.5).with_straggler(3, 0.5)
  optcc = jaxcc.plan("all_reduce", 8 << 20, topo, algorithm="optcc")  # owners 0, 2; leaves 1, 3
  rates = native_executor.pacing_rates(optcc, topo).reshape(4, 4)
  np.testing.assert_allclose(rates[0], [0, 6.25e6, 12.5e6, 6.25e6], rtol=1e-6)
  np.testing.assert_allclose(rates[1], [6.25e6, 0, 6.25e6, 0], rtol=1e-6)
  r2ccl = jaxcc.plan("all_reduce", 8 << 20, topo, algorithm="r2ccl")
  rates = native_executor.pacing_rates(r2ccl, topo).reshape(4, 4)
  pairs = np.zeros((4, 4), bool)
  pairs[r2ccl.table[:, SRC], r2ccl.table[:, DST]] = True
  floor = np.minimum.outer(topo.send_bandwidth, topo.recv_bandwidth) / 6
  assert np.array_equal(rates > 0, pairs) and np.all(rates[pairs] >= np.floor(floor[pairs]))
  assert len(native_executor.pacing_rates(r2ccl, Topology.uniform(4, 25e6))) == 0
