"""Every lax form jaxcc's collectives replace: lax's names (psum, pmean, pmax, pmin,
psum_scatter, pbroadcast), ``axis_index_groups``, ``all_gather(to=...)``, reduced and unreduced inputs, and
the output's type.

Each case runs the lax call and the jaxcc call in the same jitted shard_map on fresh random
integer-valued floats (so sums are exact): results equal bit for bit, ``jax.typeof`` of the
results equal, or both calls fail with the same exception type.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxcc

SEED = np.random.SeedSequence().entropy
GROUPS = ((0, 1, 2, 3), (4, 5, 6, 7))
RING = tuple((i, (i + 1) % 8) for i in range(8))


def random_input(key, shape=(8 * 4, 6)):
  rng = np.random.default_rng([SEED, *key.encode()])
  return rng.integers(-50, 50, size=shape).astype(np.float32)


def compare(lax_fn, jaxcc_fn, x, mesh, in_spec, out_spec, check_vma=True):
  """Run both functions of one block in a shard_map; the results and their types inside the
  body, or the exceptions they raised."""
  outcomes = []
  for fn in (lax_fn, jaxcc_fn):
    types = []

    def body(b, fn=fn, types=types):
      y = fn(b)
      types.append(jax.tree.map(jax.typeof, y))
      return y

    try:
      y = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=in_spec, out_specs=out_spec,
                                check_vma=check_vma))(
          jax.device_put(x, NamedSharding(mesh, in_spec)))
      outcomes.append((jax.tree.map(np.asarray, y), types))
    except Exception as e:  # lax's own error: jaxcc must fail alike
      outcomes.append((type(e), str(e)))
  (want, want_types), (got, got_types) = outcomes
  if isinstance(want, type):
    assert got is want, f"lax raised {want.__name__} ({want_types[:200]}); jaxcc: {got}"
    return
  assert not isinstance(got, type), f"lax ran; jaxcc raised {got.__name__}: {got_types}"
  assert got_types == want_types
  jax.tree.map(lambda g, w: np.testing.assert_array_equal(g, w, err_msg=f"seed={SEED}"),
               got, want)


def mesh_1d():
  return jax.make_mesh((8,), ("x",))


# (lax's call, jaxcc's call) of a block, each over "x" with a (4k, 6) f32 block.
FORMS = {
    "psum": (lambda b: lax.psum(b, "x"), lambda b: jaxcc.psum(b, "x")),
    "pmean": (lambda b: lax.pmean(b, "x"), lambda b: jaxcc.pmean(b, "x")),
    "pmax": (lambda b: lax.pmax(b, "x"), lambda b: jaxcc.pmax(b, "x")),
    "pmin": (lambda b: lax.pmin(b, "x"), lambda b: jaxcc.pmin(b, "x")),
    "psum_groups": (lambda b: lax.psum(b, "x", axis_index_groups=GROUPS),
                    lambda b: jaxcc.psum(b, "x", axis_index_groups=GROUPS)),
    "pmean_groups": (lambda b: lax.pmean(b, "x", axis_index_groups=GROUPS),
                     lambda b: jaxcc.pmean(b, "x", axis_index_groups=GROUPS)),
    "pmax_groups": (lambda b: lax.pmax(b, "x", axis_index_groups=GROUPS),
                    lambda b: jaxcc.pmax(b, "x", axis_index_groups=GROUPS)),
    "all_gather": (lambda b: lax.all_gather(b, "x"),
                   lambda b: jaxcc.all_gather(b, "x", tiled=False)),
    "all_gather_tiled_axis1": (lambda b: lax.all_gather(b, "x", axis=1, tiled=True),
                               lambda b: jaxcc.all_gather(b, "x", axis=1)),
    "all_gather_groups": (
        lambda b: lax.all_gather(b, "x", axis_index_groups=GROUPS, axis=-1, tiled=True),
        lambda b: jaxcc.all_gather(b, "x", axis_index_groups=GROUPS, axis=-1, tiled=True)),
    "all_gather_invarying": (lambda b: lax.all_gather(b, "x", to="invarying"),
                             lambda b: jaxcc.all_gather(b, "x", tiled=False, to="invarying")),
    "psum_scatter": (lambda b: lax.psum_scatter(b, "x", tiled=True),
                     lambda b: jaxcc.psum_scatter(b, "x", tiled=True)),
    "psum_scatter_untiled": (lambda b: lax.psum_scatter(b[:8], "x"),
                             lambda b: jaxcc.psum_scatter(b[:8], "x")),
    "psum_scatter_groups": (
        lambda b: lax.psum_scatter(b, "x", axis_index_groups=GROUPS, tiled=True),
        lambda b: jaxcc.psum_scatter(b, "x", axis_index_groups=GROUPS, tiled=True)),
    "ppermute": (lambda b: lax.ppermute(b, "x", RING), lambda b: jaxcc.ppermute(b, "x", RING)),
    # XLA:CPU cannot lower lax.pbroadcast: its twin is a masked psum, typed varying as lax's.
    "pbroadcast": (lambda b: lax.pcast(lax.psum(jnp.where(lax.axis_index("x") == 3, b, 0), "x"),
                                       "x", to="varying"),
                   lambda b: jaxcc.pbroadcast(b, "x", 3)),
    # An input the same on every rank: XLA sends nothing for psum, jaxcc neither.
    "psum_invariant": (lambda b: lax.psum(jnp.arange(6.0), "x"),
                       lambda b: jaxcc.psum(jnp.arange(6.0), "x")),
    "all_gather_invariant": (lambda b: lax.all_gather(jnp.arange(6.0), "x"),
                             lambda b: jaxcc.all_gather(jnp.arange(6.0), "x", tiled=False)),
    "ppermute_invariant": (lambda b: lax.ppermute(jnp.arange(6.0), "x", RING),
                           lambda b: jaxcc.ppermute(jnp.arange(6.0), "x", RING)),
    # An unreduced value (a partial sum on each rank): its psum is XLA's unreduced psum.
    "psum_unreduced": (lambda b: lax.psum(lax.pcast(b, "x", to="unreduced"), "x"),
                       lambda b: jaxcc.psum(lax.pcast(b, "x", to="unreduced"), "x")),
    "psum_scatter_unreduced": (
        lambda b: lax.psum_scatter(lax.pcast(b, "x", to="unreduced"), "x", tiled=True),
        lambda b: jaxcc.psum_scatter(lax.pcast(b, "x", to="unreduced"), "x", tiled=True)),
}


def out_spec_of(name):
  """Results invariant along "x" come out whole (P()), varying ones per rank (P("x"))."""
  invariant = (name in ("psum", "pmean", "pmax", "pmin", "psum_invariant", "psum_unreduced",
                        "all_gather_invarying"))
  return P() if invariant else P("x")


@pytest.mark.filterwarnings("ignore:jaxcc.all_reduce. a float input is already the same")
@pytest.mark.parametrize("check_vma", (True, False))
@pytest.mark.parametrize("name", sorted(FORMS))
def test_form_equals_lax(name, check_vma):
  lax_fn, jaxcc_fn = FORMS[name]
  spec = P() if not check_vma and out_spec_of(name) == P() else out_spec_of(name)
  compare(lax_fn, jaxcc_fn, random_input(name), mesh_1d(), P("x"), spec, check_vma)


@pytest.mark.parametrize("executor", ("native", "xla"))
def test_aliases_take_jaxcc_options(executor):
  """The lax names pass jaxcc's options through: an explicit engine runs, and equals lax."""
  for lax_fn, jaxcc_fn in (
      (lax.psum, jaxcc.psum), (lax.pmean, jaxcc.pmean), (lax.pmax, jaxcc.pmax),
      (lax.pmin, jaxcc.pmin),
      (lambda b, a: lax.psum_scatter(b, a, tiled=True),
       lambda b, a, **kw: jaxcc.psum_scatter(b, a, tiled=True, **kw))):
    compare(lambda b: lax_fn(b, "x"),
            lambda b: jaxcc_fn(b, "x", executor=executor),
            random_input("alias" + executor), mesh_1d(), P("x"), P("x"), check_vma=False)


