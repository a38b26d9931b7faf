"""One process of tests/test_testbed.py, started by jaxcc.testbed.launch in its namespace.

Usage: python tests/testbed_worker.py BANDWIDTHS_JSON SIZE REPS

lax.psum and jaxcc's native optcc all_reduce (planned for the cluster's
bandwidths, bytes/s) of SIZE f32 per process, REPS timed runs each after a
warm-up; checks both against the exact sum and prints one JSON line: the
median seconds of each.
"""

import json
import os
import sys
import time

import jax

jax.distributed.initialize(os.environ["JAXCC_TESTBED_COORDINATOR"],
                           int(os.environ["JAXCC_TESTBED_NUM_PROCESSES"]),
                           int(os.environ["JAXCC_TESTBED_PROCESS_ID"]),
                           initialization_timeout=60)

import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxcc  # noqa: E402


def main():
  bandwidths, size, reps = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
  n, me = jax.process_count(), jax.process_index()
  topology = jaxcc.Topology.from_bandwidths(bandwidths)
  mesh = jax.make_mesh((n,), ("x",))
  # Integers in f32: every summation order gives the exact sum.
  host = np.arange(n * size, dtype=np.float32).reshape(n, size) % 1000
  x = jax.make_array_from_callback(host.shape, NamedSharding(mesh, P("x")), lambda i: host[i])
  expected = host.sum(0, keepdims=True)
  fns = {"psum": lambda b: lax.psum(b, "x"),
         "optcc": lambda b: jaxcc.all_reduce(b, "x", executor="native", algorithm="optcc",
                                             topology=topology)}
  result = {"rank": me}
  for name, fn in fns.items():
    f = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("x"), out_specs=P()))
    times = []
    for _ in range(reps + 1):
      start = time.perf_counter()
      y = np.asarray(f(x).addressable_shards[0].data)
      times.append(time.perf_counter() - start)
      np.testing.assert_array_equal(y, expected, err_msg=f"{name} on process {me}")
    result[name] = float(np.median(times[1:]))
  print(json.dumps(result), flush=True)
  jax.distributed.shutdown()


if __name__ == "__main__":
  main()
