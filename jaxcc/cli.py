"""The ``jaxcc`` command: ``jaxcc bench allreduce|reducescatter|allgather|sweep|calibrate ...``.

Examples:
  jaxcc bench allreduce --ranks 4 --size 256KiB --algorithms psum,ring,optcc --repeats 2
  sudo jaxcc bench allreduce --testbed --ranks 8 --rate 200mbit --straggler 5:0.5 \\
      --size 16MiB --algorithms psum,ring,direct,optcc,r2ccl --repeats 5 --json out.json
  sudo jaxcc bench reducescatter --testbed --ranks 8 --clusters 4,4 --inter-rate 20mbit
  sudo jaxcc bench probe --testbed --clusters 4,4 --inter-rate 20mbit --straggler 2:0.5
  sudo jaxcc bench calibrate --ranks 4 --rate 200mbit
  jaxcc bench sweep --sizes 4KiB:256MiB --json sweep.json --plot sweep.png
  jaxcc bench sweep --nproc 4 --collectives all_reduce,all_gather --executor native
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence

from jaxcc.bench import calibration, collective, extras, probe, report, sweep
from jaxcc.bench.diloco import METHODS as DILOCO_METHODS
from jaxcc.testbed import Cluster

_SIZE_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 1 << 10, "m": 1e6, "mb": 1e6,
               "mib": 1 << 20, "g": 1e9, "gb": 1e9, "gib": 1 << 30}


def main(argv: Sequence[str] | None = None) -> int:
  """Run the command line ``argv`` (``sys.argv[1:]`` by default); return the exit status."""
  parser = _parser()
  args = parser.parse_args(argv)
  if not hasattr(args, "command"):  # no (sub)command: the help of the level reached
    args.level.print_help(sys.stderr)
    return 2
  try:
    args.command(args)
  except (RuntimeError, TimeoutError, ValueError) as e:
    print(f"jaxcc: error: {e}", file=sys.stderr)
    return 1
  return 0


def parse_size(text: str) -> int:
  """Bytes of ``"16MiB"``, ``"1GiB"``, ``"256KiB"``, ``"4MB"`` or ``"4096"``."""
  m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmg]?i?b?)\s*", text.lower())
  if not m or m.group(2) not in _SIZE_UNITS:
    raise argparse.ArgumentTypeError(f"size must look like 16MiB, 1GiB or 4096, got {text!r}")
  nbytes = float(m.group(1)) * _SIZE_UNITS[m.group(2)]
  if nbytes != int(nbytes) or nbytes <= 0:
    raise argparse.ArgumentTypeError(f"size must be a positive whole number of bytes, got {text!r}")
  return int(nbytes)


def parse_stragglers(text: str) -> dict[int, float]:
  """``{rank: fraction}`` of ``"5:0.5"`` or ``"1:0.75,5:0.5"``."""
  out = {}
  for item in text.split(","):
    m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d*\.?\d+)\s*", item)
    if not m or not 0 < float(m.group(2)) <= 1:
      raise argparse.ArgumentTypeError(
          f"a straggler is RANK:FRACTION with FRACTION in (0, 1], got {item!r}")
    out[int(m.group(1))] = float(m.group(2))
  return out


def parse_sizes(text: str) -> list[int]:
  """Bytes of ``"4KiB:256MiB"`` (x4 steps), ``"4KiB:1MiB:x2"`` or ``"4KiB,1MiB,16MiB"``."""
  if "," in text or ":" not in text:
    return [parse_size(t) for t in text.split(",")]
  parts = text.split(":")
  m = re.fullmatch(r"\s*x(\d+)\s*", parts[2]) if len(parts) == 3 else None
  if len(parts) not in (2, 3) or (len(parts) == 3 and not m):
    raise argparse.ArgumentTypeError(
        f"sizes are LOW:HIGH, LOW:HIGH:xFACTOR or a comma-separated list, got {text!r}")
  try:
    return sweep.size_range(parse_size(parts[0]), parse_size(parts[1]),
                            int(m.group(1)) if m else 4)
  except ValueError as e:
    raise argparse.ArgumentTypeError(str(e)) from None


def _collectives(text: str) -> list[str]:
  names = [c.strip() for c in text.split(",") if c.strip()]
  if not names or any(c not in sweep.COLLECTIVES for c in names):
    raise argparse.ArgumentTypeError(
        f"collectives are a comma-separated list of {', '.join(sweep.COLLECTIVES)}; got {text!r}")
  return names


def _plot_path(path: str) -> str:
  """--plot's PATH; exits at parsing, before any work, if matplotlib is not installed."""
  extras.require("jaxcc bench --plot", "matplotlib")
  return path


