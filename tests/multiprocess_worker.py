"""One process of tests/test_multiprocess.py: a jax.distributed job on loopback.

Usage: python tests/multiprocess_worker.py MODE, started by ``jaxcc.launcher.launch``.

MODE "check": every collective and algorithm with the native executor (TCP
between processes, InProcess within one), the XLA executor and lax on odd
shapes; native must equal XLA bit for bit and lax up to reassociation. Then
buffers large enough for pipelined (chunked) schedules, pieces encoded on the wire
(codec="fixed"/"entropy" equal raw bit for bit), a 2-D mesh inside a scan, hierarchical
collectives over clusters, back-to-back executions, the gossip exchange against its twin,
and processes that plan different schedules (a clear error). Prints "OK".
MODE "kill": after one native all_reduce the last process exits; the others
run another and print "FAILED after <s> s: <error>".
MODE "independent": a program of many independent native collectives, XLA's among them
and one in a scan, and a second program of two, run alternately RUNS times each back to back;
every execution equals its XLA twin bit for bit.
"""

import os
import sys
import time
from unittest import mock

from jaxcc.launcher import join

MODE = sys.argv[1]
JOB = join(timeout_s=60)
PID, NPROC = JOB.process_id, JOB.num_processes

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxcc  # noqa: E402
from jaxcc import _jaxcc_cpu  # noqa: E402

LDEV = jax.local_device_count()
P_ALL = NPROC * LDEV
ROOT = P_ALL - 3  # a broadcast root on another process than rank 0
ALL_REDUCE = ("ring", "direct", "optcc", "r2ccl")
OTHERS = ("ring", "direct")


def put(mesh, host, spec):
  return jax.make_array_from_callback(host.shape, NamedSharding(mesh, spec), lambda i: host[i])


def shards(y):
  return {str(s.index): np.asarray(s.data) for s in y.addressable_shards}


def cases(executor, topology):
  """(name, fn, out spec) per collective x algorithm; executor "lax" means XLA's own op."""
  out = []
  for alg in ALL_REDUCE:
    out.append((f"all_reduce/{alg}", lambda b, a=alg: (
        lax.psum(b, "x") if executor == "lax" else
        jaxcc.all_reduce(b, "x", algorithm=a, executor=executor, topology=topology)), P()))
  for alg in OTHERS:
    out.append((f"reduce_scatter/{alg}", lambda b, a=alg: (
        lax.psum_scatter(b, "x", scatter_dimension=1, tiled=True) if executor == "lax" else
        jaxcc.reduce_scatter(b, "x", scatter_dimension=1, algorithm=a, executor=executor)),
                P("x")))
    out.append((f"all_gather/{alg}", lambda b, a=alg: (
        lax.all_gather(b, "x", axis=1, tiled=True) if executor == "lax" else
        jaxcc.all_gather(b, "x", axis=1, algorithm=a, executor=executor)), P("x")))
    out.append((f"broadcast/{alg}", lambda b, a=alg: (
        lax.psum(jnp.where(lax.axis_index("x") == ROOT, b, 0), "x") if executor == "lax" else
        jaxcc.broadcast(b, "x", root=ROOT, algorithm=a, executor=executor)), P()))
  return out


def check_every_collective(mesh):
  rng = np.random.default_rng(0)
  topology = jaxcc.Topology.uniform(P_ALL, 1e10).with_straggler(P_ALL - 1, 0.4)
  hosts = {"all_reduce": rng.normal(size=(P_ALL * 13, 7)).astype(np.float32) * 50,
           "reduce_scatter": rng.normal(size=(P_ALL * 3, 3 * P_ALL)).astype(np.float32),
           "all_gather": rng.normal(size=(P_ALL * 3, 5)).astype(np.float32),
           "broadcast": rng.integers(-99, 99, size=(P_ALL * 9,)).astype(np.int32)}
  inputs = {k: put(mesh, h, P("x")) for k, h in hosts.items()}
  results = {}
  for executor in ("native", "xla", "lax"):
    named = cases(executor, topology)
    args = [inputs[name.split("/")[0]] for name, _, _ in named]
    f = jax.jit(jax.shard_map(lambda *bs: tuple(fn(b) for (_, fn, _), b in zip(named, bs)),
                              mesh=mesh, in_specs=(P("x"),) * len(named),
                              out_specs=tuple(spec for _, _, spec in named)))
    results[executor] = dict(zip([n for n, _, _ in named], map(shards, f(*args))))
  for name, native in results["native"].items():
    for index, a in native.items():
      b, c = results["xla"][name][index], results["lax"][name][index]
      assert a.dtype == b.dtype and a.shape == b.shape, (name, a.shape, b.shape)
      assert a.tobytes() == b.tobytes(), f"{name}: native != xla on shard {index}"
      np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-3, err_msg=name)


