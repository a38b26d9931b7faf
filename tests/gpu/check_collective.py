"""jaxcc_collective on the GPU (the Nccl transport): what one device can check.

Run by tests/gpu/run.sh on a machine with a CUDA GPU.

A multi-rank run on ONE GPU is impossible with NCCL: a communicator whose ranks
share a device is rejected ("Duplicate GPU detected", ncclInvalidUsage), in one
process or several. So with one GPU this checks:

1. the module has the transport and libnccl.so.2 loads;
2. the handler itself, called with p = 1 (an empty schedule): the bootstrap
   makes a 1-rank communicator, XLA decodes the binding (stream, scratch,
   device ordinal, every attribute), the handler finds the communicator and
   copies x to y and the order token; a wrong comm_key, nranks or table
   header is a clear error, not a crash;
3. every collective with executor="native" on a 1-device mesh against lax,
   and a jitted program that runs two of them in a row;
4. with two or more GPUs, the real multi-rank path: each collective, several
   dtypes and sizes, native against lax (reduce sums in jaxcc's canonical order,
   so compared with a tolerance for floats, exactly for ints and gathers), and
   with codec="fixed" / "entropy" (pieces encoded on the device, sizes then
   bytes over NCCL, fused reduce hops) against the same algorithm raw, bit
   for bit.

The kernels the transport enqueues (cudaMemcpyAsync and jaxcc_reduce's
kernels through ReduceOnCudaStream) are checked against their CPU twins by
check_reduce.py.
"""

import pathlib
import sys
import traceback

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # tests/: shared data
from bitwise import float_data  # noqa: E402

import jaxcc
from jaxcc._src import ffi as jffi
from jaxcc._src import nccl_bootstrap

failures = []
# The serialized table of a 1-rank schedule: the header and no rows.
EMPTY_TABLE = jaxcc.plan("all_reduce", 4, jaxcc.Topology.uniform(1, 1.0), "ring").serialized


def check(name, fn):
  try:
    fn()
    print(f"ok   {name}")
  except Exception:  # pylint: disable=broad-except
    failures.append(name)
    print(f"FAIL {name}")
    traceback.print_exc()


def transport_available():
  assert jffi._jaxcc_cuda.has_nccl(), "the CUDA module was built without the Nccl transport"
  reason = nccl_bootstrap.unavailable()
  assert reason is None, reason


def call(x, key, nranks=1, table=EMPTY_TABLE):
  fn = jax.ffi.ffi_call(
      "jaxcc_collective",
      (jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct((), jnp.int32)),
      has_side_effect=True)
  none = np.zeros((0,), np.int64)
  return fn(x, jnp.int32(0), jnp.int32(0), jnp.int32(41), table=table, num_steps=np.int64(0),
            nranks=np.int64(nranks), op_id=np.int64(1), digest=np.int64(0), name="check",
            procs=none, pacing=none, comm_key=np.int64(key), codec=np.int64(0))


def handler_one_rank():
  gpu = jax.devices("gpu")[0]
  mesh = jax.make_mesh((1,), ("x",), devices=[gpu])
  key = nccl_bootstrap.ensure_comms(mesh, "x", ())
  x = jax.device_put(jnp.arange(1000, dtype=jnp.float32), gpu)
  y, order = jax.jit(lambda v: call(v, key))(x)
  assert np.array_equal(np.asarray(y), np.asarray(x)), "y != x"
  assert int(order) == 41, f"order token {int(order)}"
  for bad, what in ((lambda v: call(v, key + 1), "no NCCL communicator"),
                    (lambda v: call(v, key, nranks=2), "ranks"),
                    (lambda v: call(v, key, table=np.zeros((0,), np.int64)),
                     "schedule table magic/version mismatch: rebuild jaxcc")):
    try:
      jax.block_until_ready(jax.jit(bad)(x))
    except Exception as e:  # pylint: disable=broad-except
      assert what in str(e), f"unexpected error: {e}"
    else:
      raise AssertionError(f"no error for a bad call ({what})")


