"""The in-process executor (jaxcc._src.local_executor) against lax and the XLA executor.

Sums must equal the XLA executor's direct schedule bit for bit (same order,
same kernel), max / min ``lax.pmax`` / ``lax.pmin`` bit for bit, copies the
inputs' exact bits; every dtype, odd sizes, 1, 3 and 8 devices, a 2-D mesh,
a tuple of axes, loops. Inputs are fresh random numbers on every run mixed
with special values; the seed is in every failure message.
"""

import itertools
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxcc
from bitwise import SPECIAL_BITS, bits, uint_of
from jaxcc._src import config
from jaxcc._src.reduce import REDUCIBLE_DTYPES
from local_harness import call

SEED = np.random.SeedSequence().entropy
DTYPES = tuple(d.name for d in REDUCIBLE_DTYPES)
FLOATS = ("float32", "bfloat16", "float16", "float64")
SIZES = (1, 7, 1023)


@pytest.fixture(autouse=True)
def x64():
  """int64 and float64 are among the dtypes: run every test with 64-bit types enabled."""
  with jax.enable_x64(True):
    yield


def mesh_of(p):
  return jax.make_mesh((p,), ("x",), devices=jax.devices()[:p])


def host_data(rng, shape, dtype, special=0.2):
  """Random values of ``dtype``; floats mixed with NaN payloads, infinities, +-0, subnormals."""
  dtype = np.dtype(jnp.dtype(dtype))
  n = int(np.prod(shape))
  if jnp.issubdtype(dtype, jnp.integer):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True).reshape(shape)
  x = (rng.standard_normal(n) * 4).astype(dtype)
  if dtype.name in SPECIAL_BITS:
    pool = np.array(SPECIAL_BITS[dtype.name], uint_of(dtype)).view(dtype)
  else:  # float64: zeros of both signs, infinities, NaN, subnormals
    pool = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, -1e-310])
  pick = rng.random(n) < special
  x[pick] = rng.choice(pool, int(pick.sum()))
  return x.reshape(shape)


def run(p, body, hosts, out_specs, mesh=None, in_spec=P("x")):
  mesh = mesh or mesh_of(p)
  xs = [jax.device_put(h, NamedSharding(mesh, in_spec)) for h in hosts]
  f = jax.jit(jax.shard_map(lambda *bs: body(*bs), mesh=mesh, in_specs=(in_spec,) * len(xs),
                            out_specs=out_specs, check_vma=False))
  return jax.tree.map(np.asarray, f(*xs))


def assert_bits(actual, expected, what):
  actual, expected = np.asarray(actual), np.asarray(expected)
  assert actual.dtype == expected.dtype and actual.shape == expected.shape, what
  diff = np.flatnonzero(bits(actual).reshape(-1) != bits(expected).reshape(-1))
  assert not diff.size, (f"{what}: {diff.size} of {actual.size} differ, first at {diff[0]}: "
                         f"{bits(actual).flat[diff[0]]:#x} != {bits(expected).flat[diff[0]]:#x} "
                         f"(seed {SEED})")


@pytest.mark.parametrize("p, n", list(itertools.product((1, 3, 8), SIZES)))
def test_all_reduce_sum_equals_the_direct_schedule_bit_for_bit(p, n):
  rng = np.random.default_rng([SEED, p, n])
  hosts = [host_data(rng, (p * n, 3), d) for d in DTYPES]

  def body(*bs):
    return tuple(
        (call("all_reduce", b, "x", mesh, b.shape),
         jaxcc.all_reduce(b, "x", algorithm="direct", executor="xla"))
        for b in bs)

  mesh = mesh_of(p)
  outs = run(p, body, hosts, P("x"), mesh)
  for d, host, (mine, xla) in zip(DTYPES, hosts, outs):
    assert_bits(mine, xla, f"all_reduce {d} p={p} n={n}")
    if jnp.issubdtype(d, jnp.integer):  # wrapping sums are exact: equal to numpy's
      total = host.reshape(p, n, 3).sum(0, dtype=host.dtype)
      assert_bits(mine, np.concatenate([total] * p), f"all_reduce {d} vs numpy")