def check_pipelined(mesh):
  """Buffers large enough for chunked schedules: over TCP the runner overlaps their steps.

  4 MiB per rank over ports of 100 MB/s gives 2 to 128 chunks on 8 ranks
  (``jaxcc.planner.depth``); the results must still equal the XLA executor's,
  which runs the one-chunk schedule step by step.
  """
  flat = jaxcc.Topology.uniform(P_ALL, 1e8)
  topology = flat.with_straggler(P_ALL - 1, 0.4)
  host = np.random.default_rng(2).normal(size=(P_ALL * (1 << 20),)).astype(np.float32)
  named = [(f"all_reduce/{a}", lambda b, e, a=a: jaxcc.all_reduce(
      b, "x", algorithm=a, executor=e, topology=topology)) for a in ALL_REDUCE]
  named += [("reduce_scatter/ring", lambda b, e: jaxcc.reduce_scatter(
                b, "x", executor=e, algorithm="ring", topology=flat)),
            ("all_gather/ring", lambda b, e: jaxcc.all_gather(
                b[:1 << 17], "x", executor=e, algorithm="ring", topology=flat)),
            ("broadcast/ring", lambda b, e: jaxcc.broadcast(
                b, "x", root=ROOT, executor=e, algorithm="ring", topology=flat))]
  depths = [jaxcc.planner.depth("all_reduce", 1 << 20, 4, topology, a) for a in ALL_REDUCE]
  depths += [jaxcc.planner.depth(c, n, 4, flat, "ring") for c, n in (
      ("reduce_scatter", 1 << 20), ("all_gather", 1 << 20), ("broadcast", 1 << 20))]
  assert min(depths) > 1, depths
  x = put(mesh, host, P("x"))
  for name, fn in named:
    got = {}
    for executor in ("native", "xla"):
      f = jax.jit(jax.shard_map(lambda b: fn(b, executor), mesh=mesh, in_specs=P("x"),
                                out_specs=P("x"), check_vma=False))
      got[executor] = shards(f(x))
    assert all(got["native"][k].tobytes() == got["xla"][k].tobytes() for k in got["native"]), (
        f"pipelined {name}: native != xla")


