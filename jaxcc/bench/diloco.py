"""``jaxcc bench diloco``: DiLoCo, gossip DiLoCo and data parallelism trained by worker processes
on the testbed, every exchange over jaxcc's TCP transport.

Each method runs as ``--workers`` ``jax.distributed`` processes, one per host
of a ``jaxcc.testbed.Cluster`` at ``--rate`` (``jaxcc.bench.diloco_worker``).
Measured on each worker's clock: compute time (step wall time less the time
its calls were blocked on the network), blocked time per round, utilization
(compute over the training's wall time) and bytes sent (the kernel's counters
of its host's link). The averaged model of every round is evaluated here on
the held-out text. The overlap is measured at the rate where one fragment of
the anchor takes as long as one compute-only step (``local``: the inner
optimizer alone): gossip (blocking_rounds=0)'s inner step over the same step
with its messages dropped, and over ``local``'s. With
``--kill RANK@ROUND`` gossip (blocking_rounds=1) and DiLoCo run again with
that worker SIGKILLed halfway through the round (``--rejoin ROUND``: gossip
restarts it, it rejoins at a later round). Any worker may be the one killed,
process 0 included: the job's coordination service runs apart from the
workers (``jaxcc.launcher``). ``--stop RANK@ROUND:SECONDS`` SIGSTOPs a
worker and ``--partition RANK@ROUND:SECONDS`` cuts its host's link for that
long (gossip, blocking_rounds=1): its peers drop it as stuck, and once back
it rejoins.
"""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np

from jaxcc.optim._graphs import fragments

METHODS = ("local", "data_parallel", "diloco", "gossip_b0", "gossip_b1")
OVERLAP_DROP = 0.999  # the overlap's run without mixing: gossip_b0 with its messages dropped
_WORKER = os.path.join(os.path.dirname(__file__), "diloco_worker.py")
_SILENCES = ("stopped", "partitioned")  # faults that silence a worker for a while
_FAULTS = ("kill", "stop", "partition")  # the suffixes of a faulty run's method


def run_method(cluster, cfg: dict, respawn=(), max_restarts: int = 1) -> dict:
  """Run one method on ``cluster`` (entered): the workers' records, the bytes each host sent and
  the faults: ``killed`` (per killed worker by rank: its rank, time and step),
  ``killed_in_rejoin`` and the silences, each None where it did not happen."""
  from jaxcc.launcher import launch
  out = tempfile.mkdtemp(prefix="jaxcc-diloco-")
  cfg = dict(cfg, out=out)
  before = [cluster.bytes(i)[0] for i in range(cluster.n)] if cluster else None
  procs = launch(_WORKER, [json.dumps(cfg)], cluster=cluster, nproc=None if cluster else
                 cfg["workers"], respawn=respawn, max_restarts=max_restarts,
                 timeout_s=cfg.get("job_timeout_s", 1800),
                 env={"JAXCC_TIMEOUT_S": str(cfg.get("timeout_s", 60)),
                      "JAXCC_EXCHANGE": cfg.get("exchange", "native")})
  records = [p.json() for p in procs]
  sent = [cluster.bytes(i)[0] - before[i] for i in range(cluster.n)] if cluster else None
  killed = [k for k in (_fault(out, f"killed_{rank}") for rank in range(cfg["workers"])) if k]
  return {"records": records, "bytes_sent": sent, "dir": out, "killed": killed or None,
          **{fault: _fault(out, fault) for fault in ("killed_in_rejoin",) + _SILENCES}}