@pytest.mark.parametrize("p, op", list(itertools.product((1, 3, 8), ("max", "min"))))
def test_all_reduce_max_min_equal_lax_bit_for_bit(p, op):
  rng = np.random.default_rng([SEED, p, len(op)])
  hosts = [host_data(rng, (p * 1023,), d, special=0.5) for d in DTYPES]
  # Ties between -0.0 and +0.0 and all-NaN columns, in both rank orders.
  for d, h in zip(DTYPES, hosts):
    if jnp.issubdtype(d, jnp.floating) and p > 1:
      cols = h.reshape(p, -1)
      cols[:, :4] = np.array(0.0, d)
      cols[0, 0] = cols[-1, 1] = np.array(-0.0, d)
      cols[:, 2] = np.array(np.nan, d)
  pop = lax.pmax if op == "max" else lax.pmin
  mesh = mesh_of(p)

  def body(*bs):
    return tuple((call("all_reduce", b, "x", mesh, b.shape, op=op), pop(b, "x")) for b in bs)

  for d, host, (mine, ref) in zip(DTYPES, hosts, run(p, body, hosts, P("x"), mesh)):
    # One rank is a copy; XLA's copy of bf16 drops NaN payloads, jaxcc's keeps every bit.
    assert_bits(mine, host if p == 1 else ref, f"all_reduce {op} {d} p={p}")


@pytest.mark.parametrize("p, dim, tiled", [(3, 0, True), (8, 0, True), (8, 1, True),
                                           (8, 2, False), (1, 0, True), (3, 1, False)])
def test_reduce_scatter_equals_the_direct_schedule_and_lax(p, dim, tiled):
  rng = np.random.default_rng([SEED, p, dim, tiled])
  block = 7 if tiled else 1
  shape = [5, 3, 2]
  shape[dim] = p * block
  hosts = [host_data(rng, (p * shape[0],) + tuple(shape[1:]), d) for d in DTYPES]
  mesh = mesh_of(p)

  def out_shape(b):
    s = list(b.shape)
    if tiled:
      s[dim] //= p
    else:
      del s[dim]
    return tuple(s)

  def body(*bs):
    outs = []
    for b in bs:
      kw = dict(scatter_dimension=dim, tiled=tiled)
      mine = [call("reduce_scatter", b, "x", mesh, out_shape(b), op=op, **kw)
              for op in ("sum", "max", "min")]
      ref = [jaxcc.reduce_scatter(b, "x", algorithm="direct", executor="xla", **kw)]
      for pop in (lax.pmax, lax.pmin):  # pmax, then this rank's block
        full = pop(b, "x")
        block_len = b.shape[dim] // p
        mine_block = lax.dynamic_slice_in_dim(full, lax.axis_index("x") * block_len, block_len,
                                              dim)
        ref.append(mine_block if tiled else jnp.squeeze(mine_block, dim))
      outs.append((mine, ref))
    return tuple(outs)

  for d, (mine, ref) in zip(DTYPES, run(p, body, hosts, P("x"), mesh)):
    if p == 1:  # one rank is a copy; XLA's copy of bf16 drops NaN payloads, jaxcc's does not
      ref = [ref[0]] * 3
    for op, a, b in zip(("sum", "max", "min"), mine, ref):
      assert_bits(a, b, f"reduce_scatter {op} {d} p={p} dim={dim} tiled={tiled}")


ALL_DTYPES = DTYPES + ("bool", "complex64", "uint16")


@pytest.mark.parametrize("p, dim, tiled", [(8, 0, True), (8, 1, True), (3, 2, True),
                                           (8, 0, False), (3, 1, False), (8, 3, False),
                                           (1, 0, True)])
