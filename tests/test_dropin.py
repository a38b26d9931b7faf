"""jaxcc as a drop-in for lax in gradient code: pytrees, tuple axes, partial-manual meshes, op=.

Every case is compared with its lax twin on fresh random inputs: bit for bit
for integers, copies, max and min; within reassociation for float sums.
"""

import contextlib
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxcc
from jaxcc._src import compat
from jaxcc._src import costs

SEED = np.random.SeedSequence().entropy
COUNTS = (1, 3, 8)


def rng_for(*key):
  return np.random.default_rng([SEED, *key])


def random_array(rng, shape, dtype):
  if jnp.issubdtype(dtype, jnp.floating):
    return (rng.normal(size=shape) * 3).astype(np.float32).astype(dtype)
  return rng.integers(-1000, 1000, size=shape).astype(dtype)


def assert_close(got, want, dtype, exact=False):
  got, want = np.asarray(got), np.asarray(want)
  assert got.shape == want.shape and got.dtype == want.dtype
  if exact or not jnp.issubdtype(dtype, jnp.floating):
    assert got.tobytes() == want.tobytes(), f"seed={SEED}"
  else:
    tol = {np.dtype(jnp.float32): 1e-5, np.dtype(jnp.bfloat16): 2e-2,
           np.dtype(jnp.float16): 2e-3}[np.dtype(dtype)]
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=tol,
                               atol=tol * 8, err_msg=f"seed={SEED}")


def run(fn, mesh, x, in_spec, out_specs, **kw):
  """``fn`` of one argument ``x`` (an array or a pytree) in a jitted shard_map over ``mesh``."""
  shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), in_spec,
                           is_leaf=lambda s: isinstance(s, P))
  x = jax.device_put(x, shardings)
  return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(in_spec,), out_specs=out_specs, **kw))(x)


def tree_of(rng, p):
  """A gradient-like pytree: mixed dtypes and odd shapes, each rank's leading dimension
  divisible by p (so that reduce_scatter takes it)."""
  q = p * p
  return {"w": random_array(rng, (q * 3, 5), jnp.float32),
          "b": random_array(rng, (q * 2,), jnp.float32),
          "emb": {"table": random_array(rng, (q * 4, 3), jnp.bfloat16),
                  "count": random_array(rng, (q,), jnp.int32)},
          "scale": [random_array(rng, (q * 7, 1, 2), jnp.float16)]}


# --- pytrees -----------------------------------------------------------------------------------

@pytest.mark.parametrize("p", COUNTS)
@pytest.mark.parametrize("bucket_bytes", [None, 64])
@pytest.mark.parametrize("executor", ["auto", "native", "xla"])
def test_pytrees_equal_per_leaf_lax(p, bucket_bytes, executor):
  mesh = jax.make_mesh((p,), ("x",), devices=jax.devices()[:p])
  tree = tree_of(rng_for(p, 0), p)
  spec = jax.tree.map(lambda _: P("x"), tree)
  kw = dict(executor=executor, bucket_bytes=bucket_bytes)
  cases = [
      (lambda t: jaxcc.all_reduce(t, "x", **kw), lambda t: lax.psum(t, "x"), P()),
      (lambda t: jaxcc.all_reduce(t, "x", op="mean", **kw), lambda t: lax.pmean(t, "x"), P()),
      (lambda t: jaxcc.reduce_scatter(t, "x", **kw),
       lambda t: lax.psum_scatter(t, "x", tiled=True), P("x")),
      (lambda t: jaxcc.all_gather(t, "x", **kw), lambda t: lax.all_gather(t, "x", tiled=True),
       P()),
  ]
  for ours, theirs, out in cases:
    out_spec = jax.tree.map(lambda _: out, tree)
    vma = dict(check_vma=False) if ours is cases[3][0] else {}  # all_gather's result varies
    got = run(ours, mesh, tree, spec, out_spec, **vma)
    want = run(theirs, mesh, tree, spec, out_spec, **vma)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      assert_close(g, w, w.dtype, exact=ours is cases[3][0])


