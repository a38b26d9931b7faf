"""Planning at cluster scale: plan, price, simulate and prove all_reduce schedules up to 4,096 ranks.

Three tables, measured in one run:

  1. Per p (uniform 25 GB/s ports, rank 1 at 0.5, 256 MiB per rank, planner
     caches cleared): the form (direct, or the grid from 512 owners on), depth
     and transfers of the OptCC schedule at the default depth on ports of the
     TCP transport's message cost (``topology.MESSAGE_COST``), the time to
     plan it (build and validate), to price "auto"'s candidates, to simulate
     and to prove it (``sim.check``, up to ``--max-check-ranks``), the bytes
     of schedule data the busiest rank's executor receives
     (``Schedule.serialized_for``), and its time over the lower bound (which
     charges one message cost per port); then the same without message costs
     (the fluid model: ``planner.depth`` is then the per-rank transfer
     limit); and what one process plans for the busiest rank alone
     (``planner.rank_schedule``, ``rank_local``: its rows, seconds and peak
     memory at both depths, against the whole table's size).
  2. OptCC over the bound (charging the same message cost) at the default
     depth, for 1 to 3 stragglers (0.5, 0.75, 0.3): in the fluid model, at
     5 us latency, and at 5 us a message; where the table at that depth is
     too large to simulate, the model's ratio and the simulator's at the
     deepest depth it can hold.
  3. Trace plus compile time of ``jaxcc.all_reduce`` on 64 virtual CPU devices
     (``algorithm="auto"``, with and without a straggler in its topology, and
     explicit native schedules) against ``lax.psum``, best of 3 from cleared
     caches.

Beyond ``--max-simulate`` transfers a schedule is not simulated (the event
loop holds every transfer in memory) and its time is the closed-form model's
(``jaxcc.sim.model``), marked "model". Writes ``planning_scale.json`` next to
this file (or ``--json``). Run: ``.venv/bin/python benchmarks/planning_scale.py``
(``--ps 8 64 256`` for a quick run; the whole run takes about 12 minutes and
9 GiB on 2 cores). ``--rank-local-only`` prints the rank-local planning alone
(p = 64 to 4,096 in seconds) and writes nothing.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import resource
import time
import tracemalloc

from jaxcc._src.devices import use_virtual_cpu_devices

use_virtual_cpu_devices(64)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import jaxcc  # noqa: E402
from jaxcc import Topology, planner  # noqa: E402
from jaxcc.schedules.ir import DST, HEADER_LEN, NUM_COLUMNS, SRC  # noqa: E402
from jaxcc.schedules import optcc  # noqa: E402
from jaxcc.sim import check, lower_bound, simulate  # noqa: E402
from jaxcc.sim import model  # noqa: E402
from jaxcc.sim.model import model_time, optcc_min_owners  # noqa: E402
from jaxcc.topology import MESSAGE_COST  # noqa: E402

MiB = 1 << 20
NBYTES = 256 * MiB
BANDWIDTH = 25e9
STRAGGLERS = ((1, 0.5), (None, 0.75), (-1, 0.3))  # None: p // 2; -1: p - 1


def topology(p: int, count: int = 1, latency: float = 0.0,
             message_cost: float = MESSAGE_COST) -> Topology:
  topo = Topology.uniform(p, BANDWIDTH, latency, message_cost)
  for rank, fraction in STRAGGLERS[:count]:
    topo = topo.with_straggler({None: p // 2, -1: p - 1}.get(rank, rank), fraction)
  return topo


def clear_caches():
  for cache in (planner._build, planner._part, planner._cheapest, planner._depth,
                planner._optcc_lags, optcc._grid_layout, model.optcc_min_owners):
    cache.cache_clear()


def timed(fn):
  start = time.perf_counter()
  out = fn()
  return out, time.perf_counter() - start


def over_bound(sched, topo, max_simulate):
  """(time / bound, simulate seconds or None, "sim" or "model")."""
  bound = lower_bound("all_reduce", NBYTES, topo)
  if len(sched.table) <= max_simulate:
    result, seconds = timed(lambda: simulate(sched, topo))
    return result.time / bound, seconds, "sim"
  t = model_time("all_reduce", sched.algorithm, NBYTES, topo, sched.chunks)
  return t / bound, None, "model"


def rank_data_bytes(sched) -> int:
  """Bytes of ``serialized_for([r])`` for the rank with the most transfers."""
  rows = np.bincount(sched.table[:, SRC], minlength=sched.nranks) + np.bincount(
      sched.table[:, DST], minlength=sched.nranks)
  return 8 * (HEADER_LEN + NUM_COLUMNS * int(rows.max()))


def form(topo) -> str:
  """The form of the OptCC schedule the planner builds for ``NBYTES`` on ``topo``."""
  owners = optcc_min_owners(NBYTES, topo)
  return "direct" if optcc.grid_layout(topo.bandwidth, owners) is None else "grid"


def messages(topo) -> np.ndarray:
  """Per rank, the transfers it sends per chunk in the planner's OptCC schedule."""
  return optcc.messages_per_chunk(topo.bandwidth, optcc_min_owners(NBYTES, topo))