def test_all_gather_moves_the_exact_bits(p, dim, tiled):
  rng = np.random.default_rng([SEED, p, dim, tiled])
  per_rank = (3, 7, 2)
  hosts = []
  for d in ALL_DTYPES:
    if d == "bool":
      hosts.append(rng.random((p,) + per_rank) < 0.5)
    elif d == "complex64":
      hosts.append(rng.standard_normal((p,) + per_rank).astype(np.complex64))
    else:
      hosts.append(host_data(rng, (p,) + per_rank, d))
  hosts = [h.reshape((p * per_rank[0],) + per_rank[1:]) for h in hosts]
  mesh = mesh_of(p)

  def out_shape(b):
    s = list(b.shape)
    if tiled:
      s[dim] *= p
    else:
      s.insert(dim, p)
    return tuple(s)

  def body(*bs):
    return tuple(call("all_gather", b, "x", mesh, out_shape(b), gather_dimension=dim,
                      tiled=tiled) for b in bs)

  for d, host, got in zip(ALL_DTYPES, hosts, run(p, body, hosts, P("x"), mesh)):
    blocks = np.split(host, p)  # rank q's x
    want = np.concatenate(blocks, dim) if tiled else np.stack(blocks, dim)
    assert_bits(got, np.concatenate([want] * p, 0), f"all_gather {d} p={p} dim={dim}")


@pytest.mark.parametrize("p, root", [(1, 0), (3, 2), (8, 0), (8, 5)])
def test_broadcast_copies_the_roots_bits(p, root):
  rng = np.random.default_rng([SEED, p, root])
  hosts = [host_data(rng, (p * 1023,), d) for d in DTYPES]
  mesh = mesh_of(p)

  def body(*bs):
    return tuple(call("broadcast", b, "x", mesh, b.shape, root=root) for b in bs)

  for d, host, got in zip(DTYPES, hosts, run(p, body, hosts, P("x"), mesh)):
    assert_bits(got, np.concatenate([np.split(host, p)[root]] * p), f"broadcast {d} p={p}")


@pytest.mark.parametrize("p, perm", [(8, tuple((i, (i + 1) % 8) for i in range(8))),
                                     (8, ((0, 3), (3, 0), (5, 6))), (3, ((2, 0),)),
                                     (1, ((0, 0),)), (3, ((0, 0), (1, 2)))])
def test_ppermute_equals_lax(p, perm):
  rng = np.random.default_rng([SEED, p, len(perm)])
  hosts = [host_data(rng, (p * 7, 3), d) for d in DTYPES]
  mesh = mesh_of(p)

  def body(*bs):
    return tuple(call("ppermute", b, "x", mesh, b.shape, perm=perm) for b in bs)

  for d, host, got in zip(DTYPES, hosts, run(p, body, hosts, P("x"), mesh)):
    want = np.zeros_like(np.split(host, p))
    for src, dst in perm:
      want[dst] = np.split(host, p)[src]
    assert_bits(got, np.concatenate(want), f"ppermute {d} p={p} {perm}")


def test_a_2d_mesh_and_a_tuple_of_axes():
  """Over "x" of a (2, 4) mesh each row of "a" is its own group; over ("a", "x") all 8 ranks."""
  mesh = jax.make_mesh((2, 4), ("a", "x"))
  rng = np.random.default_rng([SEED, 24])
  host = host_data(rng, (2 * 3, 4 * 8), "float32", special=0)
  spec = P("a", "x")
  x = jax.device_put(host, NamedSharding(mesh, spec))

  def body(b):
    ar = call("all_reduce", b, "x", mesh, b.shape)
    ar_xla = jaxcc.all_reduce(b, "x", algorithm="direct", executor="xla")
    mx = call("all_reduce", b, ("a", "x"), mesh, b.shape, op="max")
    ag = call("all_gather", b, ("a", "x"), mesh, (8 * b.shape[0], b.shape[1]),
              gather_dimension=0, tiled=True)
    rs = call("reduce_scatter", b, "x", mesh, (b.shape[0], b.shape[1] // 4),
              scatter_dimension=1, tiled=True, op="min")
    rs_ref = lax.dynamic_slice_in_dim(lax.pmin(b, "x"), lax.axis_index("x") * 2, 2, 1)
    perm = ((0, 5), (5, 2), (2, 0), (7, 1))
    pp = call("ppermute", b, ("a", "x"), mesh, b.shape, perm=perm)
    return (ar, ar_xla, mx, lax.pmax(b, ("a", "x")), ag, lax.all_gather(b, ("a", "x"), tiled=True),
            rs, rs_ref, pp, lax.ppermute(b, ("a", "x"), perm))

  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False))
  outs = [np.asarray(o) for o in f(x)]
  assert_bits(outs[0], outs[1], "all_reduce over x of a 2-D mesh")
  assert_bits(outs[2], outs[3], "max over (a, x)")
  assert_bits(outs[4], outs[5], "all_gather over (a, x)")
  assert_bits(outs[6], outs[7], "min reduce_scatter over x of a 2-D mesh")
  assert_bits(outs[8], outs[9], "ppermute over (a, x)")