@pytest.mark.parametrize("executor", ["auto", "native", "xla"])
def test_pytree_gradient_equals_lax(executor):
  p = 4
  mesh = jax.make_mesh((p,), ("x",), devices=jax.devices()[:p])
  rng = rng_for(1)
  params = {"w": random_array(rng, (p * 3, 5), jnp.float32),
            "b": random_array(rng, (p * 2,), jnp.float32)}
  spec = jax.tree.map(lambda _: P("x"), params)

  def grads(sync):  # differentiates through the collective inside the shard_map body
    def f(t):
      return jax.grad(lambda u: sum(jnp.sum(jnp.sin(v) ** 2) for v in jax.tree.leaves(sync(u))))(t)
    return f

  ours = run(grads(lambda g: jaxcc.all_reduce(g, "x", op="mean", executor=executor)), mesh, params,
             spec, spec)
  theirs = run(grads(lambda g: lax.pmean(g, "x")), mesh, params, spec, spec)
  for g, w in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
    assert_close(g, w, jnp.float32)


@pytest.mark.parametrize("executor", ["xla", "native"])
def test_invariant_input_sends_nothing_and_equals_lax(executor):
  """A leaf already the same on every rank (the gradient of a replicated parameter, which jax
  sums itself) reduces locally as psum does: equal to lax, no collective of jaxcc's in the
  program, one warning that says how to let jaxcc sum such gradients."""
  p = 4
  mesh = jax.make_mesh((p,), ("x",), devices=jax.devices()[:p])
  rng = rng_for(2)
  params = {"w": random_array(rng, (3, 5), jnp.float32),
            "n": random_array(rng, (7,), jnp.int32)}
  batch = random_array(rng, (p * 2, 5), jnp.float32)

  def step(sync):
    def body(params, b):
      g = jax.grad(lambda w: jnp.sum(jnp.sin(b @ w.T)))(params["w"])  # invariant: jax summed it
      return sync({"w": g, "b": b, "n": params["n"]})  # one call; only b varies and is sent
    specs = ({"w": P(), "n": P()}, P("x"))
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=specs,
                                 out_specs={"w": P(), "b": P(), "n": P()}))

  args = (params, jax.device_put(batch, NamedSharding(mesh, P("x"))))
  for op, lax_op in [("sum", lax.psum), ("mean", lax.pmean), ("max", lax.pmax)]:
    algorithm = "auto" if op == "max" else "ring"
    ours = step(lambda t, op=op, a=algorithm: jaxcc.all_reduce(t, "x", op=op, executor=executor,
                                                               algorithm=a))
    with pytest.warns(UserWarning, match="pcast") if op != "max" else contextlib.nullcontext():
      got = ours(*args)
    want = step(lambda t, lax_op=lax_op: lax_op(t, "x"))(*args)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      assert_close(g, w, g.dtype)
  with pytest.warns(UserWarning, match="pcast"):
    hlo = jax.jit(jax.shard_map(lambda w: jaxcc.all_reduce(w, "x", executor=executor,
                                                          algorithm="ring"),
                                mesh=mesh, in_specs=P(), out_specs=P())).lower(
        params["w"]).compile().as_text()
  assert "custom-call" not in hlo and "collective-permute" not in hlo and "all-reduce" not in hlo


def test_buckets_group_by_dtype_and_size():
  from jaxcc.collectives._buckets import buckets
  leaves = [jnp.zeros(4, jnp.float32), jnp.zeros(4, jnp.int32), jnp.zeros(4, jnp.float32),
            jnp.zeros(100, jnp.float32), jnp.zeros(1, jnp.float32)]
  assert buckets(leaves, 32) == [[0, 2], [1], [3], [4]]
  assert buckets(leaves, 1 << 20) == [[0, 2, 3, 4], [1]]


# --- op= --------------------------------------------------------------------------------------