def _names(text: str) -> list[str]:
  return [a.strip() for a in text.split(",") if a.strip()]


def parse_clusters(text: str) -> list[int]:
  """Cluster sizes of ``"4,4"`` or ``"3,5"``."""
  try:
    sizes = [int(t) for t in text.split(",")]
  except ValueError:
    sizes = []
  if not sizes or min(sizes) < 1:
    raise argparse.ArgumentTypeError(f"clusters are sizes >= 1 such as 4,4; got {text!r}")
  return sizes


def _stragglers(args, level: str = "straggler") -> dict[int, float]:
  return {rank: f for group in getattr(args, level) or () for rank, f in group.items()}


def _ranks(args) -> int:
  """--ranks, else the sum of --clusters, else 4."""
  if args.ranks is None:
    return sum(args.clusters) if args.clusters else 4
  return args.ranks


def _bench_collective(args) -> None:
  rows = collective.run(args.collective, _ranks(args), args.size, rate=args.rate,
                        configurations=[(_stragglers(args), _stragglers(args, "inter_straggler"))],
                        algorithms=args.algorithms, repeats=args.repeats, testbed=args.testbed,
                        clusters=args.clusters, inter_rate=args.inter_rate)
  print(report.table(rows))
  if args.json:
    report.write_json(rows, args.json)
  if args.plot:
    report.plot(rows, args.plot)


def _bench_sweep(args) -> None:
  if args.devices is not None and (args.nproc or args.testbed):
    raise ValueError("--devices is for one process of virtual devices; with --nproc or "
                     "--testbed every process has one device")
  rows = sweep.run(collectives=args.collectives, sizes=args.sizes, repeats=args.repeats,
                   devices=args.devices or 8, nproc=args.nproc, testbed=args.testbed,
                   rate=args.rate, stragglers=_stragglers(args), algorithm=args.algorithm,
                   executor=args.executor, codec=None if args.codec == "none" else args.codec)
  print(report.sweep_table(rows))
  if args.json:
    report.write_json(rows, args.json)
  if args.plot:
    report.sweep_plot(rows, args.plot)


def _bench_calibrate(args) -> None:
  with Cluster(args.ranks, args.rate, _stragglers(args)) as cluster:
    result = calibration.calibrate(cluster, seconds=args.seconds)
  print(report.calibration_table(result))
  if args.json:
    report.write_json(result, args.json)


def _bench_probe(args) -> None:
  if not args.testbed:
    raise ValueError("bench probe runs on the testbed: pass --testbed; in a "
                     "jax.distributed job call jaxcc.probe_topology(mesh, axis_name)")
  result = probe.run(_ranks(args), rate=args.rate, stragglers=_stragglers(args),
                     clusters=args.clusters, inter_rate=args.inter_rate,
                     inter_stragglers=_stragglers(args, "inter_straggler"))
  print(probe.table(result))
  if args.json:
    report.write_json(result, args.json)


def _bench_diloco(args) -> None:
  from jaxcc.bench import diloco
  result = diloco.run(args.workers, args.rate, args.steps, args.sync_every,
                      codecs=(None,) if args.no_entropy else (None, "entropy"),
                      methods=args.methods, kill=args.kill, rejoin=args.rejoin, stop=args.stop,
                      partition=args.partition, width=args.width, layers=args.layers,
                      exchanges=args.exchange)
  result["command"] = "jaxcc " + " ".join(sys.argv[1:])
  print(diloco.table(result))
  if args.json:
    report.write_json(result, args.json)
  if args.plot:
    diloco.plot(result, args.plot)