def _fault(out: str, name: str) -> dict | None:
  """What a worker wrote of a fault to ``<out>/<name>.json``; None if it did not happen."""
  path = os.path.join(out, f"{name}.json")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def evaluate(run: dict, cfg: dict) -> dict:
  """The averaged model's held-out loss after every round, and the metrics of ``run``."""
  import jax
  from jax.flatten_util import ravel_pytree

  from jaxcc.bench import char_transformer as ct
  n, every = cfg["workers"], cfg["sync_every"]
  corpus = ct.load_corpus(n)
  params0 = ct.init_params(len(corpus.vocab), 0, cfg.get("width", ct.WIDTH),
                           cfg.get("layers", ct.LAYERS))
  _, unravel = ravel_pytree(params0)
  loss_of = jax.jit(lambda flat: ct.loss_fn(unravel(flat), corpus.eval_windows))
  rounds = cfg["steps"] // every
  start = min(r["start_time"] for r in run["records"] if "start_time" in r and not r["incarnation"])
  ends = {}
  for r in run["records"]:
    for t, at in r.get("round_end", {}).items():
      ends.setdefault(int(t), []).append(at)
  curve = []
  for t in range(rounds):
    files = [os.path.join(run["dir"], f"w{q}_r{t}.npy") for q in range(n)]
    files = [f for f in files if os.path.exists(f)]
    if not files:
      break
    mean = np.mean([np.load(f) for f in files], axis=0)
    curve.append({"round": t, "step": (t + 1) * every, "time": max(ends[t]) - start,
                  "workers": len(files), "loss": float(loss_of(mean))})
  records = [r for r in run["records"] if r.get("wall")]
  wall = [np.asarray(r["wall"][1:]) for r in records]  # step 0 compiles
  blocked = [np.asarray(r["blocked"][1:]) for r in records]
  compute = [float(np.sum(w - b)) for w, b in zip(wall, blocked)]
  cpu = [np.asarray(r["cpu"][1:]) for r in records]
  span = [r["end_time"] - r["start_time"] for r in records]
  done_rounds = [len(r.get("round_end", {})) for r in records]
  out = {"rounds": len(curve), "final_loss": curve[-1]["loss"] if curve else float("nan"),
         "curve": curve,
         "utilization": float(np.mean([c / s for c, s in zip(compute, span)])),
         "blocking_s_per_round": float(np.mean([b.sum() / max(k, 1)
                                                for b, k in zip(blocked, done_rounds)])),
         "step_s": float(np.mean([np.mean(w) for w in wall])),
         "step_cpu_s": float(np.mean([np.mean(c) for c in cpu])),
         "compute_s": float(np.mean(compute)), "wall_s": float(np.mean(span)),
         "bytes_sent": int(sum(run["bytes_sent"])) if run["bytes_sent"] else None}
  failed = [r["failed"] for r in run["records"] if r.get("failed")]
  if failed:
    out["failed"] = failed[0]["error"]
    out["failed_after_s"] = (failed[0]["time"] - run["killed"][0]["time"]) if run["killed"] \
        else None
  if run["killed"]:
    victims = {k["rank"]: k["time"] for k in run["killed"]}
    seen = [r["lost"][str(q)]["lost_at"] - at for q, at in victims.items()
            for r in run["records"] if r["rank"] not in victims and str(q) in r.get("lost", {})]
    out["killed"] = run["killed"]
    out["detection_s"] = max(seen) if seen else None
    out["survivors_finished"] = all(
        len(r.get("round_end", {})) == rounds for r in run["records"] if r["rank"] not in victims)
    rejoins = {r["rank"]: {"rejoined_at_round": r["rejoined_at_round"],
                           "rejoin_source": r["rejoin_source"],
                           "rejoin_gap": _rejoin_gap(run, cfg, r["rank"], r["rejoined_at_round"],
                                                     loss_of)}
               for r in run["records"] if r["rank"] in victims and r.get("incarnation")
               and r.get("rejoined_at_round") is not None}
    if rejoins:
      out["rejoins"] = rejoins  # by rank; the first killed one's at the top level too
      out.update(rejoins.get(run["killed"][0]["rank"], {}))
  for fault in _SILENCES:
    if run.get(fault):
      out.update(_silence_metrics(run, fault, cfg, loss_of))
  return out