def test_inside_fori_loop_and_scan():
  """A collective inside a loop runs once per iteration: every instance meets its own peers."""
  p = 8
  mesh = mesh_of(p)
  rng = np.random.default_rng([SEED, 99])
  host = host_data(rng, (p * 33,), "float32", special=0)

  def body(b):
    def step(c, _):
      y = call("all_reduce", c, "x", mesh, c.shape)
      z = call("all_gather", c, "x", mesh, (p * c.shape[0],), gather_dimension=0, tiled=True)
      return c + 0.125 * y + z[:c.shape[0]], None

    def step_xla(c, _):
      y = jaxcc.all_reduce(c, "x", algorithm="direct", executor="xla")
      z = lax.all_gather(c, "x", tiled=True)
      return c + 0.125 * y + z[:c.shape[0]], None

    scanned = lax.scan(step, b, None, length=4)[0]
    looped = lax.fori_loop(0, 3, lambda i, c: step(c, None)[0], b)
    return (scanned, lax.scan(step_xla, b, None, length=4)[0], looped,
            lax.fori_loop(0, 3, lambda i, c: step_xla(c, None)[0], b))

  outs = run(p, body, [host], P("x"), mesh)
  assert_bits(outs[0], outs[1], "scan")
  assert_bits(outs[2], outs[3], "fori_loop")


def test_executions_dispatched_back_to_back_all_complete(monkeypatch):
  """Many executions in flight at once, each with independent collectives: every one meets its
  own peers (the program-order token keeps one device's executions from overlapping)."""
  monkeypatch.setenv("JAXCC_TIMEOUT_S", "20")
  p = 8
  mesh = mesh_of(p)
  ring = tuple((i, (i + 1) % p) for i in range(p))
  hosts = [host_data(np.random.default_rng([SEED, 8, i]), (p * (50 + i),), "float32", special=0)
           for i in range(3)]

  def body(a, b, c):
    return (call("all_reduce", a, "x", mesh, a.shape), call("ppermute", b, "x", mesh, b.shape,
                                                             perm=ring),
            call("all_gather", c, "x", mesh, (p * c.shape[0],), gather_dimension=0, tiled=True))

  def reference(a, b, c):
    return (jaxcc.all_reduce(a, "x", algorithm="direct", executor="xla"),
            lax.ppermute(b, "x", ring), lax.all_gather(c, "x", tiled=True))

  xs = [jax.device_put(h, NamedSharding(mesh, P("x"))) for h in hosts]
  f, g = (jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(P("x"),) * 3, out_specs=(P("x"),) * 3,
                                check_vma=False)) for fn in (body, reference))
  want = [np.asarray(w) for w in g(*xs)]
  runs = [f(*xs) for _ in range(50)]
  for outs in runs:
    for got, w in zip(outs, want):
      assert_bits(got, w, "back-to-back executions")