def _bench_train(args) -> None:
  from jaxcc.bench import train
  rows = train.run(args.ranks, rate=args.rate, degrade=args.degrade, steps=args.steps,
                   width=args.width, batch=args.batch, methods=_names(args.methods),
                   clusters=tuple(args.clusters) if args.clusters else None,
                   inter_rate=args.inter_rate, grad_dtype=args.grad_dtype)
  print(train.table(rows))
  if args.json:
    report.write_json({"command": "jaxcc " + " ".join(sys.argv[1:]), "rows": rows}, args.json)
  if args.plot:
    train.plot(rows, args.plot)


def _parse_degrade(text: str) -> tuple[int, float, int]:
  try:
    rank, rest = text.split(":")
    fraction, step = rest.split("@")
    return int(rank), float(fraction), int(step)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected RANK:FRACTION@STEP, got {text!r}") from None


def _parse_kill(text: str) -> tuple[tuple[int, ...], int]:
  ranks, _, at = text.partition("@")
  try:
    return tuple(int(r) for r in ranks.split(",")), int(at)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected RANK[,RANK...]@ROUND, got {text!r}") from None


def _parse_stop(text: str) -> tuple[int, int, float]:
  rank, _, rest = text.partition("@")
  at, _, seconds = rest.partition(":")
  try:
    return int(rank), int(at), float(seconds)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected RANK@ROUND:SECONDS, got {text!r}") from None