def check_codecs(mesh):
  """Every piece on a TCP connection encoded: results equal the raw native run bit for bit.

  Special values (NaN payloads, infinities, -0.0, subnormals) and random bit
  patterns go through copies unchanged; sums see the same inputs in the same
  order. The all_reduce is large enough to be pipelined (4 chunks). "entropy"
  runs with every bf16/f32 piece split (JAXCC_SPLIT_SEND_BYTES=1), with none
  split and with the default, so forwarded bytes, fused decode-reduce-encode
  hops and split pieces all meet each other.
  """
  from bitwise import float_data  # noqa: PLC0415  (tests/ is on the worker's path)
  rng = np.random.default_rng(3)
  topology = jaxcc.Topology.uniform(P_ALL, 1e10).with_straggler(1, 0.5)
  runs = ((None, "0"), ("fixed", "1"), ("entropy", "0"), ("entropy", "1"),
          ("entropy", str(1 << 18)))
  shift = [(r, (r + 1) % P_ALL) for r in range(P_ALL)]
  for dtype in (jnp.bfloat16, jnp.float32):
    pieces = [float_data(kind, P_ALL * 4099, dtype, rng) for kind in ("special", "bits")]
    host = {"copies": np.concatenate(pieces),
            "sums": float_data("weights", P_ALL * (1 << 20), dtype, rng)}
    copies, sums = (put(mesh, host[k], P("x")) for k in ("copies", "sums"))
    named = [("all_reduce/optcc", sums, lambda b, c: jaxcc.all_reduce(
                  b, "x", algorithm="optcc", topology=topology, codec=c)),
             ("all_reduce/ring", sums, lambda b, c: jaxcc.all_reduce(
                  b, "x", algorithm="ring", codec=c)),
             ("reduce_scatter/ring", sums, lambda b, c: jaxcc.reduce_scatter(
                  b[:P_ALL * 4099], "x", algorithm="ring", codec=c)),
             ("all_gather/ring", copies, lambda b, c: jaxcc.all_gather(
                  b, "x", algorithm="ring", codec=c)),
             ("broadcast/direct", copies, lambda b, c: jaxcc.broadcast(
                  b, "x", root=ROOT, algorithm="direct", codec=c)),
             ("ppermute/small", copies, lambda b, c: jaxcc.ppermute(b, "x", shift, codec=c)),
             ("ppermute/large", sums, lambda b, c: jaxcc.ppermute(b, "x", shift, codec=c))]
    for name, x, fn in named:
      out = {}
      for codec, split in runs:
        os.environ["JAXCC_SPLIT_SEND_BYTES"] = split
        f = jax.jit(jax.shard_map(lambda b: fn(b, codec), mesh=mesh, in_specs=P("x"),
                                  out_specs=P("x"), check_vma=False))
        out[codec, split] = f(x)
      got = {run: shards(y) for run, y in out.items()}
      raw = got[runs[0]]
      if name.startswith("ppermute"):  # each rank holds its predecessor's input, bit for bit
        inputs = host["copies" if x is copies else "sums"].reshape(P_ALL, -1)
        for shard in out[runs[0]].addressable_shards:
          rank = shard.index[0].start // shard.data.shape[0]
          assert np.asarray(shard.data).tobytes() == inputs[rank - 1].tobytes(), name
      for run in runs[1:]:
        assert all(got[run][k].tobytes() == raw[k].tobytes() for k in raw), (
            f"{name} {jnp.dtype(dtype).name} codec={run[0]} split bytes {run[1]}: != raw")
  del os.environ["JAXCC_SPLIT_SEND_BYTES"]


def check_2d_mesh_in_scan(shape):
  """all_reduce over both axes of a 2-D mesh, 3 times in a scan.

  On (2, P/2) the groups of both axes span processes; on (P/2, 2) those of
  "x" live in one process each (InProcess), those of "a" span them.
  """
  mesh = jax.make_mesh(shape, ("a", "x"))
  host = np.random.default_rng(1).normal(size=(2 * shape[0], 3 * shape[1])).astype(np.float32)
  x = put(mesh, host, P("a", "x"))

  def run(executor):
    def step(c, _):
      c = c + 0.125 * jaxcc.all_reduce(c, "x", algorithm="optcc", executor=executor)
      return c + 0.25 * jaxcc.all_reduce(c, "a", algorithm="ring", executor=executor), None
    f = jax.shard_map(lambda b: lax.scan(step, b, None, length=3)[0], mesh=mesh,
                      in_specs=P("a", "x"), out_specs=P("a", "x"))
    return shards(jax.jit(f)(x))

  native, xla = run("native"), run("xla")
  assert all(native[k].tobytes() == xla[k].tobytes() for k in native), "2-D mesh: native != xla"


