"""Runs jax's own tests/shard_map_test.py with lax's collectives and with jaxcc's, and compares.

The test file comes from a git directory of jax's source (``--jax-git``), at
the tag ``jax-vX.Y.Z`` of the installed jax or else the newest one below it,
extracted at run time into a temporary directory (with the files of jax's
tests/ folder it imports). Pass 1 runs it as is; pass 2 loads the plugin
``lax_to_jaxcc`` (beside this file), which makes the test module's
``lax.psum``, ``pmean``, ``pmax``, ``pmin``, ``all_gather``, ``psum_scatter``
and ``ppermute`` call jaxcc's. Each pass is one pytest
subprocess on 8 virtual CPU devices.

Prints the totals and the tests "lost" (passed with lax, not with jaxcc) with
the exception and the first line of its message; writes the per-test outcomes
to ``--out`` as JSON. Exits 1 when a test is lost, else 0.

  python tests/lax_conformance/run_shard_map_conformance.py --jax-git DIR
"""

from __future__ import annotations

import argparse
import ast
import collections
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TEST_FILE = "tests/shard_map_test.py"


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--jax-git", required=True,
                      help="a git directory of jax's source (bare is fine)")
  parser.add_argument("--out", help="the JSON file (default: "
                      "benchmarks/shard_map_conformance_<jax version>.json)")
  parser.add_argument("-k", dest="select", help="run only the tests that match (pytest's -k)")
  parser.add_argument("--timeout", type=float, default=7200, help="seconds each pass may take")
  args = parser.parse_args(argv)

  version = importlib.metadata.version("jax")
  tag = pick_tag(args.jax_git, version)
  out = pathlib.Path(args.out or ROOT / "benchmarks" / f"shard_map_conformance_{version}.json")
  sys.path.insert(0, str(HERE))
  import lax_to_jaxcc  # noqa: E402 (jax and jaxcc start only now; no backend runs here)
  replaced = sorted(lax_to_jaxcc.wrappers())

  print(f"jax {version}: {TEST_FILE} at {tag}; lax.{{{', '.join(replaced)}}} -> jaxcc", flush=True)
  with tempfile.TemporaryDirectory(prefix="shard_map_conformance_") as tmp:
    tmp = pathlib.Path(tmp)
    test_file = extract(args.jax_git, tag, tmp)
    runs = {}
    for name, plugin in (("lax", None), ("jaxcc", "lax_to_jaxcc")):
      print(f"pass {name}: running ...", flush=True)
      runs[name] = run_pass(test_file, tmp, name, plugin, args.select, args.timeout)
      print(f"pass {name}: {runs[name]['summary']} ({runs[name]['wall_s']:.0f} s)", flush=True)

  lax_out, cc_out = runs["lax"]["outcomes"], runs["jaxcc"]["outcomes"]
  lost = {t: cc_out.get(t, ("missing", "not run with jaxcc"))[1] for t, (o, _) in lax_out.items()
          if o == "passed" and cc_out.get(t, ("missing",))[0] != "passed"}
  gained = sorted(t for t, (o, _) in cc_out.items()
                  if o == "passed" and lax_out.get(t, ("missing",))[0] != "passed")
  report(runs, lost, gained)

  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(json.dumps({
      "jax_version": version,
      "tag": tag,
      "jaxcc_commit": jaxcc_commit(),
      "test_file": TEST_FILE,
      "replaced": [f"lax.{n}" for n in replaced],
      "select": args.select,
      "runs": {name: {"wall_s": round(r["wall_s"], 1), "returncode": r["returncode"],
                      "totals": totals(r["outcomes"]),
                      "outcomes": {t: o for t, (o, _) in sorted(r["outcomes"].items())}}
               for name, r in runs.items()},
      "lost": dict(sorted(lost.items())),
      "gained": gained,
  }, indent=1) + "\n")
  print(f"wrote {out}")
  return 1 if lost else 0


def pick_tag(git_dir: str, version: str) -> str:
  """The tag ``jax-v<version>``, or else the newest ``jax-vX.Y.Z`` tag below ``version``."""
  want = _numbers(version)
  names = subprocess.run(["git", "--git-dir", git_dir, "tag", "--list", "jax-v*"], check=True,
                         capture_output=True, text=True).stdout.split()
  tags = [(_numbers(n[len("jax-v"):]), n) for n in names if re.fullmatch(r"jax-v\d+(\.\d+)*", n)]
  below = [t for t in tags if t[0] <= want]
  if not below:
    raise SystemExit(f"no jax-v* tag at or below jax {version} in {git_dir}")
  return max(below)[1]


def jaxcc_commit() -> str:
  """The checkout's commit, with ``+dirty`` when jaxcc/ or xla_ffi/ has changes not committed."""
  git = ["git", "-C", str(ROOT)]
  head = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True)
  dirty = subprocess.run(git + ["status", "--porcelain", "jaxcc", "xla_ffi"], capture_output=True,
                         text=True).stdout.strip()
  return head.stdout.strip() + ("+dirty" if dirty else "")