def _parse_choices(allowed: tuple[str, ...]):
  """A parser of a comma-separated list of ``allowed`` names, as a tuple."""

  def parse(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    bad = [name for name in names if name not in allowed]
    if bad or not names:
      raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(allowed)};"
                                       f" got {text!r}")
    return names

  return parse


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="jaxcc", description="jaxcc: collective communication "
                                   "for JAX on real, imperfect networks.")
  parser.set_defaults(level=parser)
  commands = parser.add_subparsers(title="commands")
  bench = commands.add_parser("bench", help="measure collectives against bounds and baselines")
  bench.set_defaults(level=bench)
  benches = bench.add_subparsers(title="benchmarks")

  def clustered(p):
    p.add_argument("--clusters", type=parse_clusters, metavar="SIZES",
                   help="sizes of consecutive clusters along the ranks, e.g. 4,4 (sets --ranks)")
    p.add_argument("--inter-rate", metavar="RATE",
                   help="with --clusters: each rank's cross-cluster rate (default --rate)")
    p.add_argument("--inter-straggler", action="append", type=parse_stragglers,
                   metavar="RANK:FRACTION",
                   help="with --clusters: a rank's cross-cluster rate at FRACTION; repeatable")

  def common(p, ranks):
    p.add_argument("--ranks", type=int, default=ranks,
                   help=f"number of ranks (default {ranks or '4, or the sum of --clusters'})")
    p.add_argument("--rate", default="200mbit",
                   help="link rate of every rank, a tc rate (default 200mbit)")
    p.add_argument("--straggler", action="append", type=parse_stragglers, metavar="RANK:FRACTION",
                   help="a rank at FRACTION of the rate; repeatable or comma-separated")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")

  for command, name in (("allreduce", "all_reduce"), ("reducescatter", "reduce_scatter"),
                        ("allgather", "all_gather")):
    algorithms = collective.ALGORITHMS[name]
    p = benches.add_parser(
        command, help=f"time {name} algorithms",
        description=f"Time {name} algorithms on virtual CPU devices (default) or on the testbed "
                    "(--testbed), flat or in clusters (--clusters): median of --repeats "
                    "runs, the slowest rank's time each, against the fault-free lax twin "
                    f"({collective.BASELINES[name]}), the lower bound and the simulator's "
                    "prediction; on testbed clusters also the bytes sent across clusters.")
    common(p, None)
    clustered(p)
    p.add_argument("--size", type=parse_size, default=8 << 20,
                   help="float32 bytes per rank (the full buffer), e.g. 16MiB (default 8MiB)")
    p.add_argument("--algorithms", type=_names,
                   help=f"comma-separated of {','.join(algorithms)} (default: all but "
                        "hierarchical; on clusters lax, ring and hierarchical)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs (default 5)")
    p.add_argument("--testbed", action="store_true",
                   help="run on an emulated cluster of network namespaces (jaxcc.testbed)")
    p.add_argument("--plot", type=_plot_path, metavar="PATH",
                   help="write a PNG of time / lower bound")
    p.set_defaults(command=_bench_collective, collective=name)

  p = benches.add_parser(
      "sweep", help="every collective at every size against lax (nccl-tests style)",
      description="Time jaxcc's collectives against their lax twins at sizes from 4 KiB to "
                  "256 MiB of float32 (x4 steps): on virtual CPU devices of one process "
                  "(default), across --nproc processes on loopback (gloo) or on the testbed "
                  "(--testbed). Every result is checked against lax first; rows give "
                  "the median and minimum time, algbw and busbw as nccl-tests defines them, "
                  "and lax's time / jaxcc's.")
  p.add_argument("--collectives", type=_collectives, default=list(sweep.COLLECTIVES),
                 help=f"comma-separated (default {','.join(sweep.COLLECTIVES)})")
  p.add_argument("--sizes", type=parse_sizes, default=sweep.size_range(),
                 help="LOW:HIGH[:xFACTOR] or a comma-separated list of full-buffer sizes "
                      "(default 4KiB:256MiB:x4)")
  p.add_argument("--repeats", type=int, default=10,
                 help="timed runs of each up to 4 MiB, fewer above, at least 3 (default 10)")
  p.add_argument("--devices", type=int,
                 help="virtual CPU devices of the one process (default 8)")
  p.add_argument("--nproc", type=int,
                 help="processes of one CPU device each, on loopback (with --testbed: hosts, "
                      "default 4)")
  p.add_argument("--testbed", action="store_true",
                 help="run on an emulated cluster of network namespaces (jaxcc.testbed)")
  p.add_argument("--rate", default="200mbit",
                 help="with --testbed: link rate of every host, a tc rate (default 200mbit)")
  p.add_argument("--straggler", action="append", type=parse_stragglers, metavar="RANK:FRACTION",
                 help="with --testbed: a host at FRACTION of the rate; repeatable")
  p.add_argument("--algorithm", default="auto",
                 help="jaxcc's algorithm (default auto); ppermute takes none")
  p.add_argument("--executor", default="auto", choices=("auto", "native", "xla"),
                 help="jaxcc's executor (default auto)")
  p.add_argument("--codec", default="none", choices=("none", "fixed", "entropy"),
                 help="jaxcc's codec (default none)")
  p.add_argument("--json", metavar="PATH", help="write the rows as JSON")
  p.add_argument("--plot", type=_plot_path, metavar="PATH",
                 help="write a PNG of busbw and lax / jaxcc")
  p.set_defaults(command=_bench_sweep)

  p = benches.add_parser(
      "diloco", help="gossip DiLoCo, DiLoCo and data parallelism by worker processes on the "
      "testbed",
      description="Train the char transformer of examples/diloco_train.py with --workers "
                  "jax.distributed processes on the testbed at --rate, every exchange over "
                  "jaxcc's TCP transport: per method (and with codec entropy) the averaged "
                  "model's loss at equal steps and equal wall time, utilization, blocked "
                  "time per round and bytes sent; --kill RANK@ROUND SIGKILLs a worker "
                  "(process 0 too; RANK,RANK@ROUND several at once) in gossip and DiLoCo "
                  "runs, --rejoin ROUND restarts it in gossip; --stop RANK@ROUND:SECONDS "
                  "SIGSTOPs one in a gossip run and --partition RANK@ROUND:SECONDS cuts its "
                  "host's link; --exchange native,host runs the gossip methods on both paths "
                  "of the gossip exchange.")
  p.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
  p.add_argument("--rate", default="50mbit", help="link rate of every host (default 50mbit)")
  p.add_argument("--steps", type=int, default=400, help="inner steps (default 400)")
  p.add_argument("--sync-every", type=int, default=20, help="inner steps per round (default 20)")
  p.add_argument("--kill", type=_parse_kill, metavar="RANK[,RANK...]@ROUND",
                 help="SIGKILL worker RANK (each of them, at once) halfway through round ROUND")
  p.add_argument("--rejoin", type=int, metavar="ROUND",
                 help="with --kill: restart it; it rejoins gossip two rounds after ROUND")
  p.add_argument("--stop", type=_parse_stop, metavar="RANK@ROUND:SECONDS",
                 help="SIGSTOP worker RANK halfway through round ROUND for SECONDS (gossip); "
                      "its peers drop it as stuck and it rejoins once back")
  p.add_argument("--partition", type=_parse_stop, metavar="RANK@ROUND:SECONDS",
                 help="set worker RANK's link down halfway through round ROUND for SECONDS "
                      "(gossip): its peers drop it as stuck, it waits cut off from the "
                      "majority and rejoins once the link is back")
  p.add_argument("--no-entropy", action="store_true", help="skip the codec=entropy runs")
  p.add_argument("--methods", type=_parse_choices(DILOCO_METHODS), default=DILOCO_METHODS,
                 help=f"comma-separated, of {','.join(DILOCO_METHODS)} (default all)")
  p.add_argument("--exchange", type=_parse_choices(("native", "host")), default=("native",),
                 help="comma-separated paths of the gossip exchange, native and host "
                      "(JAXCC_EXCHANGE): the gossip methods run on each (default native)")
  p.add_argument("--width", type=int, help="model width (default 64)")
  p.add_argument("--layers", type=int, help="model layers (default 2)")
  p.add_argument("--json", metavar="PATH", help="write the results as JSON")
  p.add_argument("--plot", type=_plot_path, metavar="PATH",
                 help="write a PNG of loss against steps and wall time")
  p.set_defaults(command=_bench_diloco)

  p = benches.add_parser(
      "train", help="data-parallel training on the testbed: lax against the measured network",
      description="Train the char transformer data-parallel on --ranks testbed hosts at --rate "
                  "with lax.pmean, with jaxcc.all_reduce inside MeasuredNetwork.jit (no "
                  "topology written) and with jaxcc planned on the true network (clairvoyant); "
                  "--degrade RANK:FRACTION@STEP drops a host's link mid-run. Prints per method "
                  "the step time before the fault, just after it and after the re-plan.")
  p.add_argument("--ranks", type=int, default=8, help="hosts (default 8)")
  p.add_argument("--rate", default="200mbit", help="link rate of every host (default 200mbit)")
  p.add_argument("--degrade", type=_parse_degrade, metavar="RANK:FRACTION@STEP",
                 help="drop host RANK's link to FRACTION of its rate as step STEP starts")
  p.add_argument("--steps", type=int, default=60, help="training steps (default 60)")
  p.add_argument("--width", type=int, default=256, help="model width (default 256)")
  p.add_argument("--batch", type=int, default=2, help="windows per host and step (default 2)")
  p.add_argument("--methods", default="lax,jaxcc,clairvoyant",
                 help="comma-separated: lax, jaxcc, clairvoyant, jaxcc-auto (codec='auto'), "
                      "local (no sync) (default lax,jaxcc,clairvoyant)")
  p.add_argument("--clusters", type=parse_clusters, metavar="SIZES",
                 help="cluster sizes along the ranks, e.g. 4,4")
  p.add_argument("--inter-rate", help="with --clusters: each host's rate across clusters")
  p.add_argument("--grad-dtype", default="float32", choices=("float32", "bfloat16"),
                 help="the dtype the gradients move in (default float32)")
  p.add_argument("--json", metavar="PATH", help="write the rows as JSON")
  p.add_argument("--plot", type=_plot_path, metavar="PATH",
                 help="write a PNG of step time against step")
  p.add_argument("--testbed", action="store_true", help="accepted: it always runs there")
  p.set_defaults(command=_bench_train)

  p = benches.add_parser(
      "probe", help="jaxcc.probe_topology on the testbed against the configured network",
      description="Build a testbed cluster, measure it with jaxcc.probe_topology over jaxcc's "
                  "TCP transport, and compare each port's probed rate, the clusters and the "
                  "stragglers with the configuration.")
  common(p, None)
  clustered(p)
  p.add_argument("--testbed", action="store_true", help="run on the testbed (required)")
  p.set_defaults(command=_bench_probe)

  p = benches.add_parser(
      "calibrate", help="measured link throughput vs the configured rate (testbed)",
      description="Stream TCP around a testbed cluster's ring and compare each link's goodput "
                  "with its configured rate.")
  common(p, 4)
  p.add_argument("--seconds", type=float, default=2.0, help="stream length (default 2)")
  p.set_defaults(command=_bench_calibrate)
  return parser


if __name__ == "__main__":
  sys.exit(main())
