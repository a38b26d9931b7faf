"""codec= on the collectives: every result equals codec=None's bit for bit, gradients included.

Every collective runs with both codecs on 8 devices and on 3, every
algorithm with a codec, each collective on 1 device and under the native
executor (executor="auto": in-process on the CPU; ppermute with "native" on
1, 3 and 8 devices too); every program carries
bf16, f16 and f32 inputs at once. Inputs are fresh on every run (the seed is
in every failure message) and of three kinds: adversarial bits (NaN
payloads, infinities, -0.0, subnormals; they overflow "fixed"'s spill pool,
so those steps go raw), weight-like normals (they fit it, so the pieces move
compressed) and sparse values.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import bitwise
import jaxcc
from jaxcc import Topology

FLOATS = (jnp.bfloat16, jnp.float16, jnp.float32)
KINDS = ("special", "weights", "sparse")
SEED = np.random.SeedSequence().entropy

# (collective, algorithm, devices, codec, executor): every collective with both codecs on 8 and
# on 3 devices, every algorithm with a codec (each with both across the collectives), 1 device,
# and the native executor ("auto": in-process on the CPU; ppermute's also as "native").
CASES = [
    ("all_reduce", "ring", 8, "fixed", "xla"), ("all_reduce", "ring", 3, "entropy", "xla"),
    ("all_reduce", "direct", 8, "entropy", "xla"), ("all_reduce", "optcc", 8, "fixed", "xla"),
    ("all_reduce", "optcc", 3, "entropy", "xla"), ("all_reduce", "auto", 3, "entropy", "xla"),
    ("all_reduce", "auto", 1, "fixed", "xla"), ("all_reduce", "ring", 8, "entropy", "auto"),
    ("reduce_scatter", "ring", 8, "entropy", "xla"), ("reduce_scatter", "ring", 3, "fixed", "xla"),
    ("reduce_scatter", "direct", 8, "fixed", "xla"),
    ("reduce_scatter", "auto", 3, "entropy", "xla"),
    ("reduce_scatter", "auto", 1, "entropy", "xla"),
    ("reduce_scatter", "ring", 8, "fixed", "auto"),
    ("all_gather", "ring", 8, "fixed", "xla"), ("all_gather", "ring", 3, "entropy", "xla"),
    ("all_gather", "direct", 8, "entropy", "xla"), ("all_gather", "auto", 3, "fixed", "xla"),
    ("all_gather", "auto", 1, "fixed", "xla"), ("all_gather", "ring", 8, "entropy", "auto"),
    ("broadcast", "ring", 8, "entropy", "xla"), ("broadcast", "ring", 3, "fixed", "xla"),
    ("broadcast", "direct", 8, "fixed", "xla"), ("broadcast", "auto", 3, "entropy", "xla"),
    ("broadcast", "auto", 1, "entropy", "xla"), ("broadcast", "direct", 8, "fixed", "auto"),
    ("ppermute", None, 8, "fixed", "xla"), ("ppermute", None, 3, "entropy", "xla"),
    ("ppermute", None, 1, "fixed", "xla"), ("ppermute", None, 8, "entropy", "auto"),
    ("ppermute", None, 8, "fixed", "native"), ("ppermute", None, 3, "entropy", "native"),
    ("ppermute", None, 1, "entropy", "native"),
]


def mesh_of(p):
  return jax.make_mesh((p,), ("x",), devices=jax.devices()[:p])


def per_rank_shape(collective, p):
  """Pieces of a few hundred elements: enough for "fixed" to move fewer bytes than raw."""
  return {"all_reduce": (7, 229), "reduce_scatter": (3, 67 * p), "all_gather": (3, 67),
          "broadcast": (1601,), "ppermute": (2, 150)}[collective]


def ring_perm(p):
  """A shift by one; rank 0 receives nothing when p > 2."""
  return tuple((i, (i + 1) % p) for i in range(p - 1 if p > 2 else p))


def collective_fn(collective, algorithm, p, codec, executor):
  topo = Topology.uniform(p, 12.5e9, latency=5e-6)
  if p > 1:
    topo = topo.with_straggler(p - 1, 0.5)
  kw = dict(codec=codec, executor=executor)
  if collective != "ppermute":
    kw.update(algorithm=algorithm, topology=topo)
  return {
      "all_reduce": lambda b: jaxcc.all_reduce(b, "x", **kw),
      "reduce_scatter": lambda b: jaxcc.reduce_scatter(b, "x", scatter_dimension=1, **kw),
      "all_gather": lambda b: jaxcc.all_gather(b, "x", axis=1, **kw),
      "broadcast": lambda b: jaxcc.broadcast(b, "x", root=p // 2, **kw),
      "ppermute": lambda b: jaxcc.ppermute(b, "x", ring_perm(p), **kw),
  }[collective]


@functools.lru_cache(maxsize=None)
def forward(collective, algorithm, p, codec, executor):
  """The jitted shard_map of the collective over one input per dtype of FLOATS."""
  fn = collective_fn(collective, algorithm, p, codec, executor)
  spec = P() if collective in ("all_reduce", "broadcast") else P("x")
  return jax.jit(jax.shard_map(lambda *xs: tuple(fn(x) for x in xs), mesh=mesh_of(p),
                               in_specs=(P("x"),) * len(FLOATS), out_specs=(spec,) * len(FLOATS)))


def make_inputs(collective, p, kind, salt):
  shape = per_rank_shape(collective, p)
  glob = (p * shape[0],) + shape[1:]
  rng = np.random.default_rng([SEED, salt, p, len(collective)])
  return [bitwise.float_data(kind, int(np.prod(glob)), dt, rng).reshape(glob) for dt in FLOATS]


def shard(hosts, p):
  return [jax.device_put(h, NamedSharding(mesh_of(p), P("x"))) for h in hosts]


def expected_copy(collective, host, p):
  """What broadcast and ppermute must deliver: the input's own bits, moved."""
  blocks = np.split(host, p)
  if collective == "broadcast":
    return blocks[p // 2]
  out = [np.zeros_like(b) for b in blocks]
  for s, d in ring_perm(p):
    out[d] = blocks[s]
  return np.concatenate(out)


class CodecCollectivesTest(parameterized.TestCase):

  def assert_same_bits(self, actual, expected, msg):
    bitwise.assert_same_bits(self, actual, expected, f"{msg}, seed={SEED}")

  @parameterized.parameters(*CASES)
  def test_equals_no_codec_bit_for_bit(self, collective, algorithm, p, codec, executor):
    mine = forward(collective, algorithm, p, codec, executor)
    ref = forward(collective, algorithm, p, None, executor)
    for salt, kind in enumerate(KINDS):
      hosts = make_inputs(collective, p, kind, salt)
      xs = shard(hosts, p)
      for dt, host, got, want in zip(FLOATS, hosts, mine(*xs), ref(*xs)):
        msg = f"{kind} {jnp.dtype(dt).name}"
        self.assert_same_bits(got, want, msg)
        if collective in ("broadcast", "ppermute"):
          self.assert_same_bits(got, expected_copy(collective, host, p), msg)

  @parameterized.parameters(  # all_gather's transpose is reduce_scatter, broadcast's all_reduce
      ("all_reduce", "direct", 3, "fixed", "xla"), ("all_gather", "ring", 3, "entropy", "xla"),
      ("broadcast", "ring", 3, "fixed", "xla"), ("ppermute", None, 8, "entropy", "xla"),
      ("ppermute", None, 3, "fixed", "native"))
  def test_gradients_equal_no_codec_and_carry_the_codec(self, collective, algorithm, p, codec,
                                                         executor):
    hosts = [h / 3 for h in make_inputs(collective, p, "weights", 7)]
    xs = shard(hosts, p)
    grads = {c: self.gradient(collective, algorithm, p, c, executor) for c in (None, codec)}
    for dt, got, want in zip(FLOATS, grads[codec](*xs), grads[None](*xs)):
      self.assert_same_bits(got, want, f"gradient {jnp.dtype(dt).name}")
    # The backward pass runs the transposed collective, compressed with the same codec.
    eqns = list(jaxcc_eqns(jax.make_jaxpr(grads[codec])(*xs).jaxpr))
    self.assertGreaterEqual(len(eqns), 2 * len(FLOATS))  # forward and backward
    self.assertEqual({e.params["codec"] for e in eqns}, {codec})

  @staticmethod
  @functools.lru_cache(maxsize=None)
  def gradient(collective, algorithm, p, codec, executor):
    """grad of sum(sin(collective(x * x))); check_vma=False makes every transpose a collective."""
    fn = collective_fn(collective, algorithm, p, codec, executor)

    def loss(*xs):
      return sum(jnp.sum(jnp.sin(fn(x * x).astype(jnp.float32))) * (i + 1)
                 for i, x in enumerate(xs))

    n = len(FLOATS)
    return jax.jit(jax.shard_map(jax.grad(loss, argnums=tuple(range(n))), mesh=mesh_of(p),
                                 in_specs=(P("x"),) * n, out_specs=(P("x"),) * n,
                                 check_vma=False))

  def test_vmap_over_another_axis_keeps_the_codec(self):
    p = 4
    host = bitwise.float_data("special", p * 3 * 8 * 300, jnp.bfloat16,
                              np.random.default_rng([SEED, 11])).reshape(p * 3, 8, 300)
    x = jax.device_put(host, NamedSharding(mesh_of(p), P("x")))
    outs = [jax.jit(jax.shard_map(
        jax.vmap(lambda b, c=c: jaxcc.all_gather(b, "x", axis=1, algorithm="ring", codec=c),
                 in_axes=1, out_axes=0), mesh=mesh_of(p), in_specs=P("x"), out_specs=P(None, "x"),
        check_vma=False))(x) for c in (None, "fixed")]
    self.assert_same_bits(outs[1], outs[0], "vmap")

  def test_fixed_moves_fewer_bytes_than_raw_through_xla(self):
    p, n = 4, 4096
    x = jax.device_put(np.zeros(p * n, jnp.bfloat16), NamedSharding(mesh_of(p), P("x")))

    def moved(codec):
      f = jax.jit(jax.shard_map(
          lambda b: jaxcc.all_gather(b, "x", algorithm="ring", executor="xla", codec=codec),
          mesh=mesh_of(p), in_specs=P("x"), out_specs=P("x")))
      hlo = f.lower(x).as_text()
      return [line for line in hlo.splitlines() if "collective_permute" in line]

    raw, fixed = moved(None), moved("fixed")
    self.assertTrue(raw and all(f"tensor<{n}xui16>" in line for line in raw), raw)
    small = f"tensor<{jaxcc.codec.fixed_nbytes((n,), jnp.bfloat16) + 4}xui8>"
    # Each ring step moves the fixed-size encoding, with the raw pieces as the spill fallback.
    self.assertEqual(sum(small in line for line in fixed), p - 1)
    self.assertEqual(sum(f"tensor<{n}xui16>" in line for line in fixed), p - 1)

  def test_spill_detection_sees_the_data_kinds_apart(self):
    """The adversarial kind overflows the fixed spill pool and the weight-like kind fits it,
    so the equality tests above take both branches of encoded_ppermute."""
    for dt in FLOATS:
      for kind, spills in (("special", True), ("weights", False)):
        x = bitwise.float_data(kind, 229, dt, np.random.default_rng([SEED, 3]))
        enc = jaxcc.codec.encode(x, "fixed")
        self.assertEqual(int(enc.nbytes) > jaxcc.codec.fixed_nbytes(x.shape, dt), spills,
                         f"{kind} {jnp.dtype(dt).name}")

  @parameterized.parameters(
      (lambda b: jaxcc.all_reduce(b.astype(jnp.int32), "x", codec="entropy"), TypeError,
       "jaxcc.all_reduce: codec='entropy' cannot take int32; codecs take bfloat16, float16, "
       "float32; use codec=None"),
      (lambda b: jaxcc.all_gather(b.astype(jnp.int8), "x", codec="fixed"), TypeError,
       "jaxcc.all_gather: codec='fixed' cannot take int8"),
      (lambda b: jaxcc.reduce_scatter(b.astype(jnp.int32), "x", codec="fixed"), TypeError,
       "jaxcc.reduce_scatter: codec='fixed' cannot take int32"),
      (lambda b: jaxcc.broadcast(b > 0, "x", codec="entropy"), TypeError,
       "jaxcc.broadcast: codec='entropy' cannot take bool"),
      (lambda b: jaxcc.ppermute(b.astype(jnp.int32), "x", [(0, 1)], codec="fixed"), TypeError,
       "jaxcc.ppermute: codec='fixed' cannot take int32"),
      (lambda b: jaxcc.all_reduce(b, "x", codec="zstd"), ValueError,
       "codec must be one of .None, 'fixed', 'entropy', 'auto'., got codec='zstd'"),
      (lambda b: jaxcc.ppermute(b, "x", [(0, 1)], codec="raw"), ValueError,
       "codec must be one of"),
      (lambda b: jaxcc.all_reduce(b, "x", algorithm="lax", codec="fixed"), ValueError,
       "algorithm='lax' is XLA's own collective, which cannot move encoded bytes"),
      (lambda b: jaxcc.broadcast(b, "x", algorithm="lax", codec="entropy"), ValueError,
       "use codec=None with it"),
  )
  def test_bad_codec_fails_at_trace_time(self, fn, error, match):
    p = 4
    x = jax.device_put(np.zeros((p * 8, 4), np.float32), NamedSharding(mesh_of(p), P("x")))
    with self.assertRaisesRegex(error, match):
      jax.jit(jax.shard_map(fn, mesh=mesh_of(p), in_specs=P("x"), out_specs=P("x"),
                            check_vma=False)).lower(x)


def jaxcc_eqns(jaxpr):
  """Every equation of a jaxcc collective in ``jaxpr`` and the jaxprs nested in it."""
  for eqn in jaxpr.eqns:
    if "codec" in eqn.params:
      yield eqn
    for v in eqn.params.values():
      inner = getattr(v, "jaxpr", v)
      if hasattr(inner, "eqns"):
        yield from jaxcc_eqns(inner)


if __name__ == "__main__":
  absltest.main()
