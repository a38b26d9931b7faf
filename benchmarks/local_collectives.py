"""The in-process executor (jaxcc._src.local_executor) vs XLA's own collectives, 8 CPU devices.

For each collective and each size from 4 KiB to 64 MiB per rank (x4 steps),
one jitted shard_map program runs the collective once; each variant runs
``--repeats`` times after a warm-up, the variants taking turns call by call,
and the median wall times are compared in the same run. The size is the
buffer each rank works on: all_reduce's float32 input, reduce_scatter's
input, all_gather's result, broadcast's and ppermute's array. The lax
baselines: ``psum``, ``psum_scatter(tiled=True)``, ``all_gather(tiled=True)``,
``all_gather(x)[root]`` (jaxcc's algorithm="lax" broadcast) and a ring
``ppermute``. A third variant, "lax+order", is the same lax collective inside
a jaxcc primitive (``algorithm="lax"``; for ppermute ``jaxcc.ppermute``,
which runs lax.ppermute within a process): it pays what a jaxcc collective
pays around the communication (on jax 0.10 the program-order effect: JAX
dispatches a program with an ordered effect on its slower Python path), so
local / lax+order compares the in-process handler with XLA's collective at
equal overhead. Writes ``local_collectives_<jax version>.json`` and ``.png``
next to this file (``costs.LOCAL_RANGE`` holds what they show).
Run: ``.venv/bin/python benchmarks/local_collectives.py``.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()

import argparse  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jaxcc  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from jaxcc.bench import extras  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # local_harness: the local executor in shard_map
import local_harness  # noqa: E402

P_RANKS = 8
SIZES = [4 << 10 << (2 * i) for i in range(8)]  # 4 KiB .. 64 MiB
RING = tuple((i, (i + 1) % P_RANKS) for i in range(P_RANKS))


def _variants(mesh):
  """collective -> (per-rank input elements for n result-buffer elements, lax fn,
  lax fn inside a jaxcc primitive, local fn)."""
  def local(fn, out_shape, **kwargs):
    return lambda b: local_harness.call(fn, b, "x", mesh, out_shape(b), **kwargs)
  return {
      "all_reduce": (lambda n: n, lambda b: lax.psum(b, "x"),
                     lambda b: jaxcc.all_reduce(b, "x", algorithm="lax"),
                     local("all_reduce", lambda b: b.shape)),
      "reduce_scatter": (lambda n: n, lambda b: lax.psum_scatter(b, "x", tiled=True),
                         lambda b: jaxcc.reduce_scatter(b, "x", algorithm="lax"),
                         local("reduce_scatter", lambda b: (b.shape[0] // P_RANKS,),
                               scatter_dimension=0, tiled=True)),
      "all_gather": (lambda n: n // P_RANKS, lambda b: lax.all_gather(b, "x", tiled=True),
                     lambda b: jaxcc.all_gather(b, "x", algorithm="lax"),
                     local("all_gather", lambda b: (b.shape[0] * P_RANKS,), gather_dimension=0,
                           tiled=True)),
      "broadcast": (lambda n: n, lambda b: lax.all_gather(b, "x")[0],
                    lambda b: jaxcc.broadcast(b, "x", algorithm="lax"),
                    local("broadcast", lambda b: b.shape, root=0)),
      "ppermute": (lambda n: n, lambda b: lax.ppermute(b, "x", RING),
                   lambda b: jaxcc.ppermute(b, "x", RING),
                   local("ppermute", lambda b: b.shape, perm=RING)),
  }


def _time(fns, x, repeats):
  """Median wall time of each of ``fns`` on ``x``, the functions taking turns call by call."""
  for f in fns.values():
    for _ in range(3):  # compile and warm up
      f(x).block_until_ready()
  times = {k: [] for k in fns}
  for _ in range(repeats):
    for k, f in fns.items():
      t = time.perf_counter()
      f(x).block_until_ready()
      times[k].append(time.perf_counter() - t)
  return {k: statistics.median(v) for k, v in times.items()}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=15)
  parser.add_argument("--collectives", default=",".join(_variants(None)))
  parser.add_argument("--max-bytes", type=int, default=SIZES[-1])
  args = parser.parse_args()
  extras.require("benchmarks/local_collectives.py", "matplotlib")
  mesh = jax.make_mesh((P_RANKS,), ("x",))
  results = []
  print(f"{'collective':<15} {'bytes/rank':>10} {'lax ms':>8} {'+order':>8} {'local':>8} "
        f"{'local/lax':>9} {'local/+ord':>10}")
  for name in args.collectives.split(","):
    per_rank, lax_fn, ordered_lax_fn, local_fn = _variants(mesh)[name]
    variants = {"lax": lax_fn, "lax+order": ordered_lax_fn, "local": local_fn}
    for nbytes in [s for s in SIZES if s <= args.max_bytes]:
      n_in = per_rank(nbytes // 4)
      host = np.random.default_rng(0).normal(size=(P_RANKS * n_in,)).astype(np.float32)
      x = jax.device_put(host, NamedSharding(mesh, P("x")))
      fns = {k: jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                                      check_vma=False))
             for k, fn in variants.items()}
      med = _time(fns, x, args.repeats)
      row = {"collective": name, "bytes_per_rank": nbytes, "lax_s": med["lax"],
             "lax_ordered_s": med["lax+order"], "local_s": med["local"],
             "ratio": med["local"] / med["lax"],
             "ratio_vs_ordered_lax": med["local"] / med["lax+order"]}
      print(f"{name:<15} {nbytes:>10} " + " ".join(
          f"{med[k] * 1e3:>8.3f}" for k in ("lax", "lax+order", "local")) +
            f" {row['ratio']:>9.2f} {row['ratio_vs_ordered_lax']:>10.2f}", flush=True)
      results.append(row)
      del x, fns
  out = f"local_collectives_{jax.__version__}"
  (HERE / f"{out}.json").write_text(json.dumps(
      {"jax": jax.__version__, "devices": P_RANKS, "repeats": args.repeats, "results": results},
      indent=1))
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(7, 4))
  for i, name in enumerate(dict.fromkeys(r["collective"] for r in results)):
    rows = [r for r in results if r["collective"] == name]
    sizes = [r["bytes_per_rank"] for r in rows]
    ax.plot(sizes, [r["ratio"] for r in rows], "o-", color=f"C{i}", label=f"{name} / lax")
    ax.plot(sizes, [r["ratio_vs_ordered_lax"] for r in rows], "o--", color=f"C{i}",
            label=f"{name} / lax+order")
  ax.axhline(1.0, color="gray", lw=0.8)
  ax.set_xscale("log", base=2)
  ax.set_xlabel("bytes per rank")
  ax.set_ylabel("in-process time / lax time (medians)")
  ax.set_title(f"in-process executor vs lax, {P_RANKS} CPU devices, jax {jax.__version__}")
  ax.legend()
  fig.tight_layout()
  fig.savefig(HERE / f"{out}.png", dpi=120)


if __name__ == "__main__":
  main()