def check_hierarchical():
  """Hierarchical collectives across processes, native bit for bit against the XLA twin.

  Clusters 3+5 along "x" span processes (the whole schedule, pipelined over
  TCP); over ("dcn", "ici") on (P/2, 2) each cluster is one process (intra on
  XLA with JAXCC_INTRA_ENGINE=xla, the cross phase over TCP); on (2, P/2) the
  clusters span processes.
  """
  os.environ["JAXCC_INTRA_ENGINE"] = "xla"
  rng = np.random.default_rng(4)
  layouts = [(jax.make_mesh((P_ALL,), ("x",)), "x",
              jaxcc.Topology.clusters([3, P_ALL - 3], 1e10, 1e9)),
             (jax.make_mesh((P_ALL // LDEV, LDEV), ("dcn", "ici")), ("dcn", "ici"), None),
             (jax.make_mesh((2, P_ALL // 2), ("dcn", "ici")), ("dcn", "ici"), None)]
  for mesh, axes, topo in layouts:
    kw = dict(algorithm="hierarchical", topology=topo)
    named = [("all_reduce", lambda b, e: jaxcc.all_reduce(b, axes, executor=e, **kw),
              lambda b: lax.psum(b, axes), (P_ALL * (1 << 18),)),
             ("reduce_scatter", lambda b, e: jaxcc.reduce_scatter(b, axes, executor=e, **kw),
              lambda b: lax.psum_scatter(b, axes, tiled=True), (P_ALL * P_ALL * 999,)),
             ("all_gather", lambda b, e: jaxcc.all_gather(b, axes, executor=e, **kw),
              lambda b: lax.all_gather(b, axes, tiled=True), (P_ALL * 1001,))]
    for name, fn, ref, shape in named:
      x = put(mesh, rng.normal(size=shape).astype(np.float32), P(axes))
      got = {}
      for executor in ("native", "xla", "lax"):
        body = ref if executor == "lax" else (lambda b, e=executor: fn(b, e))
        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(axes), out_specs=P(axes),
                                  check_vma=False))
        got[executor] = shards(f(x))
      for k in got["native"]:
        assert got["native"][k].tobytes() == got["xla"][k].tobytes(), (
            f"hierarchical {name} over {axes}: native != xla")
        np.testing.assert_allclose(got["native"][k], got["lax"][k], rtol=1e-5, atol=1e-4)
  del os.environ["JAXCC_INTRA_ENGINE"]


def check_back_to_back(mesh):
  """Executions dispatched without waiting in between keep their own data."""
  f = jax.jit(jax.shard_map(lambda b: jaxcc.all_reduce(b, "x", algorithm="direct",
                                                       executor="native"),
                            mesh=mesh, in_specs=P("x"), out_specs=P()))
  hosts = [np.full((P_ALL * 1000,), float(i), np.float32) for i in range(4)]
  outs = [f(put(mesh, h, P("x"))) for h in hosts]
  for i, y in enumerate(outs):
    np.testing.assert_array_equal(np.asarray(y.addressable_shards[0].data), i * P_ALL)


def check_different_schedules(mesh):
  """Each process plans on another topology: the ranks must say so, not hang."""
  topology = jaxcc.Topology.uniform(P_ALL, 1e10).with_straggler(PID * LDEV, 0.3)
  f = jax.jit(jax.shard_map(lambda b: jaxcc.all_reduce(b, "x", algorithm="optcc",
                                                       executor="native", topology=topology),
                            mesh=mesh, in_specs=P("x"), out_specs=P()))
  start = time.monotonic()
  try:
    np.asarray(f(put(mesh, np.ones((P_ALL * 64,), np.float32), P("x"))).addressable_shards[0].data)
  except jax.errors.JaxRuntimeError as e:
    assert "planned a different schedule" in str(e), e
    assert time.monotonic() - start < 20, "the mismatch was found only by a timeout"
  else:
    raise AssertionError("ranks with different schedules did not fail")


def check_gossip_exchange(mesh):
  """The gossip exchange equals its twin, lax.ppermute per slot, bit for bit, on both paths.

  Two slots (shifts 1 and 3 over the 8 ranks: pairs within a process and across);
  each message is left out with probability 0.3, the same on both sides; odd
  sizes, every dtype with and without codecs, NaN payloads, infinities, -0.0 and
  subnormals; started in one program and finished in the next. Each case runs
  on the FFI path and on the host path (``JAXCC_EXCHANGE=host``: host
  callbacks), and the first two with a start of one path finished by a done of
  the other.
  """
  from jaxcc._src import gossip_exchange
  rng = np.random.default_rng(11)
  shifts = np.array([1, 3])
  k = len(shifts)
  specials = np.array([np.nan, -0.0, np.inf, -np.inf, 1e-40, -3e-39], np.float32)
  specials = specials.view(np.uint32) | np.array([0x1234, 0, 0, 0, 0, 0], np.uint32)
  cases = [(np.float32, 1001, None), (np.float32, 4099, "entropy"),
           (jnp.bfloat16, 777, "entropy"), (np.float16, 33, "fixed"), (np.int32, 5, None),
           (jnp.bfloat16, 1, None)]
  paths = [(case, ("native", "native")) for case in cases]
  paths += [(case, ("host", "host")) for case in cases]
  paths += [(cases[0], ("native", "host")), (cases[1], ("host", "native"))]
  for (dtype, n, codec), (start_path, done_path) in paths:
    if np.dtype(dtype).kind == "i":
      host = rng.integers(-2**31, 2**31, (P_ALL, n), dtype=np.int64).astype(np.int32)
    else:
      host = rng.standard_normal((P_ALL, n)).astype(np.float32)
      host[0, :min(n, 6)] = specials.view(np.float32)[:min(n, 6)]
      host = host.astype(dtype)
    sent = rng.random((P_ALL, k)) < 0.7  # sent[i, j]: rank i sends its slot-j message

    def slots(me, sent):
      dst, src = (me + shifts) % P_ALL, (me - shifts) % P_ALL
      return (jnp.where(sent[me], dst, -1),
              jnp.where(sent[src, jnp.arange(k)], src, -1))

    def begin(x, sent):
      send_to, recv_from = slots(lax.axis_index("x"), sent)
      return gossip_exchange.start(x[0], send_to, recv_from, "x", codec)[None]

    def finish(handle, x, sent):
      x = x[0]
      _, recv_from = slots(lax.axis_index("x"), sent)
      got, status, lost = gossip_exchange.done(handle, x, k, P_ALL, jnp.sum(x))
      got, status = got[0], status[0]
      twin = jnp.stack([lax.ppermute(x, "x", [(j, (j + int(s)) % P_ALL) for j in range(P_ALL)])
                        for s in shifts])
      twin = jnp.where((recv_from >= 0)[:, None], twin, jnp.zeros_like(twin))
      want_status = jnp.where(recv_from >= 0, 1, 0)
      return got[None], twin[None], status[None], want_status[None], lost[None]

    spec = P("x")
    start = jax.jit(jax.shard_map(begin, mesh=mesh, in_specs=(spec, P()), out_specs=spec))
    done = jax.jit(jax.shard_map(finish, mesh=mesh, in_specs=(spec, spec, P()),
                                 out_specs=spec))
    x = put(mesh, host, spec)
    table = put(mesh, sent, P())
    with mock.patch.dict(os.environ, {"JAXCC_EXCHANGE": start_path}):  # read at lowering
      handle = start(x, table)
    with mock.patch.dict(os.environ, {"JAXCC_EXCHANGE": done_path}):
      outs = done(handle, x, table)
    for shard in zip(*(s.addressable_shards for s in outs)):
      got, twin, status, want_status, lost = (np.asarray(a.data) for a in shard)
      assert got.tobytes() == twin.tobytes(), (dtype, n, codec, start_path, done_path)
      np.testing.assert_array_equal(status, want_status)
      assert not lost.any()


def independent(mesh, runs):
  """Independent collectives in one program, mixed with XLA's, dispatched ``runs`` times
  alternately with a second program of native collectives.

  Nothing orders them by data but jaxcc's chain of native calls, so XLA:CPU's
  thread pool may start them in any order on each device; every process must
  still meet its peers in the same call, in every run, and run the programs
  in the order they were dispatched.
  """
  ring = tuple((r, (r + 1) % P_ALL) for r in range(P_ALL))

  def body(executor, a, b, c, d, e, f, g):
    kw = dict(executor=executor)
    def step(h, _):
      return jaxcc.all_reduce(h, "x", algorithm="direct", **kw) * 0.5, None
    return (jaxcc.all_reduce(a, "x", algorithm="ring", **kw),
            lax.psum(b, "x"),
            jaxcc.reduce_scatter(c, "x", algorithm="ring", **kw),
            jaxcc.all_gather(d, "x", tiled=True, algorithm="direct", **kw),
            lax.all_gather(e, "x", tiled=True),
            jaxcc.ppermute(f, "x", ring, **kw),
            lax.scan(step, g, None, length=2)[0],
            jaxcc.broadcast(a, "x", root=ROOT, **kw),
            jaxcc.all_reduce(g, "x", algorithm="optcc", **kw),
            *(jaxcc.all_reduce(a * k, "x", algorithm="ring", **kw) for k in range(2, 8)))

  def other(executor, a, f):  # a second program, dispatched between the first's runs
    kw = dict(executor=executor)
    return (jaxcc.all_gather(f, "x", tiled=True, algorithm="ring", **kw),
            jaxcc.all_reduce(a, "x", algorithm="direct", **kw))

  rng = np.random.default_rng(9)
  sizes = [P_ALL * n for n in (30001, 77, 6400, 5, 9, 30003, 250)]
  xs = [put(mesh, rng.normal(size=(n,)).astype(np.float32), P("x")) for n in sizes]
  programs = []
  for fn, n_in, n_out in ((body, 7, 15), (other, 2, 2)):
    programs.append([jax.jit(jax.shard_map(lambda *v, e=e, fn=fn: fn(e, *v), mesh=mesh,
                                           in_specs=(P("x"),) * n_in,
                                           out_specs=(P("x"),) * n_out, check_vma=False))
                     for e in ("native", "xla")])
  (f, twin), (g, g_twin) = programs
  want = [shards(y) for y in twin(*xs)]
  g_want = [shards(y) for y in g_twin(xs[0], xs[5])]
  outs = []
  for _ in range(runs):  # dispatched without waiting in between
    outs += [(f(*xs), want), (g(xs[0], xs[5]), g_want)]
  for i, (got, expected) in enumerate(outs):
    for j, (y, w) in enumerate(zip(got, expected)):
      assert all(v.tobytes() == w[k].tobytes() for k, v in shards(y).items()), (
          f"execution {i}, output {j}: native != xla")
  print(f"OK {runs} runs", flush=True)
  jax.distributed.shutdown()
  sys.exit(0)


def kill(mesh):
  f = jax.jit(jax.shard_map(lambda b: jaxcc.all_reduce(b, "x", algorithm="ring",
                                                       executor="native"),
                            mesh=mesh, in_specs=P("x"), out_specs=P()))
  x = put(mesh, np.ones((P_ALL * 100,), np.float32), P("x"))
  f(x).block_until_ready()
  if PID == NPROC - 1:
    os._exit(0)
  start = time.monotonic()
  try:
    f(x).block_until_ready()
  except jax.errors.JaxRuntimeError as e:
    print(f"FAILED after {time.monotonic() - start:.1f} s: {e}", flush=True)
    # Stay connected a moment: a survivor that left at once could be the first
    # loss another survivor sees, instead of the killed process.
    time.sleep(3)
    os._exit(0)  # the job lost a process: skip jax.distributed's shutdown barrier
  print("NO ERROR", flush=True)
  os._exit(1)


def main():
  start = time.monotonic()
  mesh = jax.make_mesh((P_ALL,), ("x",))
  if MODE == "kill":
    kill(mesh)
  if MODE == "independent":
    independent(mesh, int(os.environ.get("RUNS", "50")))
  check_every_collective(mesh)
  check_pipelined(mesh)
  check_codecs(mesh)
  check_2d_mesh_in_scan((2, P_ALL // 2))
  check_2d_mesh_in_scan((P_ALL // 2, LDEV))
  check_hierarchical()
  check_back_to_back(mesh)
  check_gossip_exchange(mesh)
  check_different_schedules(mesh)  # last: the failed call fails every later one
  assert _jaxcc_cpu.tcp_process() == PID, "the TCP transport did not start"
  print(f"OK in {time.monotonic() - start:.1f} s", flush=True)
  jax.distributed.shutdown()


if __name__ == "__main__":
  main()