@pytest.mark.parametrize("p", COUNTS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16, jnp.int32])
@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
def test_ops_equal_lax(p, dtype, op):
  mesh = jax.make_mesh((p,), ("x",), devices=jax.devices()[:p])
  x = random_array(rng_for(p, 2), (p * p * 2, 5), dtype)
  if jnp.issubdtype(dtype, jnp.floating):
    x[0, :4] = np.array([np.nan, np.inf, -np.inf, -0.0], np.float32).astype(dtype)
    x[-1, :2] = np.array([0.0, -0.0], np.float32).astype(dtype)
  lax_op = {"sum": lax.psum, "mean": lax.pmean, "max": lax.pmax, "min": lax.pmin}[op]
  exact = op in ("max", "min")
  for executor in ("auto", "xla"):
    got = run(lambda b: jaxcc.all_reduce(b, "x", op=op, executor=executor), mesh, x, P("x"), P())
    want = run(lambda b: lax_op(b, "x"), mesh, x, P("x"), P())
    assert_close(got, want, dtype, exact=exact)
    got = run(lambda b: jaxcc.reduce_scatter(b, "x", op=op, executor=executor), mesh, x, P("x"),
              P("x"))
    # Rank r keeps block r of the reduced array: together they are the reduced array itself.
    assert_close(got, want, dtype, exact=exact)


def test_max_is_not_differentiable():
  mesh = jax.make_mesh((2,), ("x",), devices=jax.devices()[:2])
  f = jax.grad(lambda v: run(lambda b: jaxcc.all_reduce(b, "x", op="max"), mesh, v, P("x"),
                             P()).sum())
  with pytest.raises(NotImplementedError, match="op='max' is not differentiable"):
    f(jnp.ones((2, 3)))


# --- tuple axes -------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 4), (4, 2)])
@pytest.mark.parametrize("axes", [("a", "b"), ("b", "a")])
@pytest.mark.parametrize("executor", ["auto", "native", "xla"])
def test_tuple_axes_equal_lax(shape, axes, executor):
  mesh = jax.make_mesh(shape, ("a", "b"))
  p = 8
  rng = rng_for(3, *shape)
  x = random_array(rng, (p * 2, p * 3), jnp.float32)
  xi = random_array(rng, (p * 2, p * 3), jnp.int32)
  spec = P(axes)
  perm = [(i, (i + 3) % p) for i in range(p)]
  algorithm = "ring" if executor != "auto" else "auto"
  cases = [
      (lambda b: jaxcc.all_reduce(b, axes, algorithm=algorithm, executor=executor),
       lambda b: lax.psum(b, axes), P(), False),
      (lambda b: jaxcc.reduce_scatter(b, axes, scatter_dimension=1, algorithm=algorithm,
                                      executor=executor),
       lambda b: lax.psum_scatter(b, axes, scatter_dimension=1, tiled=True), P(axes), False),
      (lambda b: jaxcc.all_gather(b, axes, axis=1, algorithm=algorithm, executor=executor),
       lambda b: lax.all_gather(b, axes, axis=1, tiled=True), P(axes), True),
      (lambda b: jaxcc.broadcast(b, axes, root=5, algorithm=algorithm, executor=executor),
       lambda b: lax.psum(jnp.where(lax.axis_index(axes) == 5, b, 0), axes), P(), True),
  ]
  for ours, theirs, out, exact in cases:
    for data, dtype in ((x, jnp.float32), (xi, jnp.int32)):
      got = run(ours, mesh, data, spec, out)
      want = run(theirs, mesh, data, spec, out)
      assert_close(got, want, dtype, exact=exact)
  # lax.ppermute numbers a tuple's ranks in mesh order; jax 0.12 refuses another order unless
  # jax_raise_on_ppermute_sort_diff is off, and jaxcc does as lax does.
  ours = lambda b: jaxcc.ppermute(b, axes, perm, executor=executor)
  theirs = lambda b: lax.ppermute(b, ("a", "b"), perm)
  with ppermute_sort_check(False):
    assert_close(run(ours, mesh, x, spec, spec), run(theirs, mesh, x, spec, spec), jnp.float32,
                 exact=True)
  if axes != ("a", "b") and compat.ppermute_needs_mesh_order():
    with pytest.raises(RuntimeError, match="not in the mesh's axis order"):
      run(ours, mesh, x, spec, spec)


