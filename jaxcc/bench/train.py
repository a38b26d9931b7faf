"""``jaxcc bench train``: data-parallel training on the testbed, with lax and with the measured
network, while a host's NIC degrades.

Each method trains the character transformer (``char_transformer``, width
``--width``) for ``--steps`` steps as one ``jax.distributed`` process per
testbed host, every step's gradients averaged over all hosts. Each host
differentiates its own copy of the parameters (``lax.pcast(params, "x",
to="varying")``), so that the method's collective is the gradients' only sync
(jax would sum the gradient of the replicated parameters itself, over XLA's
all-reduce):

* ``lax``: ``lax.pmean`` (XLA's all-reduce over gloo);
* ``jaxcc``: ``jaxcc.all_reduce(grads, "x", op="mean")`` with no topology,
  inside ``MeasuredNetwork.jit``: the loop a user writes;
* ``clairvoyant``: the same all_reduce planned on the true network of each
  step (the cluster's configuration), so that the cost of learning it shows;
* ``jaxcc-auto`` (not by default): ``jaxcc`` with ``codec="auto"``;
* ``local`` (not by default): no sync at all, each host on its own: the
  step's compute, against which the others' sync time shows.

``--grad-dtype bfloat16`` moves the gradients as bf16 (cast before the sync
and back after, for every method); ``--clusters 4,4 --inter-rate 20mbit``
puts the hosts in clusters across a slower link.

``--degrade RANK:FRACTION@STEP`` drops that host's link (both ways) to
``FRACTION`` of its rate as step STEP starts (``Cluster.set_rate``).
Each worker takes ``batch`` windows per step (small, so that the 2-core
testbed's hosts spend the step on the gradients' sync, not on compute). Each
step's time is the slowest process'. Rows: ``method``, ``step_s``,
``fault_step``, ``replan_step`` (the first step planned on a changed
topology; null where none), ``final_loss`` (the hosts' last losses, each on
its own batch, averaged), ``events``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import threading
import time

import numpy as np

METHODS = ("lax", "jaxcc", "clairvoyant")
CODECS = {"jaxcc-auto": "auto"}  # jaxcc's methods with a codec


def run(ranks: int = 8, *, rate: str = "200mbit", degrade: tuple[int, float, int] | None = None,
        steps: int = 60, width: int = 256, batch: int = 2, methods=METHODS,
        clusters: tuple[int, ...] | None = None, inter_rate: str | None = None,
        grad_dtype: str = "float32") -> list[dict]:
  """Every method on one cluster (needs root or the rootless testbed); one row per method."""
  from jaxcc import testbed
  from jaxcc.launcher import launch
  testbed.require_privileges()
  rows = []
  with testbed.Cluster(ranks, rate, clusters=clusters, inter_rate=inter_rate) as cluster:
    healthy = cluster.topology
    full = cluster.rates[degrade[0]] if degrade else None
    faulty = healthy.with_straggler(degrade[0], degrade[1]) if degrade else healthy
    for method in methods:
      with tempfile.TemporaryDirectory() as tmp:
        progress = os.path.join(tmp, "progress")
        open(progress, "w").close()
        cfg = {"method": method, "steps": steps, "width": width, "batch": batch,
               "progress": progress, "grad_dtype": grad_dtype,
               "fault": degrade[2] if degrade else -1,
               "topologies": [dataclasses.asdict(healthy), dataclasses.asdict(faulty)]}
        watcher = None
        if degrade:
          watcher = threading.Thread(target=_fault_at, daemon=True, args=(
              progress, degrade[2], cluster, degrade[0], full * degrade[1]))
          watcher.start()
        out = [p.json() for p in launch(__file__, ["--worker", json.dumps(cfg)],
                                        cluster=cluster, timeout_s=1200,
                                        env={"JAXCC_TIMEOUT_S": "600"})]
        if watcher:
          watcher.join(timeout=5)
          cluster.set_rate(degrade[0], full)
      step_s = np.max([o["step_s"] for o in out], axis=0).tolist()
      first = out[0]
      changes = [e for e in first["events"] if e[1] == "change"]
      rows.append({"method": method, "ranks": ranks, "rate": rate, "width": width,
                   "clusters": clusters, "inter_rate": inter_rate, "grad_dtype": grad_dtype,
                   "step_s": step_s, "fault_step": degrade[2] if degrade else None,
                   "replan_step": changes[0][0] if changes else None,
                   "final_loss": float(np.mean([o["loss"] for o in out])),
                   "watch_s": np.max([o["watch_s"] for o in out], axis=0).tolist(),
                   "events": first["events"],
                   "start_probe_s": first.get("start_probe_s")})
  return rows


def _fault_at(progress: str, step: int, cluster, rank: int, rate: float) -> None:
  deadline = time.monotonic() + 1200
  while time.monotonic() < deadline:
    with open(progress) as f:
      if str(step) in f.read().split():
        cluster.set_rate(rank, rate)
        return
    time.sleep(0.02)


def table(rows: list[dict]) -> str:
  """Per method: the median step before the fault, just after it, and after the re-plan."""
  lines = ["| method | before the fault | just after | after the re-plan | re-planned at | "
           "final loss |", "| --- | --- | --- | --- | --- | --- |"]
  for r in rows:
    s, f = np.array(r["step_s"]), r["fault_step"]
    settle = max(r["replan_step"] or 0, f or 0)
    before = np.median(s[2:f]) if f else np.median(s[2:])
    just = np.median(s[f:f + 2]) if f else float("nan")
    after = np.median(s[settle + 2:]) if f else float("nan")
    lines.append(f"| {r['method']} | {before * 1e3:.0f} ms | {just * 1e3:.0f} ms | "
                 f"{after * 1e3:.0f} ms | {r['replan_step']} | {r['final_loss']:.4f} |")
  return "\n".join(lines)


def plot(rows: list[dict], path: str) -> None:
  """Step time against step for every method."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(8, 4))
  top = 0.0
  for r in rows:  # from step 1: step 0 compiles
    s = np.array(r["step_s"]) * 1e3
    ax.plot(np.arange(1, len(s)), s[1:], label=r["method"])
    top = max(top, np.percentile(s[1:], 99))
  ax.set_ylim(0, 1.2 * top)
  if rows and rows[0]["fault_step"] is not None:
    ax.axvline(rows[0]["fault_step"], color="grey", linestyle=":", label="NIC degrades")
  ax.set_xlabel("step")
  ax.set_ylabel("step time (ms)")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path)


