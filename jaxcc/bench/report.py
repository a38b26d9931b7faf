"""What a benchmark shows: markdown tables, JSON, a PNG, and a text progress bar on stderr."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence

_UNITS = ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))


def format_size(nbytes: int) -> str:
  """``16 MiB``, ``256 KiB`` or ``4100 B``: the largest binary unit that divides ``nbytes``."""
  for unit, name in _UNITS:
    if nbytes >= unit and nbytes % unit == 0:
      return f"{nbytes // unit} {name}"
  return f"{nbytes} B"


def format_stragglers(stragglers: Mapping[int, float]) -> str:
  """``3:0.5,5:0.75`` (rank:fraction, by rank), or ``none``."""
  return ",".join(f"{r}:{f:g}" for r, f in sorted(stragglers.items())) or "none"


def format_configuration(stragglers: Mapping[int, float],
                         inter_stragglers: Mapping[int, float] | None = None) -> str:
  """``3:0.5``, ``inter 4:0.5``, ``3:0.5; inter 4:0.5`` or ``none``."""
  parts = [format_stragglers(stragglers)] if stragglers else []
  if inter_stragglers:
    parts.append(f"inter {format_stragglers(inter_stragglers)}")
  return "; ".join(parts) or "none"


def _configuration(row: dict) -> str:
  return format_configuration(row["stragglers"], row.get("inter_stragglers"))


def format_seconds(t: float) -> str:
  """``0.527 s``, ``12.3 ms`` under a second, ``85 us`` under a millisecond."""
  if t >= 1:
    return f"{t:.3f} s"
  return f"{t * 1e3:.1f} ms" if t >= 1e-3 else f"{t * 1e6:.0f} us"


def table(rows: Sequence[dict]) -> str:
  """A markdown table of ``jaxcc.bench.collective.run`` rows, after a line naming the setup.

  Columns: the stragglers, the algorithm, the median measured time, its ratio to
  the fault-free lax twin, to the lower bound and to ``T_ff / b`` (the fault-free
  ring's link-rate time over the slowest fraction), the lower bound, the
  simulator's prediction and its ratio to the measured time; on a testbed of
  clusters, the bytes measured across clusters over the schedule's count.
  """
  first = rows[0]
  where = "on the testbed" if first["testbed"] else "on virtual CPU devices"
  network = f"{first['ranks']} ranks at {first['rate_bps'] / 1e6:g} Mbit/s"
  if first.get("clusters"):
    network = (f"{first['ranks']} ranks in clusters {'+'.join(map(str, first['clusters']))}, "
               f"{first['rate_bps'] / 1e6:g} Mbit/s inside, "
               f"{first['inter_rate_bps'] / 1e6:g} Mbit/s across")
  counted = "inter_cluster_bytes_measured" in first
  lines = [f"{first.get('collective', 'all_reduce')} of {format_size(first['nbytes'])} float32 "
           f"per rank, {network} {where}, median of {first['repeats']}; "
           f"simulated at {first['link_efficiency']:.3f} x the configured rates",
           "| stragglers | algorithm | measured | / fault-free lax | / lower bound | / (T_ff/b) "
           "| lower bound | simulated | simulated / measured |" +
           (" cross-cluster bytes | measured / expected |" if counted else ""),
           "| --- " * (11 if counted else 9) + "|"]
  for r in rows:
    t = r["measured_s"]
    line = (f"| {_configuration(r)} | {r['algorithm']} | {format_seconds(t)} "
            f"| {t / r['fault_free_psum_s']:.2f} | {t / r['lower_bound_s']:.2f} "
            f"| {t / r['t_ff_over_b_s']:.2f} | {format_seconds(r['lower_bound_s'])} "
            f"| {format_seconds(r['simulated_s'])} | {r['simulated_s'] / t:.2f} |")
    if counted:
      measured, expected = r["inter_cluster_bytes_measured"], r["inter_cluster_bytes_expected"]
      line += f" {measured / 2**20:.2f} MiB | {measured / expected:.3f} |"
    lines.append(line)
  return "\n".join(lines)


def summary(rows: Sequence[dict]) -> str:
  """A markdown table, a line per configuration: the lower bound, each median (/ the bound)."""
  algorithms = list(dict.fromkeys(r["algorithm"] for r in rows))
  lines = ["| stragglers | lower bound | " + " | ".join(algorithms) + " |",
           "| --- " * (len(algorithms) + 2) + "|"]
  by_config = {}
  for r in rows:
    by_config.setdefault(_configuration(r), {})[r["algorithm"]] = r
  for config, cells in by_config.items():
    bound = next(iter(cells.values()))["lower_bound_s"]
    lines.append(f"| {config} | {format_seconds(bound)} | " + " | ".join(
        f"{format_seconds(cells[a]['measured_s'])} ({cells[a]['measured_s'] / bound:.2f}x)"
        if a in cells else "" for a in algorithms) + " |")
  return "\n".join(lines)


def sweep_table(rows: Sequence[dict]) -> str:
  """A markdown table of ``jaxcc.bench.sweep.run`` rows, after a line naming the setup.

  Columns per collective and size: jaxcc's median and minimum time, algbw and
  busbw (GB/s), the lax twin's median time and busbw, lax's time / jaxcc's,
  and how the result was checked against lax.
  """
  first = rows[0]
  if first["where"] == "testbed":
    where = (f"{first['processes']} testbed hosts at {first['rate_bps'] / 1e6:g} Mbit/s, "
             f"stragglers {format_stragglers(first['stragglers'])}")
  elif first["where"] == "loopback":
    where = f"{first['processes']} processes on loopback"
  else:
    where = "virtual CPU devices of one process"
  algorithm = next((r["algorithm"] for r in rows if r["algorithm"]), "auto")
  repeats = sorted({r["repeats"] for r in rows}, reverse=True)
  lines = [f"sweep of float32 on {first['ranks']} ranks, {where}; jaxcc algorithm={algorithm} "
           f"executor={first['executor']} codec={first['codec']}; median of "
           f"{'/'.join(map(str, repeats))} runs; every result checked against lax first",
           "| collective | size | time | min | algbw | busbw | lax time | lax busbw | lax / jaxcc "
           "| check |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  for r in rows:
    lines.append(
        f"| {r['collective']} | {format_size(r['nbytes'])} | {format_seconds(r['time_s'])} "
        f"| {format_seconds(r['min_s'])} | {r['algbw_gbps']:.3f} | {r['busbw_gbps']:.3f} "
        f"| {format_seconds(r['lax_time_s'])} | {r['lax_busbw_gbps']:.3f} | {r['vs_lax']:.2f} "
        f"| {r['check']} |")
  return "\n".join(lines)


def calibration_table(result: dict) -> str:
  """A markdown table of ``jaxcc.bench.calibration.calibrate``'s links."""
  lines = [f"{len(result['links'])} links streamed at once for {result['seconds']:g} s each; "
           f"link efficiency (median measured / configured) {result['efficiency']:.3f}",
           "| link | configured | measured | measured / configured |", "| --- | --- | --- | --- |"]
  for link in result["links"]:
    lines.append(f"| {link['src']} -> {link['dst']} | {link['configured_bps'] / 1e6:.1f} Mbit/s "
                 f"| {link['measured_bps'] / 1e6:.1f} Mbit/s | {link['ratio']:.3f} |")
  return "\n".join(lines)


def write_json(value, path: str | os.PathLike) -> None:
  """``value`` as indented JSON at ``path`` (rank keys become strings)."""
  with open(path, "w") as f:
    json.dump(value, f, indent=1)
    f.write("\n")


def plot(rows: Sequence[dict], path: str | os.PathLike) -> None:
  """A PNG of measured / lower bound per configuration (groups) and algorithm (bars).

  A black tick on each bar marks the simulator's prediction over the same bound.
  """
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  configs = list(dict.fromkeys(_configuration(r) for r in rows))
  algorithms = list(dict.fromkeys(r["algorithm"] for r in rows))
  width = 0.8 / len(algorithms)
  fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(configs)), 3.8))
  for k, alg in enumerate(algorithms):
    xs, measured, simulated = [], [], []
    for r in rows:
      if r["algorithm"] == alg:
        xs.append(configs.index(_configuration(r)) + (k + 0.5) * width - 0.4)
        measured.append(r["measured_s"] / r["lower_bound_s"])
        simulated.append(r["simulated_s"] / r["lower_bound_s"])
    ax.bar(xs, measured, width, label=alg)
    ax.scatter(xs, simulated, marker="_", color="black", s=120, zorder=3,
               label="simulated" if k == 0 else None)
  ax.axhline(1.0, color="tab:red", ls="--", lw=1, label="lower bound")
  ax.set_xticks(range(len(configs)), [f"stragglers {c}" for c in configs], fontsize=8)
  ax.set_ylabel("time / lower bound")
  first = rows[0]
  ax.set_title(f"{first.get('collective', 'all_reduce')} {format_size(first['nbytes'])}/rank, "
               f"{first['ranks']} ranks at "
               f"{first['rate_bps'] / 1e6:g} Mbit/s, "
               f"{'testbed' if first['testbed'] else 'virtual devices'}", fontsize=10)
  ax.legend(fontsize=7, ncol=2)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def sweep_plot(rows: Sequence[dict], path: str | os.PathLike) -> None:
  """A PNG of a sweep: busbw against size per collective (jaxcc solid, lax dashed), and
  lax's time / jaxcc's against size."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, (bw, ratio) = plt.subplots(1, 2, figsize=(11, 4))
  for k, collective in enumerate(dict.fromkeys(r["collective"] for r in rows)):
    mine = [r for r in rows if r["collective"] == collective]
    x = [r["nbytes"] for r in mine]
    color = f"C{k}"
    bw.plot(x, [r["busbw_gbps"] for r in mine], "o-", color=color, label=f"jaxcc.{collective}")
    bw.plot(x, [r["lax_busbw_gbps"] for r in mine], "x--", color=color, label=mine[0]["twin"])
    ratio.plot(x, [r["vs_lax"] for r in mine], "o-", color=color, label=collective)
  ratio.axhline(1.0, color="gray", ls=":", lw=1)
  for ax in (bw, ratio):
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size (bytes, full buffer)")
    ax.grid(alpha=0.3)
  bw.set_yscale("log")
  bw.set_ylabel("busbw (GB/s)")
  ratio.set_ylabel("lax time / jaxcc time")
  bw.legend(fontsize=6, ncol=2)
  ratio.legend(fontsize=7)
  first = rows[0]
  fig.suptitle(f"jaxcc vs lax, {first['ranks']} ranks, {first['where']}, executor "
               f"{first['executor']}, codec {first['codec']}", fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


class Progress:
  """A one-line text progress bar: ``[#####-----] 12/40 label 31 s``, redrawn on ``stream``.

  Args:
    total: the number of steps.
    stream: where to draw (stderr by default).
  """

  def __init__(self, total: int, stream=None, width: int = 30):
    self.total, self.done, self.label = total, 0, ""
    self._stream = stream or sys.stderr
    self._width = width
    self._start = time.monotonic()
    self._lock = threading.Lock()

  def advance(self, steps: int = 1, label: str | None = None) -> None:
    """Count ``steps`` more done (and set the label, if given); redraw."""
    with self._lock:
      self.done = min(self.total, self.done + steps)
      if label is not None:
        self.label = label
      filled = self._width * self.done // max(self.total, 1)
      self._stream.write(f"\r[{'#' * filled}{'-' * (self._width - filled)}] "
                         f"{self.done}/{self.total} {self.label} "
                         f"{time.monotonic() - self._start:.0f} s\x1b[K")
      self._stream.flush()

  @contextlib.contextmanager
  def following(self, path: str | os.PathLike, label: str = "", poll_s: float = 0.2):
    """While the block runs, advance one step per line appended to the file at ``path``.

    The label becomes ``label`` followed by the file's last line.
    """
    seen = [0]
    stop = threading.Event()

    def catch_up():
      try:
        with open(path) as f:
          lines = f.read().splitlines()
      except FileNotFoundError:
        return
      if len(lines) > seen[0]:
        self.advance(len(lines) - seen[0], f"{label} {lines[-1]}".strip())
        seen[0] = len(lines)

    def poll():
      while not stop.wait(poll_s):
        catch_up()

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
      yield
    finally:
      stop.set()
      thread.join()
      catch_up()

  def close(self) -> None:
    """End the bar's line."""
    self._stream.write("\n")
    self._stream.flush()