@contextlib.contextmanager
def ppermute_sort_check(on: bool):
  """jax 0.12's jax_raise_on_ppermute_sort_diff set to ``on`` (nothing on jax 0.10)."""
  if not hasattr(jax.config, "jax_raise_on_ppermute_sort_diff"):
    yield
    return
  before = jax.config.jax_raise_on_ppermute_sort_diff
  jax.config.update("jax_raise_on_ppermute_sort_diff", on)
  try:
    yield
  finally:
    jax.config.update("jax_raise_on_ppermute_sort_diff", before)


def test_tuple_axes_gradient_equals_lax():
  mesh = jax.make_mesh((2, 4), ("a", "b"))
  x = random_array(rng_for(4), (8, 6), jnp.float32)

  def grads(sync):
    return lambda b: jax.grad(lambda u: jnp.sum(jnp.sin(sync(u * u))))(b)

  spec = P(("a", "b"))
  got = run(grads(lambda b: jaxcc.all_reduce(b, ("a", "b"))), mesh, x, spec, spec)
  want = run(grads(lambda b: lax.psum(b, ("a", "b"))), mesh, x, spec, spec)
  # The gradient is 2u times the psum of p cosines of s = psum(u^2): each cosine moves by the
  # reassociation error of s, at most p * eps * s.
  p, eps = 8, float(np.finfo(np.float32).eps)
  s = (x * x).sum(0)
  bound = 2 * np.abs(x) * p * (p * eps * s) + 1e-5 * np.abs(np.asarray(want))
  assert np.all(np.abs(np.asarray(got) - np.asarray(want)) <= bound), f"seed={SEED}"


# --- partial-manual meshes --------------------------------------------------------------------

@pytest.mark.parametrize("executor", ["auto", "xla"])
def test_partial_manual_mesh_equals_lax(executor):
  mesh = jax.make_mesh((2, 4), ("a", "b"))
  x = jax.device_put(random_array(rng_for(5), (16, 6), jnp.float32),
                     NamedSharding(mesh, P("b")))
  kw = dict(mesh=mesh, axis_names={"b"})
  perm = [(i, (i + 1) % 4) for i in range(4)]
  cases = [
      (lambda b: jaxcc.all_reduce(b, "b", executor=executor), lambda b: lax.psum(b, "b"), P()),
      (lambda b: jaxcc.all_reduce(b, "b", op="max", executor=executor),
       lambda b: lax.pmax(b, "b"), P()),
      # jax 0.12's lax.psum_scatter fails to trace in a partial-manual shard_map; its twin is
      # the psum's block of this rank.
      (lambda b: jaxcc.reduce_scatter(b, "b", executor=executor),
       lambda b: lax.dynamic_slice_in_dim(lax.psum(b, "b"), lax.axis_index("b") * 1, 1), P("b")),
      (lambda b: jaxcc.all_gather(b, "b", executor=executor),
       lambda b: lax.all_gather(b, "b", tiled=True), P("b")),
      (lambda b: jaxcc.broadcast(b, "b", root=2, executor=executor),
       lambda b: lax.psum(jnp.where(lax.axis_index("b") == 2, b, 0), "b"), P()),
      (lambda b: jaxcc.ppermute(b, "b", perm, executor=executor),
       lambda b: lax.ppermute(b, "b", perm), P("b")),
  ]
  for ours, theirs, out in cases:
    got = jax.jit(jax.shard_map(ours, in_specs=P("b"), out_specs=out, **kw))(x)
    want = jax.jit(jax.shard_map(theirs, in_specs=P("b"), out_specs=out, **kw))(x)
    assert_close(got, want, jnp.float32)


def test_partial_manual_mesh_does_not_abort():
  """The case that took the process down inside XLA (a token in a partial-manual region)."""
  code = textwrap.dedent("""
      import os
      os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
      import jax, jax.numpy as jnp
      from jax.sharding import PartitionSpec as P
      import jaxcc
      from jax.sharding import NamedSharding
      mesh = jax.make_mesh((2, 4), ("a", "b"))
      ones = jax.device_put(jnp.ones((8, 3)), NamedSharding(mesh, P("b")))
      for ex in ("auto", "xla"):
        f = jax.jit(jax.shard_map(lambda b: jaxcc.all_reduce(b, "b", executor=ex), mesh=mesh,
                                  in_specs=P("b"), out_specs=P(), axis_names={"b"}))
        print(ex, float(f(ones).sum()))
      try:
        jax.jit(jax.shard_map(lambda b: jaxcc.all_reduce(b, "b", executor="native"), mesh=mesh,
                              in_specs=P("b"), out_specs=P(), axis_names={"b"}))(ones)
      except NotImplementedError as e:
        print("native:", str(e).splitlines()[0])
      """)
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                        env={"JAX_PLATFORMS": "cpu", "PATH": ""})
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "auto 24.0" in proc.stdout and "xla 24.0" in proc.stdout
  assert "native: jaxcc.all_reduce: executor='native' runs in a shard_map whose axes" in proc.stdout


