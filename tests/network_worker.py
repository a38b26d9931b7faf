"""A loop of jaxcc.all_reduce in MeasuredNetwork.jit on the testbed (tests/test_network.py).

Usage: ``python network_worker.py CONFIG_JSON`` with ``{"calls", "fault", "progress"}``:
before call ``fault`` process 0 writes it to ``progress`` and every process waits
a second (the parent changes a link meanwhile). Every result is checked against
numpy. Prints ``{"process", "events", "send_bandwidth", "seconds", "traced"}`` (the send
bandwidths of each topology a trace planned on). With ``{"probes": n}`` instead it runs
``n`` probes back to back and prints ``{"process", "probe_seconds"}``.
"""

import json
import sys
import time

import jax
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxcc
from jaxcc.launcher import join
from jaxcc.network import active, native_probe


def main():
  cfg = json.loads(sys.argv[1])
  join()
  me, n = jax.process_index(), jax.process_count()
  if "probes" in cfg:
    seconds = [native_probe.probe().seconds for _ in range(cfg["probes"])]
    print(json.dumps({"process": me, "probe_seconds": seconds}), flush=True)
    jax.distributed.shutdown()
    return
  mesh = jax.make_mesh((n,), ("x",))
  net = jaxcc.network.MeasuredNetwork(mesh, "x", budget=0.05)
  traced = []

  def body(b):
    traced.append(active.topology("x"))  # the topology this trace plans on
    return jaxcc.all_reduce(b, "x")

  step = net.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
  line_up = jax.jit(jax.shard_map(lambda b: lax.psum(b[:, :1], "x"), mesh=mesh,
                                  in_specs=P("x"), out_specs=P("x")))
  size = (2 << 20) // 4 + 3
  rng = np.random.default_rng(0)
  seconds = []
  for i in range(cfg["calls"]):
    data = rng.integers(-1000, 1000, (n, size)).astype(np.float32)
    x = jax.make_array_from_callback((n, size), NamedSharding(mesh, P("x")),
                                     lambda idx, d=data: d[idx])
    if i == cfg["fault"]:
      if me == 0:
        with open(cfg["progress"], "a") as f:
          f.write(f"{i}\n")
      time.sleep(1.0)
      line_up(x).block_until_ready()
    began = time.perf_counter()
    y = step(x)
    got = np.asarray(y.addressable_shards[0].data)[0]
    seconds.append(time.perf_counter() - began)
    np.testing.assert_array_equal(got, data.sum(0))
  print(json.dumps({"process": me, "events": [(e.step, e.kind, e.why) for e in net.events],
                    "send_bandwidth": net.topology.send_bandwidth, "seconds": seconds,
                    "traced": [t.send_bandwidth for t in traced]}),
        flush=True)
  jax.distributed.shutdown()


if __name__ == "__main__":
  main()
