"""Hierarchical (HetCCL) collectives over clusters: schedules proven, bytes across clusters
counted, results and gradients against lax on 8 devices, tuple axes, bad topologies."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxcc
from jaxcc import Topology, sim
from jaxcc.schedules.hierarchical import cross_cluster_bytes
from jaxcc.schedules.ir import DST, LENGTH, SRC
from jaxcc.topology import MESSAGE_COST

SEED = np.random.SeedSequence().entropy
B = 25e9
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")
DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16, jnp.int32)


def clusters(sizes, ratio=10, inter=None, message_cost=MESSAGE_COST):
  return Topology.clusters(sizes, B, B / ratio if inter is None else inter,
                           message_cost=message_cost)


# Layouts on 8 ranks: unequal sizes, a one-rank cluster, ranks without a cross-cluster port.
LAYOUTS_8 = {
    "3+5": clusters([3, 5]),
    "1+3+4 portless": clusters([1, 3, 4], inter=[B / 10, B / 10, 0, B / 10, 0, B / 10, B / 10, 0]),
    "2+2+4": clusters([2, 2, 4], ratio=100),
    "4+4 slow border": clusters([4, 4]).with_straggler(5, 0.5, level="inter"),
}
LAYOUTS_SIM = dict(LAYOUTS_8, **{
    "2+4+6": clusters([2, 4, 6]),
    "1+3+3+5": clusters([1, 3, 3, 5], ratio=100),
    "1+1+1": clusters([1, 1, 1]),
    "one cluster": clusters([6]),
    "one cluster, no ports": clusters([5], inter=0.0),
    "flat": Topology.uniform(5, B).with_straggler(1, 0.5),
})


# --- schedules ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", LAYOUTS_SIM)
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_schedules_prove_and_cross_the_minimum(name, collective):
  topo = LAYOUTS_SIM[name]
  p = topo.size
  for length in (0, p, 7 * p, 1000 * p):
    for chunks in (1, 3, 16):
      sched = jaxcc.plan(collective, 4 * length, topo, "hierarchical", chunks=chunks)
      sim.check(sched)
      table = sched.table
      cross = np.array([not topo.same_cluster(s, d) for s, d in table[:, [SRC, DST]]], bool)
      crossed = int(table[cross.reshape(-1), LENGTH].sum()) * 4 if len(table) else 0
      assert crossed == cross_cluster_bytes(collective, 4 * length, topo.num_clusters)
      assert sim.simulate(sched, topo).inter_bytes == crossed
      if topo.cluster is not None:  # only border ranks cross
        assert all(topo.inter_bandwidth[s] > 0 and topo.inter_bandwidth[d] > 0
                   for s, d in table[cross.reshape(-1)][:, [SRC, DST]])


def test_result_does_not_depend_on_the_depth():
  """The segments, owners and cross owners are those of the whole buffer at any depth."""
  topo = LAYOUTS_SIM["2+4+6"]
  owners = []
  for chunks in (1, 4, 64):
    sched = jaxcc.plan("all_reduce", 4 * 1200, topo, "hierarchical", chunks=chunks)
    who = np.full((topo.size, 1200), -1)
    for row in sched.table:  # the rank that reduces each element across clusters
      if not topo.same_cluster(row[SRC], row[DST]) and row[-1] == 1:
        who[row[SRC], row[3]:row[3] + row[LENGTH]] = row[DST]
    owners.append(who)
  assert all((o == owners[0]).all() for o in owners)


@pytest.mark.parametrize("sizes", [[3, 5], [2, 4, 6], [1, 3, 3, 5]])
@pytest.mark.parametrize("ratio", [4, 10, 100])
def test_simulated_within_two_percent_of_the_clustered_bound(sizes, ratio):
  """In the fluid model: the bound charges one message cost per port, a pipeline many."""
  topo = clusters(sizes, ratio, message_cost=0.0)
  nbytes = (64 << 20) // sum(sizes) * sum(sizes)
  sched = jaxcc.plan("all_reduce", nbytes, topo, "hierarchical")
  assert sim.simulate(sched, topo).time <= 1.02 * sim.lower_bound("all_reduce", nbytes, topo)


def test_auto_picks_hierarchical_across_a_slow_link():
  topo = clusters([3, 5], ratio=10)
  assert jaxcc.plan("all_reduce", 64 << 20, topo).algorithm == "hierarchical"
  assert jaxcc.plan("reduce_scatter", 64 << 20, topo).algorithm == "hierarchical"
  flat = Topology.uniform(8, B)
  assert jaxcc.plan("all_reduce", 64 << 20, flat).algorithm != "hierarchical"


def test_clustered_lower_bound_terms():
  n = 80e6
  topo = clusters([4, 4], ratio=10)
  # The cut: N across each cluster's four 2.5 GB/s ports.
  assert sim.lower_bound("all_reduce", n, topo) == pytest.approx(n / (4 * B / 10))
  fast = clusters([3, 5], ratio=1)
  # Inside the cluster of 5: 2 * 4 * N over five 25 GB/s ports.
  assert sim.lower_bound("all_reduce", n, fast) == pytest.approx(8 * n / (5 * B))
  assert sim.lower_bound("reduce_scatter", n, topo) == pytest.approx(n / 2 / (4 * B / 10))


def test_simulator_relays_through_a_border_rank():
  topo = clusters([2, 2], inter=[B / 10, 0, B / 10, B / 10])
  sched = jaxcc.plan("all_reduce", 4 << 20, topo, "ring", chunks=1)
  res = sim.simulate(sched, topo)
  assert res.inter_tx_busy[1] == 0 and res.inter_tx_busy[0] > 0  # rank 1 sends through rank 0


# --- topology ----------------------------------------------------------------------------------

def test_clusters_topology_per_rank():
  topo = Topology.clusters([1, 3], [10.0, 20.0], [1.0, 0, 2.0, 3.0], latency=1e-6,
                           inter_latency=1e-3)
  assert topo.cluster == (0, 1, 1, 1)
  assert topo.bandwidth == (10.0, 20.0, 20.0, 20.0)
  assert topo.inter_bandwidth == (1.0, 0.0, 2.0, 3.0)
  assert topo.border_ranks(1) == (2, 3) and topo.relay(1) == 2
  assert topo.message_latency(1, 2) == 1e-6 and topo.message_latency(0, 1) == 1e-3
  slow = topo.with_straggler(2, 0.5, level="inter")
  assert slow.inter_bandwidth[2] == 1.0 and slow.bandwidth[2] == 20.0
  assert topo.with_straggler(2, 0.5, level="intra").inter_bandwidth[2] == 2.0
  both = topo.with_straggler(3, 0.5)
  assert both.bandwidth[3] == 10.0 and both.inter_bandwidth[3] == 1.5
  assert hash(topo) == hash(Topology.clusters([1, 3], [10.0, 20.0], [1.0, 0, 2.0, 3.0],
                                              latency=1e-6, inter_latency=1e-3))


@pytest.mark.parametrize("make, match", [
    (lambda: Topology.clusters([2, 2], B, [1.0, 1.0, 0, 0]), "cluster 1 has no border rank"),
    (lambda: Topology.clusters([2, 0], B, B), "number of ranks must be an integer >= 1"),
    (lambda: Topology.clusters([2, 2], 0.0, B), r"intra_bandwidth must be a finite number > 0"),
    (lambda: Topology.clusters([2, 2], B, -1.0), r"inter_bandwidth must be a finite number > 0"),
    (lambda: Topology.clusters([2, 2], [B], B), "2 clusters but 1 values of intra_bandwidth"),
    (lambda: Topology.clusters([2, 2], B, [B] * 3), "one per cluster .2. or one per rank .4."),
    (lambda: Topology.clusters([], B, B), "at least one cluster"),
    (lambda: Topology.uniform(4, B).with_straggler(0, 0.5, level="inter"),
     "level='inter' needs a topology of clusters"),
    (lambda: clusters([2, 2]).with_straggler(0, 0.5, level="up"), "level must be"),
])
def test_bad_topologies(make, match):
  with pytest.raises(ValueError, match=match):
    make()


def test_topology_that_does_not_fit_the_axis_fails_at_trace_time():
  mesh = jax.make_mesh((8,), ("x",))
  topo = clusters([3, 4])
  fn = jax.shard_map(lambda v: jaxcc.all_reduce(v, "x", algorithm="hierarchical", topology=topo),
                     mesh=mesh, in_specs=P("x"), out_specs=P())
  with pytest.raises(ValueError, match="topology has 7 ranks but axis 'x' has 8"):
    jax.jit(fn).lower(jax.ShapeDtypeStruct((8,), jnp.float32,
                                           sharding=NamedSharding(mesh, P("x"))))


# --- collectives on 8 devices ------------------------------------------------------------------

def _random(rng, shape, dtype):
  if jnp.issubdtype(dtype, jnp.floating):
    return (rng.normal(size=shape) * 3).astype(np.float32).astype(dtype)
  return rng.integers(-(1 << 20), 1 << 20, size=shape).astype(dtype)


def _pair(collective, axes, topo, executor):
  kw = dict(algorithm="hierarchical", executor=executor, topology=topo)
  return {
      "all_reduce": (lambda v: jaxcc.all_reduce(v, axes, **kw), lambda v: lax.psum(v, axes)),
      "reduce_scatter": (lambda v: jaxcc.reduce_scatter(v, axes, scatter_dimension=1, **kw),
                         lambda v: lax.psum_scatter(v, axes, scatter_dimension=1, tiled=True)),
      "all_gather": (lambda v: jaxcc.all_gather(v, axes, axis=1, **kw),
                     lambda v: lax.all_gather(v, axes, axis=1, tiled=True)),
  }[collective]


def _compare(got, want, host, dtype, collective, p):
  got, want = np.asarray(got), np.asarray(want)
  assert got.shape == want.shape and got.dtype == want.dtype
  if collective == "all_gather" or not jnp.issubdtype(dtype, jnp.floating):
    assert got.tobytes() == want.tobytes(), f"seed={SEED}"
    return
  eps = float(jnp.finfo(dtype).eps)
  mags = np.abs(host.astype(np.float32)).reshape((p, -1) + host.shape[1:]).sum(0)
  if collective == "reduce_scatter":
    mags = np.concatenate(np.split(mags, p, axis=1), axis=0)
  err = np.abs(got.astype(np.float64) - want.astype(np.float64))
  assert (err <= 2 * p * eps * mags + 1e-30).all(), f"seed={SEED}"


@pytest.mark.parametrize("layout", LAYOUTS_8)
@pytest.mark.parametrize("collective", COLLECTIVES)
@pytest.mark.parametrize("executor", ["native", "xla"])
def test_equals_lax_on_8_devices(layout, collective, executor):
  topo = LAYOUTS_8[layout]
  mesh = jax.make_mesh((8,), ("x",))
  rng = np.random.default_rng([SEED, len(layout), len(collective), len(executor)])
  shape = {"all_reduce": (8 * 3, 13), "reduce_scatter": (8 * 2, 8 * 5),
           "all_gather": (8 * 3, 5)}[collective]
  hosts = [_random(rng, shape, dt) for dt in DTYPES]
  xs = [jax.device_put(h, NamedSharding(mesh, P("x"))) for h in hosts]
  mine, theirs = _pair(collective, "x", topo, executor)
  spec = P() if collective == "all_reduce" else P("x")
  run = lambda fn: jax.jit(jax.shard_map(lambda *vs: [fn(v) for v in vs], mesh=mesh,
                                         in_specs=(P("x"),) * 4, out_specs=[spec] * 4))
  got, want = run(mine)(*xs), run(theirs)(*xs)
  for dt, host, g, w in zip(DTYPES, hosts, got, want):
    _compare(g, w, host, dt, collective, 8)
  again = run(mine)(*xs)
  for g, g2 in zip(got, again):  # a fixed order: identical from run to run
    assert np.asarray(g).tobytes() == np.asarray(g2).tobytes()


@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter"])
def test_native_and_xla_executors_give_the_same_bits(collective):
  topo = LAYOUTS_8["1+3+4 portless"]
  mesh = jax.make_mesh((8,), ("x",))
  rng = np.random.default_rng([SEED, 3])
  for dt in (jnp.float32, jnp.bfloat16, jnp.float16):
    x = jax.device_put(_random(rng, (8 * 4, 8 * 3), dt), NamedSharding(mesh, P("x")))
    outs = []
    for executor in ("native", "xla"):
      fn = _pair(collective, "x", topo, executor)[0]
      spec = P() if collective == "all_reduce" else P("x")
      outs.append(np.asarray(jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("x"),
                                                   out_specs=spec))(x)))
    assert outs[0].tobytes() == outs[1].tobytes(), (jnp.dtype(dt).name, f"seed={SEED}")


@pytest.mark.parametrize("layout", ["3+5", "1+3+4 portless"])
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_gradient_equals_lax(layout, collective):
  topo = LAYOUTS_8[layout]
  mesh = jax.make_mesh((8,), ("x",))
  rng = np.random.default_rng([SEED, 11, len(layout)])
  shape = (8 * 2, 8 * 3)
  host = _random(rng, shape, jnp.float32) / 3
  x = jax.device_put(host, NamedSharding(mesh, P("x")))
  grads = []
  for fn in _pair(collective, "x", topo, "native"):
    loss = lambda v, fn=fn: jnp.sum(jnp.sin(fn(v * v)))
    grads.append(np.asarray(jax.jit(jax.shard_map(jax.grad(loss), mesh=mesh, in_specs=P("x"),
                                                  out_specs=P("x")))(x)))
  np.testing.assert_allclose(grads[0], grads[1], rtol=1e-4, atol=1e-4, err_msg=f"seed={SEED}")


@pytest.mark.parametrize("shape", [(2, 4), (4, 2)])
@pytest.mark.parametrize("collective", COLLECTIVES)
@pytest.mark.parametrize("executor", ["native", "xla"])
def test_tuple_axes_equal_lax(shape, collective, executor):
  """Over ("dcn", "ici") with no topology each dcn group is a cluster."""
  mesh = jax.make_mesh(shape, ("dcn", "ici"))
  axes = ("dcn", "ici")
  rng = np.random.default_rng([SEED, *shape, len(collective)])
  host_shape = {"all_reduce": (8 * 3, 7), "reduce_scatter": (8, 8 * 3),
                "all_gather": (8 * 2, 3)}[collective]
  for dt in (jnp.float32, jnp.int32):
    host = _random(rng, host_shape, dt)
    x = jax.device_put(host, NamedSharding(mesh, P(axes)))
    mine, theirs = _pair(collective, axes, None, executor)
    spec = P() if collective == "all_reduce" else P(axes)
    run = lambda fn: np.asarray(jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P(axes),
                                                      out_specs=spec))(x))
    _compare(run(mine), run(theirs), host, dt, collective, 8)


def test_tuple_axes_gradient_equals_lax():
  mesh = jax.make_mesh((2, 4), ("dcn", "ici"))
  axes = ("dcn", "ici")
  host = np.random.default_rng([SEED, 5]).normal(size=(8 * 2, 8)).astype(np.float32)
  x = jax.device_put(host, NamedSharding(mesh, P(axes)))
  grads = []
  for fn in _pair("reduce_scatter", axes, None, "native"):
    loss = lambda v, fn=fn: jnp.sum(jnp.sin(fn(v * v)))
    grads.append(np.asarray(jax.jit(jax.shard_map(jax.grad(loss), mesh=mesh, in_specs=P(axes),
                                                  out_specs=P(axes)))(x)))
  np.testing.assert_allclose(grads[0], grads[1], rtol=1e-5, atol=1e-5, err_msg=f"seed={SEED}")


@pytest.mark.parametrize("shape", [(2, 4), (4, 2)])
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_border_engine_runs_intra_on_xla_with_the_full_schedules_bits(shape, collective,
                                                                      monkeypatch):
  """Intra-cluster phases on XLA's all_to_all / all_gather over "ici", the cross phase native
  over "dcn": the same bits as the whole schedule on the XLA twin."""
  monkeypatch.setenv("JAXCC_INTRA_ENGINE", "xla")
  mesh = jax.make_mesh(shape, ("dcn", "ici"))
  axes = ("dcn", "ici")
  rng = np.random.default_rng([SEED, *shape, len(collective), 9])
  spec = P() if collective == "all_reduce" else P(axes)
  for dt in DTYPES:
    x = jax.device_put(_random(rng, (8 * 8, 8 * 3), dt), NamedSharding(mesh, P(axes)))
    outs = []
    for executor in ("native", "xla"):
      fn = jax.jit(jax.shard_map(_pair(collective, axes, None, executor)[0], mesh=mesh,
                                 in_specs=P(axes), out_specs=spec))
      if executor == "native":
        hlo = fn.lower(x).as_text()
        assert ("all_to_all" in hlo or "all-to-all" in hlo or collective == "all_gather")
        assert "all_gather" in hlo or "all-gather" in hlo or collective == "reduce_scatter"
      outs.append(np.asarray(fn(x)))
    assert outs[0].tobytes() == outs[1].tobytes(), (jnp.dtype(dt).name, f"seed={SEED}")


def test_border_engine_falls_back_where_tiles_are_unequal(monkeypatch):
  monkeypatch.setenv("JAXCC_INTRA_ENGINE", "xla")
  mesh = jax.make_mesh((2, 4), ("dcn", "ici"))
  axes = ("dcn", "ici")
  host = np.random.default_rng([SEED, 13]).normal(size=(8 * 7,)).astype(np.float32)
  x = jax.device_put(host, NamedSharding(mesh, P(axes)))  # 7 elements per rank
  outs = [np.asarray(jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P(axes), out_specs=P()))(x))
          for fn in _pair("all_reduce", axes, None, "native")]
  _compare(outs[0], outs[1], host, jnp.float32, "all_reduce", 8)


def test_cpu_default_runs_the_whole_schedule():
  """On the CPU the intra phases stay native by default (measured faster than XLA's there)."""
  mesh = jax.make_mesh((2, 4), ("dcn", "ici"))
  axes = ("dcn", "ici")
  x = jax.ShapeDtypeStruct((8 * 64,), jnp.float32, sharding=NamedSharding(mesh, P(axes)))
  fn = jax.jit(jax.shard_map(lambda v: jaxcc.all_reduce(v, axes, algorithm="hierarchical"),
                             mesh=mesh, in_specs=P(axes), out_specs=P()))
  hlo = fn.lower(x).as_text()
  assert "all_to_all" not in hlo and "all-to-all" not in hlo
