"""Native executor vs lax.psum vs the XLA executor on 8 virtual CPU devices, in one run.

Each rank all-reduces ``--mib`` MiB of float32 (64 by default) inside
jax.shard_map; every variant runs ``--repeats`` times after a warm-up and the
median wall time is compared with XLA's own psum. Writes
``native_inprocess.json`` and ``native_inprocess.png`` next to this file.
Run: ``.venv/bin/python benchmarks/native_inprocess.py``.
"""

from __future__ import annotations

from jaxcc._src.devices import use_virtual_cpu_devices

use_virtual_cpu_devices(8)

import argparse  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxcc  # noqa: E402
from jaxcc.bench import extras  # noqa: E402

VARIANTS = {
    "lax.psum": lambda b: lax.psum(b, "x"),
    "native ring": lambda b: jaxcc.all_reduce(b, "x", algorithm="ring", executor="native"),
    "native direct": lambda b: jaxcc.all_reduce(b, "x", algorithm="direct", executor="native"),
    "native optcc": lambda b: jaxcc.all_reduce(b, "x", algorithm="optcc", executor="native"),
    "xla ring": lambda b: jaxcc.all_reduce(b, "x", algorithm="ring", executor="xla"),
}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--mib", type=int, default=64, help="MiB of float32 per rank")
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path(__file__).parent)
  args = parser.parse_args()
  extras.require("benchmarks/native_inprocess.py", "matplotlib")
  p = jax.device_count()
  mesh = jax.make_mesh((p,), ("x",))
  n = args.mib * (1 << 20) // 4
  x = jax.device_put(np.random.default_rng(0).normal(size=(p * n,)).astype(np.float32),
                     NamedSharding(mesh, P("x")))
  want = None
  rows = []
  for name, fn in VARIANTS.items():
    f = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("x"), out_specs=P()))
    got = np.asarray(f(x))
    if want is None:
      want = got
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    times = []
    for _ in range(args.repeats):
      start = time.perf_counter()
      f(x).block_until_ready()
      times.append(time.perf_counter() - start)
    rows.append({"variant": name, "median_s": statistics.median(times), "times_s": times})
  base = rows[0]["median_s"]
  print(f"all_reduce of {args.mib} MiB float32 per rank, {p} virtual CPU devices, "
        f"median of {args.repeats}")
  print(f"{'variant':<15} {'median':>9} {'/ lax.psum':>11}")
  for r in rows:
    r["over_psum"] = r["median_s"] / base
    print(f"{r['variant']:<15} {r['median_s'] * 1e3:7.1f}ms {r['over_psum']:11.2f}")
  args.out.mkdir(parents=True, exist_ok=True)
  (args.out / "native_inprocess.json").write_text(json.dumps(
      {"mib_per_rank": args.mib, "devices": p, "repeats": args.repeats, "rows": rows,
       "command": "benchmarks/native_inprocess.py"}, indent=1))
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(7, 3.5))
  ax.barh([r["variant"] for r in rows], [r["over_psum"] for r in rows])
  ax.axvline(1.0, color="k", lw=0.8)
  ax.set_xlabel("median time / lax.psum (lower is faster)")
  ax.set_title(f"all_reduce {args.mib} MiB f32, {p} CPU devices")
  fig.tight_layout()
  fig.savefig(args.out / "native_inprocess.png", dpi=120)


if __name__ == "__main__":
  main()