def worker(cfg: dict) -> None:
  """One host's process: train, print per-step seconds and the final loss as one JSON line."""
  import jax
  import jax.numpy as jnp
  import optax
  from jax import lax
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  import jaxcc
  from jaxcc.bench import char_transformer as ct
  from jaxcc.launcher import join

  join()
  me, n = jax.process_index(), jax.process_count()
  mesh = jax.make_mesh((n,), ("x",))
  corpus = ct.load_corpus(n)
  data = ct.batches(corpus, cfg["steps"], seed=0, batch=cfg["batch"])
  replicated = NamedSharding(mesh, P())
  params = jax.device_put(ct.init_params(len(corpus.vocab), seed=0, width=cfg["width"]),
                          replicated)
  opt = optax.adamw(1e-3)
  state = jax.device_put(opt.init(params), replicated)
  method = cfg["method"]
  topologies = [jaxcc.Topology(**{k: tuple(v) if isinstance(v, list) else v
                                  for k, v in t.items()}) for t in cfg["topologies"]]

  def make_step(topology=None):
    def body(params, state, windows):
      # This host's own gradient: jax would sum the gradient of the replicated params itself.
      local = lax.pcast(params, "x", to="varying")
      loss, grads = jax.value_and_grad(ct.loss_fn)(local, windows[0])
      grads = jax.tree.map(lambda g: g.astype(cfg["grad_dtype"]), grads)  # what moves
      if method == "lax":
        grads = lax.pmean(grads, "x")
      elif method != "local":
        grads = jaxcc.all_reduce(grads, "x", op="mean", topology=topology,
                                 codec=CODECS.get(method))
      grads = jax.tree.map(lambda g: g.astype(jnp.float32), grads)
      updates, state = opt.update(grads, state, params)
      return optax.apply_updates(params, updates), state, loss[None]  # this host's loss
    # "local" keeps each host's own update (unsynced), so only rank 0's is returned
    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), P("x")),
                         out_specs=(P(), P(), P("x")), check_vma=method != "local")

  net, start_probe_s = None, None
  if method.startswith("jaxcc"):
    began = time.perf_counter()
    net = jaxcc.network.MeasuredNetwork(mesh, "x")
    start_probe_s = time.perf_counter() - began
    step = net.jit(make_step())
  sharding = NamedSharding(mesh, P("x"))
  if method == "clairvoyant":  # compiled (and run once) before the loop: it knows the network
    steps = [jax.jit(make_step(t)) for t in topologies]
    warm = jax.make_array_from_callback((n,) + data.shape[2:], sharding,
                                        lambda idx: data[0, idx[0]])
    for s in steps:
      jax.block_until_ready(s(params, state, warm))
  elif method in ("lax", "local"):
    step = jax.jit(make_step())
  line_up = jax.jit(jax.shard_map(lambda b: lax.psum(b, "x"), mesh=mesh, in_specs=P("x"),
                                  out_specs=P("x")))
  token = jax.device_put(jnp.zeros((n,)), sharding)
  times, watch, loss = [], [], None
  for i in range(cfg["steps"]):
    windows = jax.make_array_from_callback(
        (n,) + data.shape[2:], sharding, lambda idx, i=i: data[i, idx[0]])
    if i == cfg["fault"]:
      if me == 0:
        with open(cfg["progress"], "a") as f:
          f.write(f"{i}\n")
      time.sleep(1.0)  # the parent's tc change lands before the step starts
      line_up(token).block_until_ready()
    if method == "clairvoyant":
      step = steps[int(0 <= cfg["fault"] <= i)]
    began = time.perf_counter()
    params, state, loss = step(params, state, windows)
    jax.block_until_ready(loss)
    times.append(time.perf_counter() - began)
    watch.append(net.watch_seconds - sum(watch) if net else 0.0)
  events = [(e.step, e.kind, e.seconds, e.why, [round(b / 1e6, 2) for b in
              e.topology.send_bandwidth + e.topology.recv_bandwidth]) for e in net.events] \
      if net else []
  mine = float(np.asarray(loss.addressable_shards[0].data)[0])
  print(json.dumps({"process": me, "step_s": times, "watch_s": watch, "loss": mine,
                    "events": events,
                    "start_probe_s": start_probe_s}), flush=True)
  jax.distributed.shutdown()


if __name__ == "__main__":
  if sys.argv[1:2] == ["--worker"]:
    worker(json.loads(sys.argv[2]))