def _silence_metrics(run: dict, fault: str, cfg: dict, loss_of) -> dict:
  """A stopped or cut-off worker: who dropped it as stuck and when (the first and the last),
  the survivors' blocked time per round during the fault over their other rounds' (round 0
  aside: it compiles), how long it waited cut off, and its rejoin."""
  silenced = run[fault]
  victim, at, until = silenced["rank"], silenced["time"], silenced["time"] + silenced["seconds"]
  every, rounds = cfg["sync_every"], cfg["steps"] // cfg["sync_every"]
  others = [r for r in run["records"] if r["rank"] != victim]
  dropped = {r["rank"]: r["lost"][str(victim)] for r in others
             if "stuck past" in r["lost"].get(str(victim), {}).get("why", "")}
  during, normal = [], []
  for r in others:
    ends = [r["start_time"]] + [r["round_end"][str(t)] for t in range(rounds)
                                if str(t) in r["round_end"]]
    for t in range(1, len(ends) - 1):
      blocked = sum(b for i, b in zip(r["step"], r["blocked"]) if i // every == t)
      (during if ends[t] < until and ends[t + 1] > at else normal).append(blocked)
  out = {fault: silenced, "dropped_by": sorted(dropped),
         "detection_s": min(d["lost_at"] for d in dropped.values()) - at if dropped else None,
         "last_drop_s": max(d["lost_at"] for d in dropped.values()) - at if dropped else None,
         "drop_reason": next(iter(dropped.values()))["why"] if dropped else None,
         "survivors_finished": all(len(r["round_end"]) == rounds for r in others),
         "blocking_s_per_round_normal": float(np.mean(normal)) if normal else None,
         "blocking_s_per_round_during_fault": float(np.mean(during)) if during else None}
  back = [r for r in run["records"] if r["rank"] == victim]
  if back:
    out["cut_off"] = back[0].get("cut_off", [])
  if back and back[0].get("rejoined_at_round") is not None:
    out["rejoined_at_round"] = back[0]["rejoined_at_round"]
    out["rejoin_gap"] = _rejoin_gap(run, cfg, victim, back[0]["rejoined_at_round"], loss_of)
  return out


def _rejoin_gap(run, cfg, victim, joined, loss_of) -> list:
  """Per round from the rejoin: the rejoined worker's loss over the others' mean loss, less 1."""
  gaps = []
  for t in range(joined, cfg["steps"] // cfg["sync_every"]):
    mine = os.path.join(run["dir"], f"w{victim}_r{t}.npy")
    others = [os.path.join(run["dir"], f"w{q}_r{t}.npy") for q in range(cfg["workers"])
              if q != victim]
    if not os.path.exists(mine):
      break
    ref = np.mean([float(loss_of(np.load(f))) for f in others if os.path.exists(f)])
    gaps.append(float(loss_of(np.load(mine))) / ref - 1)
  return gaps


def loss_at(curve: list, time_s: float) -> float:
  """The averaged model's loss at ``time_s``: of the last round that ended by then."""
  done = [c["loss"] for c in curve if c["time"] <= time_s]
  return done[-1] if done else float("nan")


def _check_faults(workers: int, rounds: int, kill, rejoin, stop, partition) -> None:
  """Refuses a fault plan that cannot happen, before any host starts."""
  for name, fault in (("kill", kill), ("stop", stop), ("partition", partition)):
    if fault is None:
      continue
    ranks, at = (fault[0] if name == "kill" else (fault[0],)), fault[1]
    spelled = f"--{name} {','.join(map(str, ranks))}@{at}"
    for rank in ranks:
      if not 0 <= rank < workers:
        raise ValueError(f"{spelled}: process {rank} is not one of the {workers} workers")
    if len(set(ranks)) != len(ranks) or len(ranks) >= workers:
      raise ValueError(f"{spelled}: the ranks must differ and leave a worker alive")
    if not 1 <= at < rounds:
      raise ValueError(f"{spelled}: round {at} is not one of rounds 1 to "
                       f"{rounds - 1} (the first round runs without a fault)")
  for name, fault in (("stop", stop), ("partition", partition)):
    if fault is not None and not fault[2] > 0:
      raise ValueError(f"--{name}: {fault[2]} seconds is not a positive time")
  if rejoin is not None and (kill is None or not kill[1] < rejoin < rounds - 2):
    raise ValueError(f"--rejoin {rejoin}: needs --kill, a round after the kill's, and the "
                     f"round it rejoins at (two on) must come before the last ({rounds - 1})")


def run(workers: int = 4, rate: str = "50mbit", steps: int = 400, sync_every: int = 20,
        codecs=(None, "entropy"), methods=METHODS,
        kill: tuple[tuple[int, ...], int] | None = None,
        rejoin: int | None = None, stop: tuple[int, int, float] | None = None,
        partition: tuple[int, int, float] | None = None,
        width: int | None = None, layers: int | None = None,
        timeout_s: float = 60, exchanges=("native",)) -> dict:
  """Every method (and codec) on a testbed of ``workers`` hosts at ``rate``; see the module.

  ``exchanges``: the gossip methods run once per path of the gossip exchange
  (``JAXCC_EXCHANGE``), rows named ``+host`` for the host path. ``stop``
  (rank, round, seconds): gossip (blocking_rounds=1) runs once more with that
  worker SIGSTOPped halfway through the round for that long; ``partition``
  likewise, its host's link down for that long.
  """
  from jaxcc.testbed import Cluster
  _check_faults(workers, steps // sync_every, kill, rejoin, stop, partition)
  base = {"workers": workers, "steps": steps, "sync_every": sync_every, "timeout_s": timeout_s}
  base.update({k: v for k, v in (("width", width), ("layers", layers)) if v is not None})
  rows, runs = [], []
  with Cluster(workers, rate) as cluster:
    plan = [(m, c, None, path) for c in codecs for path in exchanges for m in methods
            if (c is None or m != "local") and (path == exchanges[0] or m.startswith("gossip"))]
    if kill is not None:
      plan += [("gossip_b1", None, ("kill", kill), exchanges[0]),
               ("diloco", None, ("kill", kill), exchanges[0])]
    plan += [("gossip_b1", None, (name, fault), exchanges[0])
             for name, fault in (("stop", stop), ("partition", partition)) if fault is not None]
    for method, codec, fault, path in plan:
      cfg = dict(base, method=method, codec=codec, exchange=path)
      respawn = ()
      if fault and fault[0] == "kill":
        cfg.update(kill=[list(fault[1][0]), fault[1][1]],
                   rejoin=rejoin if method.startswith("gossip") else None)
        respawn = set(fault[1][0])
      elif fault:
        cfg[fault[0]] = list(fault[1])
        # jax's coordination agent may end a cut-off worker once the cut heals: it restarts.
        respawn = {fault[1][0]} if fault[0] == "partition" else ()
      result = run_method(cluster, cfg, respawn)
      row = {"method": method + ("+" + codec if codec else "") + ("+" + fault[0] if fault else
             "") + ("" if path == "native" else "+" + path), **evaluate(result, cfg)}
      rows.append(row)
      runs.append(result)
  by_name = {r["method"]: r for r in rows}
  if "local" in by_name and "gossip_b0" in methods:
    # Where one fragment of the anchor takes as long as one compute-only step.
    nparams = np.load(os.path.join(runs[0]["dir"], "w0_r0.npy")).size
    fragment_bits = 32 * -(-nparams // fragments(sync_every))
    overlap_rate = fragment_bits / by_name["local"]["step_s"]
    # With mixing, and the same program with its messages dropped (0.1% still go), twice each
    # in turns: runs of 4 processes on 2 cores vary by 10-20%.
    steps_s = {0.0: [], OVERLAP_DROP: []}
    with Cluster(workers, overlap_rate) as cluster:
      for drop in (OVERLAP_DROP, 0.0) * 2:
        cfg = dict(base, method="gossip_b0", codec=None, drop_rate=drop)
        result = run_method(cluster, cfg)
        steps_s[drop].append(evaluate(result, cfg))
    row = {"method": "gossip_b0@overlap_rate", "rate_bit_s": overlap_rate,
           **steps_s[0.0][-1]}
    row["step_s"] = float(np.mean([r["step_s"] for r in steps_s[0.0]]))
    row["step_cpu_s"] = float(np.mean([r["step_cpu_s"] for r in steps_s[0.0]]))
    row["step_without_mixing_s"] = float(np.mean([r["step_s"] for r in steps_s[OVERLAP_DROP]]))
    row["step_vs_without_mixing"] = row["step_s"] / row["step_without_mixing_s"]
    row["step_vs_local"] = row["step_s"] / by_name["local"]["step_s"]
    row["step_cpu_vs_local"] = row["step_cpu_s"] / by_name["local"]["step_cpu_s"]
    rows.append(row)
  clean = {r["method"]: r for r in rows}
  for r in rows:
    base_name, plus, fault = r["method"].rpartition("+")
    if plus and fault in _FAULTS and base_name in clean:
      r["loss_vs_clean"] = r["final_loss"] / clean[base_name]["final_loss"] - 1
  end = min((r["curve"][-1]["time"] for r in rows if r["curve"]
             and r["method"].rpartition("+")[2] not in _FAULTS
             and r["method"] != "local" and "@" not in r["method"]), default=0)
  for r in rows:
    r["loss_at_equal_time"] = loss_at(r["curve"], end)
  return {"command": None, "workers": workers, "rate": rate, "steps": steps,
          "sync_every": sync_every, "equal_time_s": end, "rows": rows}


def table(result: dict) -> str:
  """The benchmark's table, with the ratios the issue asks for."""
  rows = {r["method"]: r for r in result["rows"]}
  lines = [f"{result['workers']} workers at {result['rate']}, {result['steps']} inner steps, "
           f"H = {result['sync_every']}; loss at equal time: at {result['equal_time_s']:.1f} s",
           f"{'method':22s} {'loss':>7s} {'loss@t':>7s} {'util':>6s} {'block/rnd':>10s} "
           f"{'step ms':>8s} {'cpu ms':>7s} {'MB sent':>8s}"]
  for name, r in rows.items():
    sent = f"{r['bytes_sent'] / 1e6:8.2f}" if r["bytes_sent"] is not None else f"{'-':>8s}"
    lines.append(f"{name:22s} {r['final_loss']:7.4f} {r['loss_at_equal_time']:7.4f} "
                 f"{r['utilization']:6.3f} {r['blocking_s_per_round'] * 1e3:8.1f}ms "
                 f"{r['step_s'] * 1e3:8.2f} {r['step_cpu_s'] * 1e3:7.2f} {sent}")
  for suffix in ("", "+entropy"):
    d = rows.get("diloco" + suffix)
    if not d:
      continue
    for g in ("gossip_b1", "gossip_b0"):
      if g + suffix in rows:
        r = rows[g + suffix]
        ratio = r["blocking_s_per_round"] / d["blocking_s_per_round"]
        lines.append(f"{g + suffix}: blocking {ratio:.3f} of diloco{suffix}'s, loss "
                     f"{r['final_loss'] / d['final_loss'] - 1:+.2%} at equal steps, "
                     f"{r['loss_at_equal_time'] - d['loss_at_equal_time']:+.4f} at equal time")
  for name, r in rows.items():
    ffi = rows.get(name[:-len("+host")]) if name.endswith("+host") else None
    if ffi:
      blocked = r["blocking_s_per_round"] / max(ffi["blocking_s_per_round"], 1e-9)
      lines.append(f"{name}: blocking {blocked:.3f} of the FFI path's, utilization "
                   f"{r['utilization'] / ffi['utilization']:.3f}, loss "
                   f"{r['final_loss'] - ffi['final_loss']:+.2e}")
  if "gossip_b0@overlap_rate" in rows:
    r = rows["gossip_b0@overlap_rate"]
    lines.append(f"overlap: at {r['rate_bit_s'] / 1e6:.1f} Mbit/s (one fragment takes one "
                 f"compute-only step) gossip_b0's inner step is {r['step_vs_without_mixing']:.3f}x"
                 f" the same step without mixing (messages dropped); {r['step_vs_local']:.3f}x "
                 f"local's (no optimizer state, no communication), {r['step_cpu_vs_local']:.3f}x "
                 "in CPU time")
  for name, r in rows.items():
    if "killed" in r:
      ranks = ", ".join(str(k["rank"]) for k in r["killed"])
      lines.append(f"{name}: killed rank {ranks} at step {r['killed'][0]['step']}; "
                   f"detected in {r['detection_s'] * 1e3:.1f} ms" if r.get("detection_s")
                   is not None else f"{name}: killed rank {ranks}")
      if r.get("failed"):
        lines.append(f"  failed after {r['failed_after_s']:.2f} s: {r['failed']}")
      else:
        lines.append(f"  survivors finished every round: {r['survivors_finished']}; loss vs the "
                     f"run without a failure {r.get('loss_vs_clean', float('nan')):+.2%}")
      if "rejoin_gap" in r:
        lines.append(f"  rejoined at round {r['rejoined_at_round']} from process "
                     f"{r['rejoin_source']}; its loss over the others' "
                     "per round: " + ", ".join(f"{g:+.2%}" for g in r["rejoin_gap"][:4]))
    for fault, did in zip(_SILENCES, ("stopped", "cut off")):
      if fault not in r:
        continue
      st = r[fault]
      lines.append(f"{name}: {did} rank {st['rank']} at step {st['step']} for "
                   f"{st['seconds']:g} s; dropped as stuck by processes {r['dropped_by']} "
                   + (f"{r['detection_s']:.2f} s after the fault (the last "
                      f"{r['last_drop_s']:.2f} s)" if r["detection_s"] is not None else ""))
      during = r["blocking_s_per_round_during_fault"]
      during_ms = float("nan") if during is None else during * 1e3
      lines.append(f"  survivors finished every round: {r['survivors_finished']}; blocked per "
                   f"round during the fault {during_ms:.1f} ms against "
                   f"{r['blocking_s_per_round_normal'] * 1e3:.1f} ms otherwise; loss "
                   f"vs the run without a failure {r.get('loss_vs_clean', float('nan')):+.2%}")
      for c in r.get("cut_off", []):
        lines.append(f"  it waited {c['seconds']:.2f} s at round {c['round']}, cut off from the "
                     "majority")
      if "rejoin_gap" in r:
        lines.append(f"  back, it rejoined at round {r['rejoined_at_round']}; its loss over the "
                     "others' per round: " + ", ".join(f"{g:+.2%}" for g in r["rejoin_gap"][:4]))
  return "\n".join(lines)


def plot(result: dict, path: str) -> None:
  """Loss of the averaged model against steps and against wall time, per method."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for r in result["rows"]:
    if not r["curve"] or r["method"] == "local":
      continue
    axes[0].plot([c["step"] for c in r["curve"]], [c["loss"] for c in r["curve"]],
                 label=r["method"])
    axes[1].plot([c["time"] for c in r["curve"]], [c["loss"] for c in r["curve"]],
                 label=r["method"])
  for ax, x in zip(axes, ("inner steps", "wall time (s)")):
    ax.set_xlabel(x)
    ax.set_ylabel("held-out loss of the averaged model")
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=7)
  fig.suptitle(f"{result['workers']} workers at {result['rate']} (jaxcc.testbed, TCP)")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
