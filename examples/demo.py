"""jaxcc in one screen: all_reduce under a straggler, measured on an emulated network.

Where network namespaces can be made (as root, or as any user through an
unprivileged user namespace: ``jaxcc.testbed``), 4 processes of one CPU device
each run on 4 emulated hosts joined by real TCP over veths shaped by ``tc``,
one host at half rate. psum (XLA's, over gloo), jaxcc's ring and OptCC
all-reduce the same float32 buffer; each is timed for real and every result
checked against the exact sum, beside the lower bound and the simulator's
prediction on that network. Where no namespace can be made, the simulator
prices each algorithm on an 8-rank network instead, and says why.

Either way, every algorithm first runs on 8 virtual CPU devices of this
process and is checked against ``lax.psum``.

Run: ``make demo`` (or ``.venv/bin/python examples/demo.py [--mib 4]``).
"""

import argparse

from jaxcc._src.devices import use_virtual_cpu_devices

use_virtual_cpu_devices(8)

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxcc  # noqa: E402
from jaxcc import testbed  # noqa: E402
from jaxcc.bench import collective  # noqa: E402
from jaxcc.sim.bounds import fault_free_ring_time  # noqa: E402

ALGORITHMS = ("ring", "direct", "r2ccl", "optcc", "auto")
HOSTS, RATE, SLOW_HOST, FRACTION = 4, "200mbit", 3, 0.5  # the emulated network
P_RANKS, STRAGGLER, LINK = 8, 5, 25e9                     # the simulated one: 200 Gb/s ports
SIM_BYTES = 256 << 20


def check_against_psum() -> None:
  """Every algorithm on 8 virtual CPU devices equals lax.psum (raises if one does not)."""
  mesh = jax.make_mesh((P_RANKS,), ("x",))
  topo = jaxcc.Topology.uniform(P_RANKS, LINK, latency=5e-6).with_straggler(STRAGGLER, FRACTION)
  x = jax.device_put(np.random.default_rng().normal(size=(8 * 1024, 257)).astype(np.float32),
                     NamedSharding(mesh, P("x")))

  def run(fn):
    return np.asarray(jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("x"), out_specs=P()))(x))

  want = run(lambda b: jax.lax.psum(b, "x"))
  worst = 0.0
  for algorithm in ALGORITHMS:
    got = run(lambda b: jaxcc.all_reduce(b, "x", algorithm=algorithm, topology=topo))
    if not np.allclose(got, want, rtol=1e-5, atol=1e-4):
      raise SystemExit(f"{algorithm}: result differs from lax.psum")
    worst = max(worst, float(np.abs(got - want).max()))
  print(f"{', '.join(ALGORITHMS)} on {P_RANKS} virtual CPU devices: equal to lax.psum "
        f"(max |diff| {worst:.2e})")


def measured(mode: str, mib: int) -> None:
  """psum, ring and OptCC timed on the emulated network; the table says what is measured."""
  print(f"{HOSTS} emulated hosts ({mode} mode), {RATE} links, host {SLOW_HOST} at "
        f"{FRACTION:.0%}:\nall_reduce of {mib} MiB float32 per host over TCP, median of 3 runs")
  rows = collective.run("all_reduce", HOSTS, mib << 20, rate=RATE,
                        configurations=[{SLOW_HOST: FRACTION}],
                        algorithms=["psum", "ring", "optcc"], repeats=3, testbed=True,
                        progress=False)
  print(f"lower bound {rows[0]['lower_bound_s'] * 1e3:.0f} ms (links calibrated at "
        f"{rows[0]['link_efficiency']:.1%} of their rate)\n")
  print(f"{'algorithm':<10} {'measured':>9} {'/ bound':>8} {'simulated':>10}  checked")
  for r in rows:
    ratio = r["measured_s"] / r["lower_bound_s"]
    print(f"{r['algorithm']:<10} {r['measured_s'] * 1e3:7.0f}ms {ratio:8.3f} "
          f"{r['simulated_s'] * 1e3:8.0f}ms  = exact sum on every host")
  print("\nmeasured: the slowest host's wall time; simulated: jaxcc.sim on the calibrated\n"
        "network. OptCC stays near the bound; the ring and psum wait on the slow host.")


def simulated(reason: str) -> None:
  """Today's network priced by the simulator (no namespaces here)."""
  print(f"simulated only: {reason}\n")
  topo = jaxcc.Topology.uniform(P_RANKS, LINK, latency=5e-6).with_straggler(STRAGGLER, FRACTION)
  bound = jaxcc.sim.lower_bound("all_reduce", SIM_BYTES, topo)
  t_ff = fault_free_ring_time(SIM_BYTES, P_RANKS, LINK)
  print(f"{P_RANKS} ranks, rank {STRAGGLER} at {FRACTION:.0%} of {LINK * 8 / 1e9:.0f} Gb/s; "
        f"simulated all_reduce of {SIM_BYTES >> 20} MiB per rank")
  print(f"lower bound {bound * 1e3:.2f} ms, fault-free ring {t_ff * 1e3:.2f} ms\n")
  print(f"{'algorithm':<10} {'simulated':>10} {'/ bound':>8} {'/ fault-free':>12}")
  for algorithm in ALGORITHMS:
    sched = jaxcc.plan("all_reduce", SIM_BYTES, topo, algorithm)
    t = jaxcc.sim.simulate(sched, topo).time
    name = algorithm if algorithm != "auto" else f"auto:{sched.algorithm}"
    print(f"{name:<10} {t * 1e3:8.2f}ms {t / bound:8.3f} {t / t_ff:12.3f}")


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--mib", type=int, default=4, help="MiB per host on the emulated network")
  args = parser.parse_args()
  check_against_psum()
  print()
  try:
    mode = testbed.mode()
  except RuntimeError as e:
    simulated(str(e))
  else:
    measured(mode, args.mib)


if __name__ == "__main__":
  main()