def extract(git_dir: str, tag: str, dest: pathlib.Path) -> pathlib.Path:
  """Writes ``TEST_FILE`` at ``tag`` and the files of its folder that it imports (recursively)."""
  folder = os.path.dirname(TEST_FILE)
  listed = subprocess.run(["git", "--git-dir", git_dir, "ls-tree", "--name-only",
                           f"{tag}:{folder}"],
                          check=True, capture_output=True, text=True).stdout.split()
  siblings = {n[:-3] for n in listed if n.endswith(".py")}
  todo, done = [os.path.basename(TEST_FILE)[:-3]], set()
  while todo:
    name = todo.pop()
    if name in done:
      continue
    done.add(name)
    text = subprocess.run(["git", "--git-dir", git_dir, "show", f"{tag}:{folder}/{name}.py"],
                          check=True, capture_output=True, text=True).stdout
    (dest / f"{name}.py").write_text(text)
    todo += sorted(_imported(text) & siblings)
  (dest / "pytest.ini").write_text("[pytest]\n")  # this folder is pytest's root: no outer config
  return dest / os.path.basename(TEST_FILE)


def run_pass(test_file: pathlib.Path, tmp: pathlib.Path, name: str, plugin: str | None,
             select: str | None, timeout: float) -> dict:
  """One pytest subprocess over ``test_file``; its per-test outcomes from the junit XML."""
  junit = tmp / f"junit_{name}.xml"
  cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-c", str(tmp / "pytest.ini"),
         f"--junitxml={junit}", str(test_file)]
  if plugin:
    cmd += ["-p", plugin]
  if select:
    cmd += ["-k", select]
  if importlib.util.find_spec("xdist"):
    cmd += ["-n", "auto"]
  env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="8",
             XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") +
                        " --xla_force_host_platform_device_count=8").strip(),
             PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
  start = time.monotonic()
  proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout)
  wall = time.monotonic() - start
  lines = proc.stdout.strip().splitlines()
  if proc.returncode not in (0, 1):  # 1: tests failed; else pytest itself did not run them
    raise SystemExit(f"pass {name}: pytest exited {proc.returncode}:\n"
                     + proc.stdout[-4000:] + proc.stderr[-4000:])
  return {"outcomes": parse_junit(junit), "wall_s": wall, "returncode": proc.returncode,
          "summary": lines[-1] if lines else f"rc {proc.returncode}"}


def parse_junit(path: pathlib.Path) -> dict[str, tuple[str, str]]:
  """Test id ``Class::test`` -> (``passed`` | ``failed`` | ``skipped``, the one-line reason)."""
  out = {}
  for case in ET.parse(path).getroot().iter("testcase"):
    test = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name', '')}"
    outcome, reason = "passed", ""
    for child in case:
      if child.tag in ("failure", "error"):
        outcome, reason = "failed", _reason(child)
        break
      if child.tag == "skipped":
        outcome, reason = "skipped", "skipped: " + (child.get("message") or "").splitlines()[0]
    out[test] = (outcome, reason)
  return out


def totals(outcomes: dict) -> dict:
  counts = collections.Counter(o for o, _ in outcomes.values())
  return {k: counts[k] for k in ("passed", "failed", "skipped")}


def report(runs: dict, lost: dict, gained: list) -> None:
  print()
  print(f"{'':8}{'passed':>8}{'failed':>8}{'skipped':>8}{'wall s':>8}")
  for name, r in runs.items():
    t = totals(r["outcomes"])
    print(f"{name:8}{t['passed']:>8}{t['failed']:>8}{t['skipped']:>8}{r['wall_s']:>8.0f}")
  print(f"lost {len(lost)}, gained {len(gained)}")
  if lost:
    print("\nlost (passed with lax, not with jaxcc):")
    for test, reason in sorted(lost.items(), key=lambda kv: (kv[1], kv[0])):
      print(f"  {test}: {reason}")
  if gained:
    print("\ngained (passed with jaxcc only):")
    for test in gained:
      print(f"  {test}")


def _reason(element) -> str:
  """``ExceptionType: first line of the message`` (its first three lines when the first is only
  the type)."""
  message = element.get("message") or "\n".join(
      l[1:] for l in (element.text or "").splitlines() if l.startswith("E "))
  lines = [l.strip() for l in message.splitlines() if l.strip()] or ["(no message)"]
  return " ".join(lines[:3] if re.fullmatch(r"[\w.]+:", lines[0]) else lines[:1])[:300]


def _imported(text: str) -> set[str]:
  names = set()
  for node in ast.walk(ast.parse(text)):
    if isinstance(node, ast.Import):
      names |= {a.name.split(".")[0] for a in node.names}
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      names.add(node.module.split(".")[0])
  return names


def _numbers(version: str) -> tuple[int, ...]:
  return tuple(int(n) for n in re.findall(r"\d+", version))


if __name__ == "__main__":
  sys.exit(main())
