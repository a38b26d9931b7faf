"""Gossip DiLoCo against DiLoCo and data parallelism on real text, 8 workers, in one run.

The model, data and training loop are those of ``examples/diloco_train.py``: a
2-layer, 64-wide character transformer, 8 workers on virtual CPU devices, each
on its own contiguous shard of the CPython documentation (non-IID). Every
configuration trains the same initial model on the same batches for the same
number of inner steps:

  data parallelism (gradients all-reduced every step), DiLoCo, gossip DiLoCo on
  each graph with 0, 1 and 2 blocking rounds, the one-peer exponential graph
  with 1 blocking round under 10% and 30% message drops, and with one worker
  failing halfway.

Reported per configuration: the held-out loss of the averaged model and of
the worst worker at the end, the consensus distance, the bytes each worker
sends per round, and the compute utilisation at 100 Mbit/s and 1 Gbit/s. The
utilisation combines the measured compute time of one inner step of one
worker (jitted, alone on this machine) with modelled communication: alpha-beta
with ``LATENCY`` per message and the link's bandwidth, a ring for all-reduces,
overlapped traffic hidden behind the inner step it is sent in (only its excess
stalls), blocking traffic added to the round.

Writes ``diloco_experiment.json`` and ``diloco_experiment.png`` next to this
file (or under ``--out``). Run: ``.venv/bin/python benchmarks/diloco_experiment.py``
(17 trainings of 300 inner steps: 12 CPU-minutes, 14 minutes on 2 shared cores).
"""

from __future__ import annotations

from jaxcc._src.devices import use_virtual_cpu_devices

use_virtual_cpu_devices(8)

import argparse  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from jaxcc import optim  # noqa: E402
from jaxcc.bench import char_transformer, extras  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples"))
import diloco_train as ex  # noqa: E402

SYNC_EVERY = 20
LATENCY = 1e-3                                       # seconds per message
LINKS = {"100 Mbit/s": 100e6 / 8, "1 Gbit/s": 1e9 / 8}  # bytes per second
FAILED_WORKER = 5
ONE_PEER = {"graph": "one_peer_exponential", "blocking_rounds": 1}
HEADLINE = "gossip one_peer_exponential k=1"


def configurations(steps: int):
  """(name, kind, keyword arguments of gossip_diloco) for every run."""
  out = [("data-parallel", "dp", {}), ("diloco", "diloco", {})]
  for graph in optim.GRAPHS:
    for k in (0, 1, 2):
      out.append((f"gossip {graph} k={k}", "gossip", {"graph": graph, "blocking_rounds": k}))
  for drop in (0.1, 0.3):
    out.append((f"{HEADLINE} drop {drop:.0%}", "gossip", {**ONE_PEER, "drop_rate": drop}))
  fail_round = steps // SYNC_EVERY // 2
  out.append((f"{HEADLINE} worker {FAILED_WORKER} fails at round {fail_round}", "gossip",
              {**ONE_PEER, "failed_worker": FAILED_WORKER, "fail_round": fail_round}))
  return out


def optimizer(kind: str, steps: int, kwargs: dict):
  inner = ex.inner_optimizer(steps)
  if kind == "dp":
    return optax.chain(ex.mean_gradients(), inner)
  if kind == "diloco":
    return optax.chain(inner, optim.diloco(ex.AXIS, SYNC_EVERY, algorithm="lax"))
  return optax.chain(inner, optim.gossip_diloco(ex.AXIS, SYNC_EVERY, algorithm="lax", **kwargs))


def inner_step_seconds(trainer: ex.Trainer, repeats: int = 30) -> float:
  """One worker's jitted inner step (gradient + AdamW) on one device: the fastest of ``repeats``.

  The fastest, not the median: other processes share this machine's cores.
  """
  tx = ex.inner_optimizer(trainer.steps)

  @jax.jit
  def step(params, state, windows):
    grads = jax.grad(ex.loss_fn)(params, windows)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  params, state = trainer.params, tx.init(trainer.params)
  windows = jax.numpy.asarray(trainer.batches[0, 0])
  times = []
  for _ in range(repeats + 1):
    start = time.perf_counter()
    params, state = jax.block_until_ready(step(params, state, windows))
    times.append(time.perf_counter() - start)
  return min(times[1:])


