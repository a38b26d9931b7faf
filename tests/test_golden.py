"""Golden schedules: every algorithm's table at small sizes, compared exactly with tests/golden/.

Each file holds one planned schedule as text (its attributes, then one line
per transfer: step, src, dst, src_start, dst_start, length, op), so a change
to an algorithm shows as a diff of the transfers it moves. ``auto.txt`` holds
what ``algorithm="auto"`` picks. After an intended change, regenerate with

  .venv/bin/python -m tests.test_golden --regenerate

and review the diff.
"""

from __future__ import annotations

import pathlib
import sys
from typing import Callable

import pytest

import jaxcc
from jaxcc import Topology
from jaxcc.schedules.ir import OP_NAMES

GOLDEN = pathlib.Path(__file__).parent / "golden"
BANDWIDTH = 1e9


def _topology(p: int, stragglers: tuple[tuple[int, float], ...]) -> Topology:
  topo = Topology.uniform(p, BANDWIDTH)
  for rank, fraction in stragglers:
    topo = topo.with_straggler(rank, fraction)
  return topo


def _describe(p: int, stragglers) -> str:
  return f"uniform({p}, {BANDWIDTH:g})" + "".join(
      f".with_straggler({r}, {f:g})" for r, f in stragglers)


# (collective, algorithm, p, stragglers, elements per rank, chunks, extra plan arguments)
_STRAGGLERS = {3: ((1, 0.5),), 4: ((2, 0.25),)}
_LEAVES = ((1, 0.1), (3, 0.2))  # optcc: two ranks too slow to own a shard
_PERMS = {3: ((0, 2), (2, 1), (1, 0)), 4: ((0, 3), (3, 0), (1, 1))}
CASES = (
    [("all_reduce", alg, p, (), 29, k, {}) for alg in ("ring", "direct")
     for p in (3, 4) for k in (1, 2)]
    + [("all_reduce", alg, p, _STRAGGLERS[p], 29, k, {}) for alg in ("optcc", "r2ccl")
       for p in (3, 4) for k in (1, 2)]
    + [("all_reduce", "optcc", 4, _LEAVES, 29, k, {}) for k in (1, 2)]
    + [(coll, alg, p, (), 7 * p, k, {}) for coll in ("reduce_scatter", "all_gather")
       for alg in ("ring", "direct") for p in (3, 4) for k in (1, 2)]
    + [("broadcast", "ring", p, (), 11, k, {"root": 1}) for p in (3, 4) for k in (1, 2)]
    + [("broadcast", "direct", p, (), 11, 1, {"root": 1}) for p in (3, 4)]
    + [("ppermute", "direct", p, (), 11, k, {"perm": _PERMS[p]}) for p in (3, 4) for k in (1, 2)]
)
# What "auto" picks (at the depth planner.depth gives): (collective, p, stragglers, nbytes).
AUTO_CASES = [
    ("all_reduce", 4, (), 4 << 10),
    ("all_reduce", 4, (), 8 << 20),
    ("all_reduce", 4, ((2, 0.25),), 8 << 20),
    ("all_reduce", 8, ((5, 0.5),), 8 << 20),
    ("reduce_scatter", 4, (), 8 << 20),
    ("all_gather", 4, ((1, 0.5),), 8 << 20),
    ("broadcast", 4, (), 8 << 20),
]


def _case_name(case) -> str:
  coll, alg, p, stragglers, _, k, _ = case
  slow = "-straggler" if stragglers else ""
  slow = "-leaves" if stragglers == _LEAVES else slow
  return f"{coll}-{alg}-p{p}{slow}-c{k}"


def _render(case) -> str:
  coll, alg, p, stragglers, length, k, extra = case
  args = "".join(f", {key}={value!r}" for key, value in extra.items())
  call = (f"jaxcc.plan({coll!r}, {4 * length}, {_describe(p, stragglers)}, {alg!r}, "
          f"itemsize=4, chunks={k}{args})")
  s = jaxcc.plan(coll, 4 * length, _topology(p, stragglers), alg, itemsize=4, chunks=k, **extra)
  lines = [f"# {call}",
           f"collective {s.collective}", f"algorithm {s.algorithm}", f"nranks {s.nranks}",
           f"length {s.length}", f"itemsize {s.itemsize}", f"num_steps {s.num_steps}",
           f"root {s.root}", f"chunks {s.chunks}",
           "perm " + (" ".join(f"{a}->{b}" for a, b in s.perm) or "none"),
           "# step src dst src_start dst_start length op"]
  lines += [" ".join(map(str, row[:-1].tolist())) + " " + OP_NAMES[int(row[-1])]
            for row in s.table]
  return "\n".join(lines) + "\n"


def _render_auto() -> str:
  lines = ["# jaxcc.plan(collective, nbytes, topology, 'auto'): the algorithm and depth it picks"]
  for coll, p, stragglers, nbytes in AUTO_CASES:
    s = jaxcc.plan(coll, nbytes, _topology(p, stragglers), "auto")
    lines.append(f"{coll} {nbytes} {_describe(p, stragglers)} -> {s.algorithm} "
                 f"chunks={s.chunks} steps={s.num_steps} transfers={len(s.table)}")
  return "\n".join(lines) + "\n"


def _goldens() -> dict[str, Callable[[], str]]:
  out = {f"{_case_name(case)}.txt": (lambda case=case: _render(case)) for case in CASES}
  out["auto.txt"] = _render_auto
  return out


@pytest.mark.parametrize("name", sorted(_goldens()))
def test_golden(name):
  path = GOLDEN / name
  assert path.exists(), f"{path} is missing; run python -m tests.test_golden --regenerate"
  assert _goldens()[name]() == path.read_text(), (
      f"{name}: the schedule differs from the golden one; if intended, run "
      f"python -m tests.test_golden --regenerate and review the diff")


def test_golden_schedules_are_correct():
  for case in CASES:
    coll, alg, p, stragglers, length, k, extra = case
    jaxcc.sim.check(jaxcc.plan(coll, 4 * length, _topology(p, stragglers), alg, chunks=k,
                               **extra))


def test_no_stray_golden_files():
  assert sorted(f.name for f in GOLDEN.glob("*.txt")) == sorted(_goldens())


def _regenerate() -> None:
  GOLDEN.mkdir(exist_ok=True)
  for stale in GOLDEN.glob("*.txt"):
    stale.unlink()
  for name, render in _goldens().items():
    (GOLDEN / name).write_text(render())
  print(f"wrote {len(_goldens())} files to {GOLDEN}")


if __name__ == "__main__":
  if sys.argv[1:] != ["--regenerate"]:
    sys.exit("usage: python -m tests.test_golden --regenerate")
  _regenerate()