def at_default_depth(p, count, latency, message_cost, max_simulate):
  """OptCC at the default depth: a dict of its form, depth, transfers, times and ratio; where
  its table would exceed ``max_simulate`` transfers, the model's ratio and the whole table
  planned and simulated at the deepest depth within it."""
  topo = topology(p, count, latency, message_cost)
  clear_caches()
  chunks = planner.depth("all_reduce", NBYTES // 4, 4, topo, "optcc")
  per_chunk = int(messages(topo).sum())
  k = chunks
  while k > 1 and per_chunk * k > max_simulate:
    k //= 2
  sched, plan_s = timed(lambda: planner.plan("all_reduce", NBYTES, topo, "optcc", chunks=k))
  ratio, sim_s, how = over_bound(sched, topo, max_simulate)
  rank_rows = (rank_data_bytes(sched) - 8 * HEADER_LEN) * chunks // k  # rows grow with depth
  out = dict(form=form(topo), chunks=chunks, transfers=len(sched.table) * chunks // k,
             plan_s=plan_s,
             simulate_s=sim_s, rank_table_bytes=rank_rows + 8 * HEADER_LEN,
             time_over_bound=ratio, timed_by=how)
  if k < chunks:
    out.update(simulated_chunks=k, simulated_over_bound=ratio, timed_by="model",
               time_over_bound=model_time("all_reduce", "optcc", NBYTES, topo, chunks)
               / lower_bound("all_reduce", NBYTES, topo))
  del sched
  clear_caches()
  return out


def rank_local(p: int) -> dict:
  """The busiest rank's part of the OptCC schedule as its process plans it alone
  (``planner.rank_schedule``), at the planner's depth and at the fluid model's (``planner.depth``
  on the topology without message costs): depth, rows, steps, seconds and peak traced memory
  from cleared caches, and the MiB of the whole table it does not build (closed form)."""
  out = {}
  for name, topo in (("planner", topology(p)), ("fluid", topology(p, message_cost=0.0))):
    per_chunk = messages(topo)
    rank = int(np.argmax(per_chunk))
    chunks = planner.depth("all_reduce", NBYTES // 4, 4, topo, "optcc")
    plan = lambda: planner.rank_schedule("all_reduce", NBYTES // 4, 4, topo, "optcc", [rank],
                                         chunks=chunks)
    clear_caches()
    part, seconds = timed(plan)
    clear_caches()
    tracemalloc.start()
    plan()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    out[name] = dict(rank=rank, chunks=chunks, rows=len(part.table), steps=part.num_steps,
                     plan_s=seconds, peak_mib=peak / MiB,
                     table_mib=int(per_chunk.sum()) * chunks * 8 * NUM_COLUMNS / MiB)
  clear_caches()
  return out


def print_rank_local(ps) -> list[dict]:
  print("the busiest rank's part of optcc planned alone (planner.rank_schedule), at the "
        "planner's depth | at the fluid depth")
  print(f"{'p':>5} {'rank':>5} " + " | ".join(
      [f"{'K':>4} {'rows':>7} {'steps':>6} {'plan s':>7} {'peak':>9} {'table':>10}"] * 2))
  rows = []
  for p in ps:
    row = rank_local(p)
    rows.append(dict(p=p, **row))
    print(f"{p:>5} {row['planner']['rank']:>5} " + " | ".join(
        f"{r['chunks']:>4} {r['rows']:>7,} {r['steps']:>6} {r['plan_s']:>7.3f} "
        f"{r['peak_mib']:>6.1f}MiB {r['table_mib']:>7.0f}MiB"
        for r in (row["planner"], row["fluid"])), flush=True)
  return rows


def scale_row(p, max_simulate, max_check_ranks):
  topo = topology(p)
  clear_caches()
  sched, plan_s = timed(lambda: planner.plan("all_reduce", NBYTES, topo, "optcc"))
  clear_caches()
  _, price_s = timed(lambda: planner.auto_algorithm("all_reduce", NBYTES // 4, 4, topo))
  check_s = timed(lambda: check(sched))[1] if p <= max_check_ranks else None
  ratio, sim_s, how = over_bound(sched, topo, max_simulate)
  row = dict(p=p, form=form(topo),
             chunks=sched.chunks, transfers=len(sched.table), plan_s=plan_s,
             price_s=price_s, auto=planner.auto_algorithm("all_reduce", NBYTES // 4, 4, topo),
             simulate_s=sim_s, check_s=check_s, rank_table_bytes=rank_data_bytes(sched),
             table_bytes=int(sched.serialized.nbytes), time_over_bound=ratio, timed_by=how)
  del sched
  row["fluid"] = at_default_depth(p, 1, 0.0, 0.0, max_simulate)
  row["rank_local"] = rank_local(p)
  row["max_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)
  return row


def compile_times(reps: int = 3) -> list[dict]:
  """Trace + lower + compile seconds of each variant on 64 devices, 1 MiB float32 per rank."""
  mesh = jax.make_mesh((64,), ("x",))
  x = jax.device_put(jnp.zeros((64 * (1 << 18),), jnp.float32),
                     jax.NamedSharding(mesh, jax.P("x")))
  slow = Topology.uniform(64, BANDWIDTH).with_straggler(1, 0.5)
  variants = {
      "lax.psum": lambda v: lax.psum(v, "x"),
      "auto": lambda v: jaxcc.all_reduce(v, "x"),
      "auto, straggler topology": lambda v: jaxcc.all_reduce(v, "x", topology=slow),
      "auto, executor=native": lambda v: jaxcc.all_reduce(v, "x", executor="native"),
      "optcc, executor=native": lambda v: jaxcc.all_reduce(v, "x", algorithm="optcc",
                                                           executor="native", topology=slow),
  }
  rows = []
  for name, fn in variants.items():
    best = float("inf")
    for _ in range(reps):
      jax.clear_caches()
      clear_caches()
      f = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=jax.P("x"), out_specs=jax.P("x"),
                                check_vma=False))
      best = min(best, timed(lambda: f.trace(x).lower().compile())[1])
    rows.append(dict(variant=name, seconds=best))
  base = rows[0]["seconds"]
  for row in rows:
    row["over_psum"] = row["seconds"] / base
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--ps", type=int, nargs="+", default=[8, 64, 256, 1024, 4096])
  parser.add_argument("--max-simulate", type=int, default=40_000_000,
                      help="simulate schedules of at most this many transfers")
  parser.add_argument("--max-check-ranks", type=int, default=1024,
                      help="prove schedules of at most this many ranks (sim.check holds "
                           "p x segments x p bits)")
  parser.add_argument("--json", type=pathlib.Path,
                      default=pathlib.Path(__file__).with_name("planning_scale.json"))
  parser.add_argument("--rank-local-only", action="store_true",
                      help="only the rank-local planning table, for p of 64 and more")
  args = parser.parse_args()
  if args.rank_local_only:
    print_rank_local([p for p in args.ps if p >= 64])
    return

  print(f"all_reduce of {NBYTES // MiB} MiB, {BANDWIDTH / 1e9:g} GB/s ports, rank 1 at 0.5; "
        f"optcc at the default depth, with the TCP transport's message cost, then without")
  print(f"{'p':>5} {'form':>6} {'K':>4} {'transfers':>11} {'plan s':>7} {'price s':>8} "
        f"{'sim s':>7} {'check s':>8} {'rank data':>10} {'table':>10} {'t/bound':>8} | "
        f"{'K':>4} {'transfers':>11} {'plan s':>7} {'sim s':>7} {'rank data':>10} "
        f"{'t/bound':>8}")
  rows = []
  fmt = lambda v: "-" if v is None else f"{v:.3f}"
  for p in args.ps:
    row = scale_row(p, args.max_simulate, args.max_check_ranks)
    rows.append(row)
    f = row["fluid"]
    print(f"{p:>5} {row['form']:>6} {row['chunks']:>4} {row['transfers']:>11,} "
          f"{row['plan_s']:>7.2f} {row['price_s']:>8.4f} {fmt(row['simulate_s']):>7} "
          f"{fmt(row['check_s']):>8} {row['rank_table_bytes'] / MiB:>7.2f}MiB "
          f"{row['table_bytes'] / MiB:>7.0f}MiB {row['time_over_bound']:>8.4f} | "
          f"{f['chunks']:>4} {f['transfers']:>11,} {f['plan_s']:>7.2f} "
          f"{fmt(f['simulate_s']):>7} {f['rank_table_bytes'] / MiB:>7.2f}MiB "
          f"{f['time_over_bound']:>8.4f} {f['timed_by']}", flush=True)
  print()
  print_rank_local([row["p"] for row in rows])

  print("\noptcc / lower bound (with the same message cost) at the default depth, 1 to 3 "
        "stragglers at 0.5, 0.75, 0.3: the fluid model, 5 us latency, 5 us a message")
  fluid_rows = []
  for p in [p for p in args.ps if p >= 64] or args.ps[-1:]:
    for latency, cost in ((0.0, 0.0), (5e-6, 0.0), (0.0, 5e-6)):
      cells = []
      for count in (1, 2, 3):
        known = next((r["fluid"] for r in rows if r["p"] == p), None)
        f = known if count == 1 and latency == cost == 0 and known else at_default_depth(
            p, count, latency, cost, args.max_simulate)
        fluid_rows.append(dict(p=p, latency=latency, message_cost=cost, stragglers=count, **f))
        simulated = (f" sim {f['simulated_over_bound']:.4f} at K={f['simulated_chunks']}"
                     if "simulated_chunks" in f else "")
        cells.append(f"{f['time_over_bound']:.4f} ({f['timed_by']}, {f['form']} "
                     f"K={f['chunks']}{simulated})")
      print(f"  p={p:<5} latency {latency * 1e6:g} us, message {cost * 1e6:g} us: "
            + "   ".join(cells), flush=True)

  print("\ntrace + compile on 64 virtual CPU devices, 1 MiB float32 per rank (best of 3)")
  compiles = compile_times()
  for row in compiles:
    print(f"  {row['variant']:<26} {row['seconds'] * 1e3:8.0f} ms  {row['over_psum']:5.2f}x "
          f"lax.psum", flush=True)

  args.json.write_text(json.dumps({"nbytes": NBYTES, "bandwidth": BANDWIDTH, "scale": rows,
                                   "optcc_over_bound": fluid_rows, "compile": compiles},
                                  indent=1))
  print(f"wrote {args.json}")


if __name__ == "__main__":
  main()