# --- trace-time errors ------------------------------------------------------------------------

@pytest.mark.parametrize("fn, error, match", [
    (lambda b: jaxcc.all_reduce(b, "x", op="prod"), ValueError, r"jaxcc.all_reduce: op must be"),
    (lambda b: jaxcc.reduce_scatter(b, "x", op="avg"), ValueError,
     r"jaxcc.reduce_scatter: op must be"),
    (lambda b: jaxcc.all_reduce(b, "x", bucket_bytes=0), ValueError,
     "bucket_bytes must be a positive int"),
    (lambda b: jaxcc.all_reduce(b, ("x", "x")), TypeError, "tuple of distinct ones"),
    (lambda b: jaxcc.all_gather(b, ("x", "y")), NameError,
     "unbound axis name: y. To fix this, please call all_"),
    (lambda b: jaxcc.all_reduce({"a": b, "s": "str"}, "x"), TypeError,
     "jaxcc.all_reduce: every leaf of x must be an array, got str"),
    (lambda b: jaxcc.broadcast([b, "s"], "x"), TypeError, "jaxcc.broadcast: every leaf"),
])
def test_bad_input_fails_at_trace_time(fn, error, match):
  mesh = jax.make_mesh((4,), ("x",), devices=jax.devices()[:4])
  with pytest.raises(error, match=match):
    run(fn, mesh, jnp.ones((8, 4)), P("x"), P())


# --- never slower: where auto leaves a call to XLA, the program is lax's ----------------------

def _entry(compiled_text):
  """The compiled entry computation without metadata (names of source lines)."""
  entry = compiled_text[compiled_text.index("ENTRY"):]
  return re.sub(r",? metadata=\{[^}]*\}", "", entry)


@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter", "all_gather", "ppermute"])
def test_auto_in_process_compiles_to_lax_program_where_xla_is_faster(collective):
  """In one process auto picks XLA's own collective where the cost model says XLA is faster
  (the same compiled program as lax's) and the in-process path elsewhere."""
  p = 8
  mesh = jax.make_mesh((p,), ("x",), devices=jax.devices()[:p])
  perm = [(i, (i + 1) % p) for i in range(p)]
  ours, theirs = {
      "all_reduce": (lambda b: jaxcc.all_reduce(b, "x"), lambda b: lax.psum(b, "x")),
      "reduce_scatter": (lambda b: jaxcc.reduce_scatter(b, "x"),
                         lambda b: lax.psum_scatter(b, "x", tiled=True)),
      "all_gather": (lambda b: jaxcc.all_gather(b, "x"), lambda b: lax.all_gather(b, "x",
                                                                                 tiled=True)),
      "ppermute": (lambda b: jaxcc.ppermute(b, "x", perm), lambda b: lax.ppermute(b, "x", perm)),
  }[collective]
  for n in (1024, 1 << 18, 1 << 23):  # elements per rank: 4 KiB to 32 MiB
    x = jax.ShapeDtypeStruct((p * n,), jnp.float32, sharding=NamedSharding(mesh, P("x")))
    texts = [_entry(jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                                          check_vma=False)).lower(x).compile().as_text())
             for f in (ours, theirs)]
    nbytes = 4 * n * (p if collective == "all_gather" else 1)
    if costs.local_beats_xla(collective, nbytes):
      assert "custom_call_target=\"jaxcc_" in texts[0], (collective, nbytes)
    else:
      assert texts[0] == texts[1], (collective, nbytes)