@pytest.mark.parametrize("axes", (("a", "b"), ("b", "a")))
def test_tuple_axes_types_equal_lax(axes):
  """Over a tuple of axes (in mesh order or not): the same values and types as lax."""
  mesh = jax.make_mesh((2, 4), ("a", "b"))
  size = 8
  perm = tuple((i, (i + 3) % size) for i in range(size))
  for lax_fn, jaxcc_fn, out in (
      (lambda b: lax.psum(b, axes), lambda b: jaxcc.psum(b, axes), P()),
      (lambda b: lax.pmax(b, axes), lambda b: jaxcc.pmax(b, axes), P()),
      (lambda b: lax.all_gather(b, axes, axis=1, tiled=True),
       lambda b: jaxcc.all_gather(b, axes, axis=1), P(("a", "b"))),
      (lambda b: lax.psum_scatter(b, axes, tiled=True),
       lambda b: jaxcc.psum_scatter(b, axes, tiled=True), P(("a", "b"))),
      # jax 0.12 refuses a tuple not in mesh order here (jax_raise_on_ppermute_sort_diff).
      (lambda b: lax.ppermute(b, axes, perm), lambda b: jaxcc.ppermute(b, axes, perm),
       P(("a", "b")))):
    compare(lax_fn, jaxcc_fn, random_input("tuple" + "".join(axes)), mesh, P(("a", "b")), out)


