"""The gossip exchange's host path from GPU programs: what two processes on one GPU can check.

Run by tests/gpu/run.sh on a machine with a CUDA GPU (``--platform cpu`` runs
the same check on the CPU, the host path forced, where there is none).

The script launches itself as 2 ``jax.distributed`` processes (``jaxcc.launcher``)
that share the GPU (no preallocation), a mesh axis of 2 ranks, one device
each. No NCCL is involved: the exchange's host callbacks copy the device
arrays to host memory, jaxcc's TCP transport moves them, and the pieces come
back to the device. Checked:

1. every dtype the exchange takes, odd sizes, with and without codecs, NaN
   payloads, infinities, -0.0 and subnormals: what arrives equals what the
   peer sent, bit for bit (the twin is the peer's numpy array: XLA's own
   ppermute across processes sharing one GPU is NCCL's, which rejects a
   device shared by two ranks);
2. a start in one program and its done in a later one (the overlap), and a
   message left out on one side arrives as none on the other;
3. what one exchange costs: start plus done of 1, 16 and 64 MiB float32 on the
   GPU, against the same exchange of host arrays on the CPU in the same
   processes, median of 7 (printed; the GPU's extra is the device-host copies).
"""

import argparse
import functools
import json
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # tests/: shared data


def launch(platform: str) -> int:
  from jaxcc.launcher import launch as run
  env = {"JAX_PLATFORMS": "cpu" if platform == "cpu" else f"{platform},cpu",
         "XLA_PYTHON_CLIENT_PREALLOCATE": "false", "JAXCC_EXCHANGE": "host",
         "JAXCC_TIMEOUT_S": "60"}
  procs = run(__file__, ["--worker", platform], nproc=2, env=env, timeout_s=540)
  for p in procs:
    print(p.stdout, end="")
  results = [p.json() for p in procs]
  failed = [f for r in results for f in r["failures"]]
  for r in results:
    for size, t in r["times"].items():
      print(f"process {r['rank']}: {size} float32: start+done {t['device'] * 1e3:.2f} ms on "
            f"{platform}, {t['cpu'] * 1e3:.2f} ms from the CPU")
  print("check_exchange:", "FAILED " + "; ".join(failed) if failed else "ok")
  return 1 if failed else 0


def worker(platform: str) -> None:
  from jaxcc.launcher import join
  join()
  import jax
  import jax.numpy as jnp
  import numpy as np
  from bitwise import float_data
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from jaxcc._src import gossip_exchange

  me, n = jax.process_index(), 2
  device = jax.local_devices(backend=platform)[0]
  cpu = jax.local_devices(backend="cpu")[0]
  failures, times = [], {}

  @functools.cache
  def programs(platform, codec):
    """The jitted start and done on ``platform``'s mesh of the 2 ranks (recompiled per shape)."""
    mesh = jax.sharding.Mesh(np.array(jax.devices(platform)[:n]), ("x",))
    spec = P("x")

    def begin(x, send_to, recv_from):
      return gossip_exchange.start(x[0], send_to[0], recv_from[0], "x", codec)[None]

    def finish(handle, x):
      got, status, _ = gossip_exchange.done(handle, x[0], 1, n, jnp.sum(x))
      return got, status

    start = jax.jit(jax.shard_map(begin, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec))
    done = jax.jit(jax.shard_map(finish, mesh=mesh, in_specs=(spec, spec),
                                 out_specs=(spec, spec)))
    return start, done, NamedSharding(mesh, spec)

  def exchange(dev, x_local, sends: bool, receives: bool, split: bool, codec=None):
    """Rank me's x to the other rank; (what arrived, its status, seconds) on ``dev``'s mesh."""
    start, done, sharding = programs(dev.platform, codec)

    def put(a):
      return jax.make_array_from_single_device_arrays(
          (n,) + a.shape, sharding, [jax.device_put(a[None], dev)])

    other = 1 - me
    x = put(x_local)
    s, r = put(np.array([other if sends else -1])), put(np.array([other if receives else -1]))
    began = time.perf_counter()
    handle = start(x, s, r)
    if split:  # the done in a program of its own, after the start's has finished
      handle.block_until_ready()
    got, status = done(handle, x)
    got = np.asarray(got.addressable_shards[0].data)[0, 0]
    return got, np.asarray(status.addressable_shards[0].data)[0, 0], time.perf_counter() - began

  rng = np.random.default_rng(5)
  cases = [(np.float32, 1001, None), (np.float32, 4099, "entropy"),
           (jnp.bfloat16, 777, "entropy"), (np.float16, 33, "fixed"), (np.int32, 5, None)]
  for i, (dtype, size, codec) in enumerate(cases):
    data = [rng.integers(-2**31, 2**31, size, dtype=np.int64).astype(np.int32)
            if np.dtype(dtype).kind == "i" else float_data("bits", size, dtype, rng)
            for _ in range(n)]
    quiet = i == len(cases) - 1  # process 1 sends nothing: process 0 expects nothing
    got, status, _ = exchange(device, data[me], sends=not (quiet and me == 1),
                              receives=not (quiet and me == 0), split=i % 2 == 1, codec=codec)
    want_status = 0 if quiet and me == 0 else 1
    if status != want_status:
      failures.append(f"{np.dtype(dtype).name}[{size}]: status {status}, not {want_status}")
    elif want_status and got.tobytes() != np.asarray(data[1 - me]).tobytes():
      failures.append(f"{np.dtype(dtype).name}[{size}]: the piece differs from what was sent")
  for mib in (1, 16, 64):
    x = rng.standard_normal(mib << 18).astype(np.float32)
    row = {}
    for name, dev in (("device", device), ("cpu", cpu)):
      try:
        samples = [exchange(dev, x, True, True, False)[2] for _ in range(8)][1:]
        row[name] = float(np.median(samples))
      except Exception as e:  # noqa: BLE001  a timing the job cannot take is reported, not fatal
        row[name] = float("nan")
        print(f"process {me}: no {name} timing at {mib} MiB: {e}", file=sys.stderr)
    times[f"{mib} MiB"] = row
  print(json.dumps({"rank": me, "failures": failures, "times": times}), flush=True)
  os._exit(0)  # no shutdown barrier needed: both processes end here


if __name__ == "__main__":
  parser = argparse.ArgumentParser()
  parser.add_argument("--platform", default="cuda", help="cuda (default) or cpu")
  parser.add_argument("--worker", metavar="PLATFORM")
  args = parser.parse_args()
  if args.worker:
    worker(args.worker)
  else:
    sys.exit(launch(args.platform))