def round_cost(kind: str, params, n: int, kwargs: dict) -> optim.RoundCost:
  if kind == "dp":  # one gradient all-reduce per inner step, all blocking
    per_step = optim.diloco_round_cost(params, n)
    return optim.RoundCost(0.0, SYNC_EVERY * per_step.blocking_bytes, 0,
                           SYNC_EVERY * per_step.blocking_messages)
  if kind == "diloco":
    return optim.diloco_round_cost(params, n)
  return optim.gossip_round_cost(params, n, kwargs["graph"], kwargs["blocking_rounds"],
                                 SYNC_EVERY)


def timing(cost: optim.RoundCost, step_seconds: float, bandwidth: float,
           latency: float = LATENCY) -> dict:
  """Modelled seconds per round: blocking communication, overlap overflow, utilisation."""
  blocking = cost.blocking_messages * latency + cost.blocking_bytes / bandwidth
  per_step = (cost.overlapped_messages * latency + cost.overlapped_bytes / bandwidth) / SYNC_EVERY
  stall = SYNC_EVERY * max(0.0, per_step - step_seconds)
  compute = SYNC_EVERY * step_seconds
  return {"blocking_s": blocking, "overlap_stall_s": stall,
          "utilization": compute / (compute + blocking + stall)}


def plot(results: list, steps: int, path: pathlib.Path) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  by_name = {r["name"]: r for r in results}
  panels = [
      ("methods (gossip with 1 blocking round)",
       ["data-parallel", "diloco"] + [f"gossip {g} k=1" for g in optim.GRAPHS[1:]]),
      ("blocking rounds", [f"gossip {g} k={k}" for g in ("ring", "one_peer_exponential")
                           for k in (0, 1, 2)] + ["diloco"]),
      ("message drops and a failed worker",
       ["diloco", HEADLINE] + [r["name"] for r in results if r["name"].startswith(HEADLINE + " ")]),
  ]
  fig, axes = plt.subplots(1, 3, figsize=(17, 5), sharey=True)
  for ax, (title, names) in zip(axes, panels):
    others = iter(c for c in plt.cm.tab10.colors if c != plt.cm.tab10.colors[3])
    for name in names:
      r = by_name[name]
      color = {"diloco": "black", HEADLINE: plt.cm.tab10.colors[3]}.get(name) or next(others)
      ax.plot(r["curve_steps"], r["curve_average_loss"], label=name.replace("gossip ", ""),
              color=color, lw=2.2 if name in ("diloco", HEADLINE) else 1.2)
    ax.set_title(title)
    ax.set_xlabel("inner step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  fail = by_name[panels[2][1][-1]]
  axes[2].axvline(fail["fail_step"], color="grey", ls=":")
  axes[0].set_ylabel("held-out loss of the averaged model (nats/char)")
  lowest = min(min(r["curve_average_loss"]) for r in results)
  axes[0].set_ylim(lowest - 0.05, by_name["diloco"]["curve_average_loss"][2])
  fig.suptitle(f"8 workers, non-IID shards of pydoc text, H = {SYNC_EVERY}, {steps} inner steps")
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--steps", type=int, default=300)
  parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path(__file__).parent)
  args = parser.parse_args()
  extras.require("benchmarks/diloco_experiment.py", "matplotlib")
  start = time.time()

  trainer = ex.Trainer(args.steps)
  n, params = trainer.workers, trainer.params
  nparams = sum(x.size for x in jax.tree.leaves(params))
  step_seconds = inner_step_seconds(trainer)
  print(f"{n} workers, {nparams} parameters ({4 * nparams / 1e6:.3f} MB), H = {SYNC_EVERY}, "
        f"{args.steps} inner steps; one inner step of one worker: {step_seconds * 1e3:.1f} ms; "
        f"latency {LATENCY * 1e3:g} ms per message")

  results = []
  for name, kind, kwargs in configurations(args.steps):
    t0 = time.time()
    h = trainer.train(optimizer(kind, args.steps, kwargs), SYNC_EVERY,
                      kwargs.get("failed_worker"), kwargs.get("fail_round", 0))
    cost = round_cost(kind, params, n, kwargs)
    r = {"name": name, "kind": kind, **kwargs,
         "average_loss": h.average_loss[-1], "worst_worker_loss": float(np.nanmax(h.worker_loss)),
         "worker_loss": h.worker_loss, "consensus": h.consensus[-1],
         "bytes_per_round": cost._asdict(), "wall_seconds_per_step": h.seconds_per_step,
         "curve_steps": h.steps, "curve_average_loss": h.average_loss,
         "curve_consensus": h.consensus, "train_loss": h.train_loss}
    if "fail_round" in kwargs:
      r["fail_step"] = kwargs["fail_round"] * SYNC_EVERY
    for link, bandwidth in LINKS.items():
      r[link] = timing(cost, step_seconds, bandwidth)
    results.append(r)
    print(f"  {name}: averaged {r['average_loss']:.4f}, worst {r['worst_worker_loss']:.4f} "
          f"({time.time() - t0:.0f} s)", flush=True)

  diloco = next(r for r in results if r["name"] == "diloco")
  for r in results:
    r["average_loss_vs_diloco"] = r["average_loss"] / diloco["average_loss"] - 1
    r["blocking_vs_diloco_100M"] = (r["100 Mbit/s"]["blocking_s"]
                                    / diloco["100 Mbit/s"]["blocking_s"])

  print(f"\n{'configuration':<58} {'avg loss':>8} {'vs DL':>7} {'worst':>7} {'consensus':>9} "
        f"{'MB/round ovl+blk':>17} {'block ms 100M':>13} {'/DL':>5} {'U 100M':>7} {'U 1G':>6}")
  for r in results:
    b = r["bytes_per_round"]
    print(f"{r['name']:<58} {r['average_loss']:8.4f} {r['average_loss_vs_diloco']:+7.2%} "
          f"{r['worst_worker_loss']:7.4f} {r['consensus']:9.4f} "
          f"{b['overlapped_bytes'] / 1e6:7.3f}+{b['blocking_bytes'] / 1e6:<8.3f} "
          f"{r['100 Mbit/s']['blocking_s'] * 1e3:13.1f} {r['blocking_vs_diloco_100M']:5.2f} "
          f"{r['100 Mbit/s']['utilization']:7.1%} {r['1 Gbit/s']['utilization']:6.1%}")

  by_name = {r["name"]: r for r in results}
  head = by_name[HEADLINE]
  drop30 = by_name[f"{HEADLINE} drop 30%"]
  fail = results[-1]
  at_fail = fail["curve_steps"].index(fail["fail_step"])
  checks = {
      "one-peer k=1 averaged loss within 2% of DiLoCo": head["average_loss_vs_diloco"] <= 0.02,
      "one-peer k=1, 30% drops, within 5% of DiLoCo": drop30["average_loss_vs_diloco"] <= 0.05,
      "training continues after the failure (loss keeps falling)":
          fail["curve_average_loss"][-1] < fail["curve_average_loss"][at_fail],
      "one-peer k=1 blocking time <= 1/3 of DiLoCo's at 100 Mbit/s":
          head["blocking_vs_diloco_100M"] <= 1 / 3,
      "one-peer k=0 blocking time <= 1/3 of DiLoCo's at 100 Mbit/s":
          by_name["gossip one_peer_exponential k=0"]["blocking_vs_diloco_100M"] <= 1 / 3,
  }
  head_cost = round_cost("gossip", params, n, ONE_PEER)
  diloco_cost = round_cost("diloco", params, n, {})
  sensitivity = {f"{latency * 1e3:g} ms": timing(head_cost, step_seconds, LINKS["100 Mbit/s"],
                                                 latency)["blocking_s"]
                 / timing(diloco_cost, step_seconds, LINKS["100 Mbit/s"], latency)["blocking_s"]
                 for latency in (0.0, 1e-3, 5e-3, 20e-3)}
  print(f"\n{HEADLINE}: blocking time / DiLoCo's at 100 Mbit/s, by latency per message: "
        + ", ".join(f"{k} {v:.2f}" for k, v in sensitivity.items()))
  print()
  for text, ok in checks.items():
    print(f"{'MET ' if ok else 'NOT MET'} {text}")

  args.out.mkdir(parents=True, exist_ok=True)
  result = {"command": "python benchmarks/diloco_experiment.py" + (
                f" --steps {args.steps}" if args.steps != 300 else ""),
            "workers": n, "parameters": int(nparams), "sync_every": SYNC_EVERY,
            "steps": args.steps, "batch_per_worker": char_transformer.BATCH,
            "context": char_transformer.CONTEXT,
            "inner_step_seconds": step_seconds, "latency_s": LATENCY,
            "links_bytes_per_s": LINKS, "checks": checks,
            "headline_blocking_vs_diloco_100M_by_latency": sensitivity, "results": results,
            "seconds": time.time() - start}
  (args.out / "diloco_experiment.json").write_text(json.dumps(result, indent=1))
  plot(results, args.steps, args.out / "diloco_experiment.png")
  print(f"\nwrote {args.out / 'diloco_experiment.json'} and diloco_experiment.png in "
        f"{time.time() - start:.0f} s")


if __name__ == "__main__":
  main()