def test_all_gather_to_reduced_and_its_transpose_equal_lax():
  """``all_gather(to="reduced")`` (a reduced result) and its gradient, an unreduced
  psum_scatter, as lax's."""
  mesh = mesh_1d()
  x = random_input("reduced", shape=(8 * 3, 5))
  w = random_input("reduced-w", shape=(24, 5))

  def loss(gather):
    def body(b, w):
      full = gather(b)
      return lax.psum(jnp.sum(full * w[: full.shape[0]]), "x")

    f = jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P()), out_specs=P())
    return jax.jit(jax.value_and_grad(f))

  args = (jax.device_put(x, NamedSharding(mesh, P("x"))),
          jax.device_put(w, NamedSharding(mesh, P())))
  outcomes = []
  for gather in (lambda b: lax.all_gather(b, "x", tiled=True, to="reduced"),
                 lambda b: jaxcc.all_gather(b, "x", to="reduced")):
    try:
      outcomes.append(jax.tree.map(np.asarray, loss(gather)(*args)))
    except Exception as e:
      outcomes.append(type(e))
  want, got = outcomes
  if isinstance(want, type):
    assert got is want
  else:
    jax.tree.map(np.testing.assert_array_equal, got, want)


def test_bad_groups_fail_at_trace_time():
  mesh = mesh_1d()
  x = jax.device_put(random_input("bad"), NamedSharding(mesh, P("x")))
  for groups in (((0, 1, 2), (3, 4, 5, 6, 7)), ((0, 1, 2, 3), (4, 5, 6, 6)), ()):
    with pytest.raises(ValueError, match="axis_index_groups must split the 8 ranks"):
      jax.jit(jax.shard_map(lambda b: jaxcc.psum(b, "x", axis_index_groups=groups), mesh=mesh,
                            in_specs=P("x"), out_specs=P("x"), check_vma=False))(x)
  with pytest.raises(ValueError, match="op='max' cannot take axis_index_groups"):
    jax.jit(jax.shard_map(
        lambda b: jaxcc.reduce_scatter(b, "x", op="max", axis_index_groups=GROUPS), mesh=mesh,
        in_specs=P("x"), out_specs=P("x")))(x)