def test_bad_arguments_fail_at_trace_time():
  mesh = mesh_of(4)
  x = jax.device_put(np.ones((8, 6), np.float32), NamedSharding(mesh, P("x")))

  def trace(fn):
    jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                          check_vma=False)).lower(x)

  with pytest.raises(ValueError, match=r"jaxcc.reduce_scatter: dimension 1 of x has size 6"):
    trace(lambda b: call("reduce_scatter", b, "x", mesh, (2, 1), scatter_dimension=1,
                         tiled=True))
  with pytest.raises(ValueError, match=r"jaxcc.all_reduce: op must be one of"):
    trace(lambda b: call("all_reduce", b, "x", mesh, b.shape, op="prod"))
  with pytest.raises(ValueError, match=r"jaxcc.broadcast: root must be a rank in \[0, 4\)"):
    trace(lambda b: call("broadcast", b, "x", mesh, b.shape, root=4))
  with pytest.raises(ValueError, match=r"jaxcc.ppermute: perm must be pairs"):
    trace(lambda b: call("ppermute", b, "x", mesh, b.shape, perm=((0, 1), (2, 1))))
  with pytest.raises(ValueError, match=r"jaxcc.all_gather: gather_dimension=2 is out of range"):
    trace(lambda b: call("all_gather", b, "x", mesh, b.shape, gather_dimension=2, tiled=True))
  with pytest.raises(TypeError, match=r"jaxcc.all_reduce: cannot reduce dtype complex64"):
    trace(lambda b: call("all_reduce", b.astype(jnp.complex64), "x", mesh, b.shape))


def test_timeout_setting(monkeypatch):
  monkeypatch.setenv("JAXCC_TIMEOUT_S", "2.5")
  assert config.timeout_s() == 2.5
  monkeypatch.delenv("JAXCC_TIMEOUT_S")
  assert config.timeout_s() == 300.0
  for bad in ("0", "-1", "soon", "nan", "inf"):
    monkeypatch.setenv("JAXCC_TIMEOUT_S", bad)
    with pytest.raises(ValueError, match="JAXCC_TIMEOUT_S"):
      config.timeout_s()


FAILING_CALL = """
import os, sys, itertools
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
sys.path.insert(0, {tests!r})
import jax, numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P
from jaxcc._src import local_executor
from local_harness import call
mesh = jax.make_mesh((4,), ("x",))
x = jax.device_put(np.ones((4 * 40,), np.float32), NamedSharding(mesh, P("x")))
if sys.argv[1] == "missing":  # 5 ranks expected, 4 devices: rank 4 never arrives
  all_reduce = local_executor.all_reduce
  local_executor.all_reduce = lambda b, a, size, g, **kw: all_reduce(b, a, 5, g, **kw)
  body = lambda b: call("all_reduce", b, "x", mesh, b.shape)
else:  # even ranks call all_reduce, odd ranks all_gather, under one op id
  local_executor._op_ids = itertools.repeat(-7)
  def body(b):
    return lax.cond(lax.axis_index("x") % 2 == 0,
                    lambda: call("all_reduce", b, "x", mesh, b.shape),
                    lambda: call("all_gather", b, "x", mesh, (4 * b.shape[0],),
                                 gather_dimension=0, tiled=True)[:b.shape[0]])
f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False))
np.asarray(f(x))
"""


@pytest.mark.parametrize("case, pattern", [
    ("missing", r"jaxcc.all_reduce \(in-process, op -\d+\): rank \d timed out after 1500 ms "
                r"waiting for rank 4 \(never arrived\)"),
    ("mismatch", r"jaxcc.all_\w+ \(in-process, op -7\): rank \d called \w+ of 4 ranks.* but its "
                 r"peers called \w+ of 4 ranks"),
])
def test_a_failed_call_is_an_error_naming_the_rank(case, pattern):
  env = dict(os.environ, JAXCC_TIMEOUT_S="1.5", JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  script = FAILING_CALL.format(tests=os.path.dirname(os.path.abspath(__file__)))
  proc = subprocess.run([sys.executable, "-c", script, case], env=env, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode != 0
  assert re.search(pattern, proc.stderr), proc.stderr[-3000:]
