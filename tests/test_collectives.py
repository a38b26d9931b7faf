"""Every collective x algorithm x dtype x device count against its lax twin, forward and gradient.

Floats are compared within the rounding a sum of p terms may differ by
(reassociation); integers and copies bit for bit. Inputs are fresh random
numbers on every run, in odd shapes.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxcc
from jaxcc import Topology

DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16, jnp.int32)
FLOATS = (jnp.float32, jnp.bfloat16, jnp.float16)
COUNTS = (1, 2, 3, 4, 8)
ALGORITHMS = {
    "all_reduce": ("lax", "auto", "ring", "direct", "optcc", "r2ccl"),
    "reduce_scatter": ("lax", "auto", "ring", "direct"),
    "all_gather": ("lax", "auto", "ring", "direct"),
    "broadcast": ("lax", "auto", "ring", "direct"),
}
# ppermute has no algorithms: its cases name the executor instead ("auto" is native on the CPU).
PPERMUTE_EXECUTORS = ("native", "xla", "auto")
SEED = np.random.SeedSequence().entropy  # fresh inputs every run; printed on failure


def mesh_of(p):
  return jax.make_mesh((p,), ("x",), devices=jax.devices()[:p])


def topology_of(p):
  topo = Topology.uniform(p, 12.5e9, latency=5e-6)
  return topo.with_straggler(p - 1, 0.5) if p > 1 else topo


def per_rank_shape(collective, p):
  return {"all_reduce": (7, 13), "reduce_scatter": (3, 5 * p), "all_gather": (3, 5),
          "broadcast": (11,), "ppermute": (2, 9)}[collective]


def make_inputs(collective, p, rng):
  """One global array per dtype, sharded along its first dimension."""
  shape = per_rank_shape(collective, p)
  out = []
  for dt in DTYPES:
    glob = (p * shape[0],) + shape[1:]
    if jnp.issubdtype(dt, jnp.floating):
      host = rng.normal(size=glob).astype(np.float32) * 3
    else:
      host = rng.integers(-(1 << 20), 1 << 20, size=glob)
    out.append(np.asarray(host).astype(dt))
  return out


def ours(collective, p, algorithm):
  topo = topology_of(p)
  return {
      "all_reduce": lambda b: jaxcc.all_reduce(b, "x", algorithm=algorithm, topology=topo),
      "reduce_scatter": lambda b: jaxcc.reduce_scatter(
          b, "x", scatter_dimension=1, algorithm=algorithm, topology=topo),
      "all_gather": lambda b: jaxcc.all_gather(b, "x", axis=1, algorithm=algorithm,
                                               topology=topo),
      "broadcast": lambda b: jaxcc.broadcast(b, "x", root=p // 2, algorithm=algorithm,
                                             topology=topo),
      "ppermute": lambda b: jaxcc.ppermute(b, "x", ring_perm(p), executor=algorithm),
  }[collective]


def theirs(collective, p):
  return {
      "all_reduce": lambda b: lax.psum(b, "x"),
      "reduce_scatter": lambda b: lax.psum_scatter(b, "x", scatter_dimension=1, tiled=True),
      "all_gather": lambda b: lax.all_gather(b, "x", axis=1, tiled=True),
      "broadcast": lambda b: lax.psum(jnp.where(lax.axis_index("x") == p // 2, b,
                                                jnp.zeros_like(b)), "x"),
      "ppermute": lambda b: lax.ppermute(b, "x", ring_perm(p)),
  }[collective]


def ring_perm(p):
  """A shift by one that leaves rank 0 without a sender when p > 2."""
  return [(i, (i + 1) % p) for i in range(p - 1)] if p > 2 else [(i, (i + 1) % p) for i in range(p)]


def out_spec(collective):
  return P() if collective in ("all_reduce", "broadcast") else P("x")


@functools.lru_cache(maxsize=None)
def forward(collective, p, fn_key, make):
  mesh = mesh_of(p)
  fn = make()
  spec = out_spec(collective)
  return jax.jit(jax.shard_map(lambda *xs: tuple(fn(x) for x in xs), mesh=mesh,
                               in_specs=(P("x"),) * len(DTYPES),
                               out_specs=(spec,) * len(DTYPES)))


def shard(arrays, p):
  sharding = NamedSharding(mesh_of(p), P("x"))
  return [jax.device_put(a, sharding) for a in arrays]


def tolerance(collective, x_host, p, dtype):
  """Elementwise bound on reassociation error: a few roundings of the sum of magnitudes."""
  if not jnp.issubdtype(dtype, jnp.floating) or collective in ("all_gather", "broadcast",
                                                                "ppermute"):
    return 0.0
  eps = float(jnp.finfo(dtype).eps)
  mags = np.abs(x_host.astype(np.float32)).reshape((p, -1) + x_host.shape[1:]).sum(0)
  return 2 * p * eps * mags


def check_close(collective, got, want, x_host, p, dtype):
  got = np.asarray(got).astype(np.float64)
  want = np.asarray(want).astype(np.float64)
  tol = tolerance(collective, x_host, p, dtype)
  if np.isscalar(tol):
    np.testing.assert_array_equal(got, want)
    return
  if collective == "reduce_scatter":  # (rows, 5p) summed -> every rank keeps 5 columns
    tol = np.concatenate(np.split(tol, p, axis=1), axis=0)
  np.testing.assert_array_less(np.abs(got - want), tol + 1e-30)


CASES = [(c, a, p) for c, algs in ALGORITHMS.items() for a in algs for p in COUNTS]
CASES += [("ppermute", e, p) for e in PPERMUTE_EXECUTORS for p in COUNTS]


@pytest.mark.parametrize("collective, algorithm, p", CASES)
def test_forward_matches_lax(collective, algorithm, p):
  rng = np.random.default_rng([SEED, p, len(collective), len(algorithm)])
  hosts = make_inputs(collective, p, rng)
  xs = shard(hosts, p)
  mine = forward(collective, p, ("ours", algorithm), lambda: ours(collective, p, algorithm))(*xs)
  ref = forward(collective, p, ("lax",), lambda: theirs(collective, p))(*xs)
  for dt, host, got, want in zip(DTYPES, hosts, mine, ref):
    assert got.dtype == want.dtype and got.shape == want.shape, (dt, got.shape, want.shape)
    try:
      check_close(collective, got, want, host, p, dt)
    except AssertionError as e:
      raise AssertionError(f"seed={SEED} dtype={jnp.dtype(dt).name}: {e}") from None
  again = forward(collective, p, ("ours", algorithm), lambda: ours(collective, p, algorithm))(*xs)
  for got, got2 in zip(mine, again):  # a fixed reduction order: identical from run to run
    np.testing.assert_array_equal(np.asarray(got), np.asarray(got2))


@functools.lru_cache(maxsize=None)
def gradient(collective, p, fn_key, make):
  fn = make()

  def loss(*xs):
    total = 0.0
    for i, x in enumerate(xs):
      y = fn(x * x).astype(jnp.float32)
      total = total + jnp.sum(jnp.sin(y) * (i + 1))
    return total

  n = len(FLOATS)
  return jax.jit(jax.shard_map(jax.grad(loss, argnums=tuple(range(n))), mesh=mesh_of(p),
                               in_specs=(P("x"),) * n, out_specs=(P("x"),) * n))


GRAD_CASES = [(c, a, p) for c, algs in ALGORITHMS.items() for a in algs if a != "auto"
              for p in COUNTS]
GRAD_CASES += [("ppermute", e, p) for e in PPERMUTE_EXECUTORS for p in COUNTS]


@pytest.mark.parametrize("collective, algorithm, p", GRAD_CASES)
def test_gradient_matches_lax(collective, algorithm, p):
  rng = np.random.default_rng([SEED, 7, p, len(collective), len(algorithm)])
  hosts = [h for h, dt in zip(make_inputs(collective, p, rng), DTYPES) if dt in FLOATS]
  hosts = [(h / 3).astype(h.dtype) for h in hosts]
  xs = shard(hosts, p)
  mine = gradient(collective, p, ("ours", algorithm), lambda: ours(collective, p, algorithm))(*xs)
  ref = gradient(collective, p, ("lax",), lambda: theirs(collective, p))(*xs)
  for dt, host, got, want in zip(FLOATS, hosts, mine, ref):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    # d/dx sin(sum x^2) differs by 2|x| times the reassociation error of the sum.
    mag = np.abs(host.astype(np.float32))
    scale = 2 * mag.max() * (mag ** 2).reshape((p, -1)).sum(0).max() + 1.0
    eps = float(jnp.finfo(dt).eps)
    np.testing.assert_allclose(got, want, rtol=4 * p * eps, atol=4 * p * eps * scale,
                               err_msg=f"seed={SEED} dtype={jnp.dtype(dt).name}")


def test_several_collectives_in_scan_on_a_2d_mesh():
  mesh = jax.make_mesh((2, 4), ("a", "x"))
  topo = topology_of(4)
  host = np.random.default_rng(SEED).normal(size=(6, 16)).astype(np.float32)
  x = jax.device_put(host, NamedSharding(mesh, P("a", "x")))

  def body(ar, rs, ag, pp):
    def step(c, _):
      y = ar(c) * 0.25 + rs(ag(c)) + pp(c)
      return y, jnp.sum(y)
    return step

  def run(*fns):
    f = jax.shard_map(lambda b: lax.scan(body(*fns), b, None, length=3), mesh=mesh,
                      in_specs=P("a", "x"), out_specs=(P("a", "x"), P(("a", "x"))))
    return jax.jit(f)(x)

  mine = run(lambda c: jaxcc.all_reduce(c, "x", algorithm="optcc", topology=topo),
             lambda c: jaxcc.reduce_scatter(c, "x", scatter_dimension=1, algorithm="ring"),
             lambda c: jaxcc.all_gather(c, "x", axis=1, algorithm="direct"),
             lambda c: jaxcc.ppermute(c, "x", ring_perm(4), executor="native"))
  ref = run(lambda c: lax.psum(c, "x"),
            lambda c: lax.psum_scatter(c, "x", scatter_dimension=1, tiled=True),
            lambda c: lax.all_gather(c, "x", axis=1, tiled=True),
            lambda c: lax.ppermute(c, "x", ring_perm(4)))
  for got, want in zip(mine, ref):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("collective, algorithm", [
    ("all_reduce", "ring"), ("reduce_scatter", "ring"), ("all_gather", "ring"),
    ("ppermute", "native")])
def test_vmap_over_another_axis(collective, algorithm):
  p = 4
  mesh = mesh_of(p)
  host = np.random.default_rng(SEED).normal(size=(p * 3, 8, 4)).astype(np.float32)
  x = jax.device_put(host, NamedSharding(mesh, P("x")))
  mine, ref = ours(collective, p, algorithm), theirs(collective, p)
  spec = out_spec(collective)
  outs = [jax.jit(jax.shard_map(jax.vmap(fn, in_axes=2, out_axes=0), mesh=mesh, in_specs=P("x"),
                                out_specs=spec))(x) for fn in (mine, ref)]
  np.testing.assert_allclose(np.asarray(outs[0]), np.asarray(outs[1]), rtol=1e-5, atol=1e-5)


def perms_of(p):
  """A cycle; a partial shift (half the ranks receive nothing); a reversal (the middle rank of
  an odd axis is its own destination); the empty perm (every rank gets zeros)."""
  return {"cycle": [(i, (i + 1) % p) for i in range(p)],
          "partial": [(i, (i + 2) % p) for i in range(p // 2)],
          "reversal": [(i, p - 1 - i) for i in range(p)], "empty": []}


@pytest.mark.parametrize("p", [1, 3, 8])
@pytest.mark.parametrize("kind", ["cycle", "partial", "reversal", "empty"])
def test_native_ppermute_equals_lax_bit_for_bit(p, kind):
  perm = perms_of(p)[kind]
  hosts = make_inputs("ppermute", p, np.random.default_rng([SEED, 5, p, len(kind)]))
  xs = shard(hosts, p)
  mine = forward("ppermute", p, ("native", kind),
                 lambda: lambda b: jaxcc.ppermute(b, "x", perm, executor="native"))
  ref = forward("ppermute", p, ("lax", kind), lambda: lambda b: lax.ppermute(b, "x", perm))
  # One native call per dtype: the in-process path (jaxcc_local_collective).
  calls = mine.lower(*xs).as_text().count("@jaxcc_local_collective(")
  assert calls == len(DTYPES)
  for dt, got, want in zip(DTYPES, mine(*xs), ref(*xs)):
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.asarray(got).tobytes() == np.asarray(want).tobytes(), (
        f"seed={SEED} {kind} {jnp.dtype(dt).name}")


def test_native_ppermute_of_scalars_and_empty_arrays():
  p = 3
  x = shard([np.arange(p * 4, dtype=np.int32).reshape(p, 4)], p)[0]

  def run(move):
    f = jax.shard_map(lambda b: (move(b[0, 1])[None], move(b[:, :0])), mesh=mesh_of(p),
                      in_specs=P("x"), out_specs=(P("x"), P("x")))
    return jax.jit(f)(x)

  mine = run(lambda b: jaxcc.ppermute(b, "x", ring_perm(p), executor="native"))
  ref = run(lambda b: lax.ppermute(b, "x", ring_perm(p)))
  for got, want in zip(mine, ref):
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("p", [3, 8])
def test_copies_keep_every_bit_of_special_values(dtype, p):
  """NaN payloads, signalling NaNs, subnormals and -0.0 come out of all_gather (every axis and
  form), broadcast and ppermute unchanged, also where the result is transposed: XLA:CPU moves
  bf16 and f16 through f32 (quieting NaNs, flushing subnormals), so floats cross the native call
  as bits. ``lax.all_gather`` itself does not keep them on an inner axis."""
  from bitwise import float_data  # noqa: PLC0415
  host = float_data("special", p * 4 * 6, dtype, np.random.default_rng([SEED, p])).reshape(
      p * 4, 6)
  blocks = np.split(host, p)
  x = jax.device_put(host, NamedSharding(mesh_of(p), P("x")))
  cases = [(f"all_gather axis={a} tiled={t}",
            lambda b, a=a, t=t: jaxcc.all_gather(b, "x", axis=a, tiled=t, algorithm="ring"),
            (np.concatenate if t else np.stack)(blocks, axis=a))
           for a in (0, 1) for t in (True, False)]
  cases += [("broadcast", lambda b: jaxcc.broadcast(b.T, "x", root=1), blocks[1].T),
            ("ppermute", lambda b: jaxcc.ppermute(b.T, "x", perms_of(p)["cycle"]),
             blocks[-1].T)]
  for name, fn, want in cases:
    got = jax.jit(jax.shard_map(fn, mesh=mesh_of(p), in_specs=P("x"), out_specs=P(),
                                check_vma=False))(x)
    assert np.asarray(got).tobytes() == want.tobytes(), f"seed={SEED} {name}"


def test_untiled_forms_match_lax():
  p = 4
  mesh = mesh_of(p)
  host = np.random.default_rng(SEED).normal(size=(p * p, 3)).astype(np.float32)
  x = jax.device_put(host, NamedSharding(mesh, P("x")))
  pairs = [
      (lambda b: jaxcc.reduce_scatter(b, "x", tiled=False, algorithm="direct"),
       lambda b: lax.psum_scatter(b, "x", tiled=False)),
      (lambda b: jaxcc.all_gather(b, "x", axis=1, tiled=False, algorithm="ring"),
       lambda b: lax.all_gather(b, "x", axis=1, tiled=False)),
  ]
  for mine, ref in pairs:
    outs = [jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("x"), out_specs=P("x")))(x)
            for fn in (mine, ref)]
    assert outs[0].shape == outs[1].shape
    np.testing.assert_allclose(np.asarray(outs[0]), np.asarray(outs[1]), rtol=1e-5, atol=1e-5)


def test_bool_sums_as_int32_like_psum():
  p = 4
  mesh = mesh_of(p)
  x = jax.device_put(np.arange(p * 3) % 3 == 0, NamedSharding(mesh, P("x")))
  f = jax.jit(jax.shard_map(lambda b: jaxcc.all_reduce(b, "x", algorithm="ring"), mesh=mesh,
                            in_specs=P("x"), out_specs=P()))
  g = jax.jit(jax.shard_map(lambda b: lax.psum(b, "x"), mesh=mesh, in_specs=P("x"),
                            out_specs=P()))
  assert f(x).dtype == g(x).dtype
  np.testing.assert_array_equal(f(x), g(x))


def trace_in_shard_map(fn, p=4, shape=(8, 4), dtype=np.float32):
  mesh = mesh_of(p)
  x = jax.device_put(np.zeros((p * shape[0],) + shape[1:], dtype), NamedSharding(mesh, P("x")))
  return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                               check_vma=False)).lower(x)


@pytest.mark.parametrize("fn, error, match", [
    (lambda b: jaxcc.all_reduce(b, "y"), NameError,
     "unbound axis name: y. To fix this, please call all_"),
    (lambda b: jaxcc.all_reduce(b, "x", topology=Topology.uniform(3, 1.0)), ValueError,
     "topology has 3 ranks but axis 'x' has 4"),
    (lambda b: jaxcc.all_reduce(b, "x", algorithm="tree"), ValueError,
     "^jaxcc.all_reduce: unsupported algorithm 'tree' for all_reduce"),
    (lambda b: jaxcc.reduce_scatter(b, "x", algorithm="optcc"), ValueError,
     r"^jaxcc.reduce_scatter: .* \('optcc' is for all_reduce only\)"),
    (lambda b: jaxcc.all_gather(b, "x", algorithm="r2ccl"), ValueError,
     "^jaxcc.all_gather: unsupported algorithm 'r2ccl'"),
    (lambda b: jaxcc.all_reduce(b, "x", executor="gpu"), ValueError, "executor must be one of"),
    (lambda b: jaxcc.all_reduce(b, "x", topology="fast"), TypeError,
     "topology must be a jaxcc.Topology"),
    (lambda b: jaxcc.all_reduce(b.astype(jnp.complex64), "x"), TypeError,
     "cannot reduce dtype complex64"),
    (lambda b: jaxcc.reduce_scatter(b[:, :3], "x", scatter_dimension=1), ValueError,
     "dimension 1 of x has size 3, which must be divisible by 4"),
    (lambda b: jaxcc.reduce_scatter(b, "x", tiled=False), ValueError,
     "size 8, which must be equal to 4"),
    (lambda b: jaxcc.reduce_scatter(b[:6], "x"), ValueError, "size 6, which must be divisible"),
    (lambda b: jaxcc.reduce_scatter(b, "x", scatter_dimension=2), ValueError,
     "scatter_dimension=2 is out of range"),
    (lambda b: jaxcc.all_gather(b, "x", axis=-3), ValueError, "axis=-3 is out of range"),
    (lambda b: jaxcc.ppermute(b, "x", [(0, 1), (1, 1)]), ValueError,
     "^jaxcc.ppermute: perm .* names a rank twice"),
    (lambda b: jaxcc.ppermute(b, "x", [(0, 4)]), ValueError,
     "^jaxcc.ppermute: rank 4 in perm is outside"),
    (lambda b: jaxcc.broadcast(b, "x", root=4), ValueError, r"root must be a rank in \[0, 4\)"),
])
def test_bad_input_fails_at_trace_time(fn, error, match):
  with pytest.raises(error, match=match):
    trace_in_shard_map(fn)


def test_outside_shard_map_is_a_clear_error():
  with pytest.raises(NameError, match="please call all_reduce under `jax.shard_map`"):
    jaxcc.all_reduce(jnp.ones(3), "x")