def collectives(devices, dtypes, sizes, rtol):
  p = len(devices)
  mesh = jax.make_mesh((p,), ("x",), devices=devices)
  rng = np.random.default_rng(0)
  cases = {
      "all_reduce": (lambda v: jaxcc.all_reduce(v, "x", executor="native"),
                     lambda v: lax.psum(v, "x"), P("x"), P("x")),
      "reduce_scatter": (lambda v: jaxcc.reduce_scatter(v, "x", executor="native"),
                         lambda v: lax.psum_scatter(v, "x", tiled=True), P("x"), P("x")),
      "all_gather": (lambda v: jaxcc.all_gather(v, "x", executor="native"),
                     lambda v: lax.all_gather(v, "x", tiled=True), P("x"), P("x")),
      "broadcast": (lambda v: jaxcc.broadcast(v, "x", root=p - 1, executor="native"),
                    lambda v: lax.all_gather(v, "x")[p - 1], P("x"), P("x")),
  }
  for dt in dtypes:
    for n in sizes:
      n = n * p
      if jnp.issubdtype(dt, jnp.floating):
        host = rng.normal(size=(p * n,)).astype(dt)
      else:
        host = rng.integers(-100, 100, size=(p * n,)).astype(dt)
      xs = jax.device_put(host, NamedSharding(mesh, P("x")))
      for name, (ours, ref, spec_in, spec_out) in cases.items():
        run = lambda f: np.asarray(jax.jit(jax.shard_map(  # noqa: E731
            f, mesh=mesh, in_specs=spec_in, out_specs=spec_out, check_vma=False))(xs))
        got, want = run(ours), run(ref)
        what = f"{name} p={p} {jnp.dtype(dt).name} n={n}"
        assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
        exact = name in ("all_gather", "broadcast") or not jnp.issubdtype(dt, jnp.floating)
        if exact:
          assert got.tobytes() == want.tobytes(), f"{what}: not bit-identical"
        else:
          np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32),
                                     rtol=rtol[jnp.dtype(dt).name], atol=1e-2, err_msg=what)


def coded_collectives(devices, sizes):
  """Every collective with codec= against the same algorithm raw: the codecs are lossless and the
  sums run in the same order, so the bits are the same; adversarial data included."""
  p = len(devices)
  mesh = jax.make_mesh((p,), ("x",), devices=devices)
  rng = np.random.default_rng(1)
  kinds = ("normal", "special", "sparse")
  for name in ("all_reduce", "reduce_scatter", "all_gather", "broadcast"):
    fn = getattr(jaxcc, name)
    extra = {"root": p - 1} if name == "broadcast" else {}
    for algorithm in ("ring", "direct"):
      for dt in ("bfloat16", "float16", "float32"):
        for n in sizes:
          n = n * p  # per rank: p tiles for reduce_scatter
          host = np.concatenate([float_data(kinds[r % 3], n, dt, rng) for r in range(p)])
          xs = jax.device_put(host, NamedSharding(mesh, P("x")))
          outs = []
          for codec in (None, "fixed", "entropy"):
            body = lambda v, codec=codec: fn(v, "x", algorithm=algorithm, executor="native",
                                             codec=codec, **extra)
            outs.append(np.asarray(jax.jit(jax.shard_map(
                body, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False))(xs)))
          what = f"{name} {algorithm} p={p} {dt} n={n}"
          for codec, got in zip(("fixed", "entropy"), outs[1:]):
            assert got.tobytes() == outs[0].tobytes(), f"{what} codec={codec}: not bit-identical"


def two_in_a_row():
  gpu = jax.devices("gpu")[0]
  mesh = jax.make_mesh((1,), ("x",), devices=[gpu])

  def body(v):
    return jaxcc.all_gather(jaxcc.all_reduce(v, "x", executor="native"), "x",
                            executor="native")

  x = np.arange(4096, dtype=np.float32)
  xs = jax.device_put(x, NamedSharding(mesh, P("x")))
  got = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                              check_vma=False))(xs)
  assert np.array_equal(np.asarray(got), x)


def main():
  gpus = jax.devices("gpu")
  print(f"{len(gpus)} GPU(s): {gpus}")
  check("Nccl transport built and libnccl.so.2 loaded", transport_available)
  if failures:
    raise SystemExit(1)
  check("jaxcc_collective, 1 rank (empty schedule) and bad calls", handler_one_rank)
  rtol = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 2e-3}
  check("collectives, 1 device, native vs lax",
        lambda: collectives(gpus[:1], (jnp.float32, jnp.int32), (1, 1000), rtol))
  check("two native collectives in one program", two_in_a_row)
  if len(gpus) >= 2:
    check(f"collectives, {len(gpus)} devices, native vs lax",
          lambda: collectives(gpus, (jnp.float32, jnp.bfloat16, jnp.int32),
                              (1, 1000, 1 << 18), rtol))
    check(f"coded collectives over Nccl, {len(gpus)} devices, codec vs raw",
          lambda: coded_collectives(gpus, (1, 1000, 70000, 1 << 18)))
  else:
    print("skip multi-rank (and the coded Nccl steps, which need a peer): one GPU (NCCL "
          "rejects two ranks on one device); check_piece.py covers their kernels")
  print(f"collective: {'all passed' if not failures else f'{len(failures)} failed: {failures}'}")
  raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
  main()
