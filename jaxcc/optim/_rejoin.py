"""Rejoin: a restarted gossip worker takes parameters and optimizer state from a live peer.

A gossip worker whose process died is a lost peer to the others (it leaves
their ``live`` set; ``gossip_diloco``). Restarted with the same process id,
in a job whose coordination service marks its tasks recoverable
(``jaxcc.launcher``'s runs apart from the workers and does; with
``jax.distributed.initialize`` alone, ``jax_enable_recoverability`` on in
process 0, which then hosts the service and must not die), it calls
``rejoin``; the live workers call ``admit`` at the start of every round.
The protocol, with the job's key-value store for three small keys and jaxcc's
TCP transport for the state:

1. *Ask.* The restarted process q (incarnation k, from
   ``jaxcc.launcher``'s ``JAXCC_INCARNATION`` or ``rejoin``'s argument)
   starts its TCP transport (which reconnects to every process) and puts
   ``ready/q = k``.
2. *Decide.* At the start of each round every live worker puts ``round/p``
   (p itself, the round it starts). At the start of round r every live
   worker that sees ``ready/q`` for an incarnation it has not admitted
   proposes ``decision/q/k = (m + 2, source)``, m the latest round any worker
   put (r at least), with a write that fails if the key exists: the first
   proposal stands, whoever made it, and every worker reads the same
   decision. The
   source is the first live process after q in ring order (q + 1, q + 2, ...
   modulo the process count) that has put round r or a later one: a
   neighbour rather than a fixed process, so rejoins of processes far apart
   on the ring draw on different peers, and process 0 is a source only where
   it is the first such one after q. A view may not have seen a death in the
   round it happened in (the sync came first); a process that has not
   reached round r (dead, restarting, or behind) is passed over. Gossip
   lets workers drift rounds apart (a lost peer breaks the ring into a
   chain); counted from the furthest one, two rounds of slack let every
   worker see the decision before its round. One that sees it too late (past
   the round) fails, naming the rounds.
3. *Admit.* Until the decided round every live worker keeps q's ranks out of
   its view (one that had not seen q lost takes them out); at its start it
   marks q's ranks live again in each ``GossipDiLoCoState`` of its tree (from
   that round on they exchange with it), and the source sends q, over the
   transport (``tcp_send_bytes``), its own tree's local shards and its
   transport's instance counts for its ranks, in one message.
4. *Take.* q receives them, loads the shards into its tree (local shard i
   of the source into local shard i of q), takes the counts as its ranks'
   (so its next exchanges meet the others') and resumes at the decided round.

A rejoiner that dies before its round (killed while it waits) is lost again:
the source finds its connection closed and sends nothing, the workers'
exchanges take it out of their views at their next sync, and its next
incarnation asks anew (``ready/q = k + 1``: a new decision, from the views
of that round).

A stuck worker (stopped, or cut off: it sent nothing for half a round while
a peer waited for its piece; ``jaxcc._src.gossip_exchange``) is dropped by
each peer that waited for it: the peer closes its connection, so it leaves
that peer's ``live`` set as a killed worker does. It rejoins the same way,
without a restart:

5. *Told.* At the start of each round every live worker p puts
   ``dropped/q = a`` and ``dropped/q/by/p = a`` for each process q it
   dropped as stuck, a being the incarnation of q it admitted last (0: none).
6. *Rejoin.* At the start of each of its rounds q reads ``dropped/q``; if it
   names q's current incarnation, q connects again to each process whose
   connection it lost or that dropped it (one that refuses is dead) and runs
   steps 1 and 4 as incarnation a + 1 (``admit`` does it and returns the
   round to resume at).

A partition must not leave two parts each training as if it were the job.
Every process of the job is, to a worker, heard (its connection is up and
sent a byte, a beat at least, within the last 500 ms), unheard (silent that
long, or dropped as stuck: it may be alive on the other side of a cut), or
dead (its connection was closed or reset: its process is gone, so it trains
nowhere). Where the worker and the processes it hears are not more than those
it does not, it is cut off from the job's majority:

7. *Cut off.* At the start of a round such a worker does not train on. It
   says so (a warning on the ``jaxcc`` logger naming the unheard processes)
   and waits until it hears a majority again (a cut shorter than the peers'
   patience) or the majority has dropped it (``dropped/q``, readable once the
   cut heals), then rejoins as in 6. ``Admission.cut_off_s`` is how long it
   waited. Parts of equal size both wait: neither is a majority, and each
   fails after ``timeout_s``, naming the processes it does not hear.

Bytes: the source's local shards of the tree once (parameters, AdamW's two
moments and the gossip state's anchor, momentum and mix buffer: about 6x the
parameters), plus a few bytes per call site, at the transport's rate; nothing
from the other workers.

The tree's arrays are global jax Arrays whose leading axis is the workers'
axis (what ``init`` and the step give inside ``jax.shard_map`` with
``P(axis_name)``): row r of each ``GossipDiLoCoState.live`` is rank r's view,
and the sharding tells which process holds which ranks.
The key-value store (the jax.distributed coordination service's) carries the
two keys per rejoin and one write per worker per round; a worker polls
``ready`` and ``decision`` once per round per lost process.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import time
from typing import Any, NamedTuple

import jax
import numpy as np

from jaxcc._src import compat, config, ffi, tcp_bootstrap
from jaxcc.optim._gossip import GossipDiLoCoState

_KV = "jaxcc/rejoin"
_TAG = 1 << 40  # host message tags of rejoins: _TAG + incarnation
_STUCK = "stuck past"  # in the reason of a connection the gossip exchange dropped
_POLL_S = 0.1  # a cut-off worker looks again this often
logger = logging.getLogger("jaxcc")
_rejoined_as: int | None = None  # the incarnation this process took by its latest rejoin


class Admission(NamedTuple):
  """What ``admit`` did at the start of a round.

  Attributes:
    tree: the tree, with this round's rejoiners live (or, where ``resume_at`` is
      set, the source's tree as this process').
    joined: the processes taken back at this round.
    resume_at: None, or this process was dropped as stuck and rejoined: the round
      it resumes at (its first inner step is ``resume_at * sync_every``).
    cut_off_s: how long this process waited, cut off from the job's majority, before
      it went on (0.0: it was not).
  """
  tree: Any
  joined: list[int]
  resume_at: int | None
  cut_off_s: float = 0.0


def _incarnation() -> int:
  """This process' incarnation: its latest rejoin's, else the launcher's ``JAXCC_INCARNATION``."""
  if _rejoined_as is not None:
    return _rejoined_as
  return int(os.environ.get("JAXCC_INCARNATION", "0"))


def rejoin(tree, *, incarnation: int | None = None, timeout_s: float | None = None):
  """Take ``tree`` (this process' freshly initialised params and optimizer state, any pytree of
  jax Arrays laid out as the live workers' are) from a live peer; call once after a restart,
  before the first step, and once that step is compiled (``jax.jit(...).lower(...).compile()``):
  from the decided round on its peers wait for its pieces.

  Args:
    tree: this process' tree, the template: its structure, shapes, dtypes and shardings.
    incarnation: how many times this process has restarted (default: the launcher's
      ``JAXCC_INCARNATION``).
    timeout_s: limit of each wait (default ``JAXCC_TIMEOUT_S``).

  Returns:
    ``(tree, round, source)``: the source's tree as this process', the round to resume at
    (its first inner step is ``round * sync_every``) and the process that sent it.

  Raises:
    TimeoutError: no live worker decided within ``timeout_s`` (none is running rounds).
    RuntimeError: the source's connection was lost before its message came.
  """
  me = jax.process_index()
  k = int(os.environ.get("JAXCC_INCARNATION", "0")) if incarnation is None else incarnation
  if k < 1:
    raise ValueError(f"jaxcc.optim.rejoin: process {me} is not a restarted one (incarnation "
                     f"{k}); a process that starts with the job initialises its state itself")
  timeout_s = config.timeout_s() if timeout_s is None else timeout_s
  mine = _ranks_of(tree, me)  # before any wait: a tree without the gossip state fails here
  tcp_bootstrap.ensure_started()
  cpu = ffi.load().cpu
  for q in range(jax.process_count()):
    # Lost here, or dropped there: a cut may keep the peer's close from this side for seconds.
    if q != me and (cpu.tcp_lost(q) or
                    compat.kv_try_get(f"{_KV}/dropped/{me}/by/{q}") == str(k - 1)):
      with contextlib.suppress(OSError, TimeoutError, ConnectionError):  # refused: q is dead
        tcp_bootstrap.reconnect(q)
  compat.kv_set(f"{_KV}/ready/{me}", str(k), overwrite=True)
  round_, source = _parse(compat.kv_get(f"{_KV}/decision/{me}/{k}", timeout_s))
  blob = cpu.tcp_recv_bytes(source, _TAG + k, 1 << 40, timeout_s)
  got = np.load(io.BytesIO(blob), allow_pickle=False)
  leaves, treedef = jax.tree.flatten(tree)
  tree = jax.tree.unflatten(treedef, [_with_local_shards(a, [got[f"a{i}_{j}"] for j in range(
      len(a.addressable_shards))]) for i, a in enumerate(leaves)])
  theirs = {int(r): i for i, r in enumerate(got["ranks"])}
  cpu.tcp_set_instances([(int(o), int(g), mine[theirs[int(r)]], int(c))
                         for o, g, r, c in got["instances"] if int(r) in theirs])
  global _rejoined_as
  _rejoined_as = k
  return tree, round_, source


def admit(tree, round_: int, admitted: dict[int, int], *, wait_for=(),
          timeout_s: float | None = None):
  """At the start of round ``round_`` on a live worker: take back processes that asked to rejoin.

  Call it before the round's first inner step, on every live worker, every
  round (it costs one key-value write, one read per process that is not live
  here, and one for this process). It marks a rejoining process' ranks live in every
  ``GossipDiLoCoState`` of ``tree`` at its decided round, and the source
  process sends it ``tree``. It tells the processes this one dropped as stuck
  so; if a peer dropped this one, it rejoins (``rejoin``) before it returns. A
  worker cut off from the job's majority waits first (see the module).

  Args:
    tree: this worker's params and optimizer state (a pytree of jax Arrays).
    round_: the round about to start.
    admitted: a dict this worker keeps across rounds (starts empty): per process, the
      incarnation it admitted last.
    wait_for: processes whose request to rejoin this worker waits for at this round (from
      an incarnation after the one it admitted last), live in its view or not (a
      benchmark's fixed schedule; every live worker must name the same at the same round,
      and the others wait on it meanwhile).
    timeout_s: limit of each wait (default ``JAXCC_TIMEOUT_S``).

  Returns:
    An ``Admission``: the tree, the processes taken back, the round to resume at if
    this process rejoined, and how long it waited cut off.

  Raises:
    RuntimeError: this process was cut off from the job's majority for ``timeout_s``.
    TimeoutError: a process of ``wait_for`` did not ask within ``timeout_s``.
  """
  me, n = jax.process_index(), jax.process_count()
  timeout_s = config.timeout_s() if timeout_s is None else timeout_s
  live = _live_processes(_first_gossip(tree, "jaxcc.optim.admit").live, n)
  cpu = ffi.load().cpu
  cut_off_s = _wait_while_cut_off(cpu, me, n, round_, timeout_s)
  # A cut that began less than 500 ms ago passes that check; the store's calls then wait
  # for it to heal, and may fail once as it heals.
  _retrying(lambda: compat.kv_set(f"{_KV}/round/{me}", str(round_), overwrite=True), timeout_s)
  dropped = _retrying(lambda: compat.kv_try_get(f"{_KV}/dropped/{me}"), timeout_s)
  if dropped == str(_incarnation()):
    tree, resume_at, _ = rejoin(tree, incarnation=_incarnation() + 1, timeout_s=timeout_s)
    return Admission(tree, [], resume_at, cut_off_s)
  joined = []
  for q in range(n):
    if q == me or (live[q] and q not in wait_for):  # this view may not have seen q lost yet
      continue
    if _STUCK in cpu.tcp_lost(q):
      for key in (f"{_KV}/dropped/{q}", f"{_KV}/dropped/{q}/by/{me}"):
        compat.kv_set(key, str(admitted.get(q, 0)), overwrite=True)
    asked = (_await_request(q, admitted.get(q, 0), timeout_s) if q in wait_for else
             compat.kv_try_get(f"{_KV}/ready/{q}"))
    if asked is None or int(asked) <= admitted.get(q, 0):
      continue
    k = int(asked)
    key = f"{_KV}/decision/{q}/{k}"
    decision = compat.kv_try_get(key)
    if decision is None:
      rounds = {p: int(r) for p in range(n) if p != q
                and (r := compat.kv_try_get(f"{_KV}/round/{p}")) is not None}
      # This process qualifies: it is live here and put this round.
      source = next(s for s in ((q + i) % n for i in range(1, n))
                    if live[s] and rounds.get(s, -1) >= round_)
      furthest = max([round_, *rounds.values()])
      try:
        compat.kv_set(key, f"{furthest + 2}/{source}")
      except jax.errors.JaxRuntimeError:  # another worker's proposal came first: it stands
        pass
      decision = compat.kv_get(key, timeout_s)
    at, source = _parse(decision)
    if at < round_:
      raise RuntimeError(f"jaxcc.optim.admit: process {me} is at round {round_}, past round "
                         f"{at} at which process {q} rejoins; it ran more than two rounds "
                         "ahead of the furthest round the others had put when they decided")
    if at != round_:  # not before its round, in a view that had not seen it lost either
      tree = _set_live(tree, q, False) if live[q] else tree
      continue
    tree = _set_live(tree, q, True)
    admitted[q] = k
    joined.append(q)
    if source == me:
      leaves = jax.tree.leaves(tree)
      buf = io.BytesIO()
      ranks = _ranks_of(tree, me)
      counts = np.asarray(cpu.tcp_instances(), np.int64).reshape(-1, 4)
      np.savez(buf, ranks=np.asarray(ranks, np.int64),
               instances=counts[np.isin(counts[:, 2], ranks)],
               **{f"a{i}_{j}": np.asarray(s.data) for i, a in enumerate(leaves)
                  for j, s in enumerate(a.addressable_shards)})
      try:
        cpu.tcp_send_bytes(q, _TAG + k, buf.getvalue())
      except RuntimeError as e:  # q died asking; the exchange takes it out of the view
        logger.warning("jaxcc.optim.admit: process %d could not send its state to process %d, "
                       "incarnation %d, rejoining at round %d: %s", me, q, k, round_, e)
  return Admission(tree, joined, None, cut_off_s)


def _reach(cpu, me: int, n: int) -> tuple[list[int], list[int]]:
  """The processes this one hears, and those it does not hear that may be alive (see the
  module); the dead are in neither."""
  heard, unheard = [], []
  for q in range(n):
    if q == me:
      continue
    lost = cpu.tcp_lost(q)
    if not lost:
      # Silent as long as a wait's least patience (five beats): unheard.
      (heard if cpu.tcp_silent_s(q) < cpu.tcp_stuck_floor_s else unheard).append(q)
    elif _STUCK in lost:
      unheard.append(q)
  return heard, unheard


def _await_request(q: int, after: int, timeout_s: float) -> str:
  """``ready/q`` once it names an incarnation after ``after``."""
  deadline = time.monotonic() + timeout_s
  while (asked := compat.kv_try_get(f"{_KV}/ready/{q}")) is None or int(asked) <= after:
    if time.monotonic() > deadline:
      raise TimeoutError(f"jaxcc.optim.admit: process {q} did not ask to rejoin (as an "
                         f"incarnation after {after}) within {timeout_s:g} s")
    time.sleep(_POLL_S)
  return asked


def _retrying(call, timeout_s: float):
  """``call()``, called again while the key-value store is unavailable (a cut healing), for
  up to ``timeout_s``."""
  began = time.monotonic()
  while True:
    try:
      return call()
    except jax.errors.JaxRuntimeError as e:
      if "UNAVAILABLE" not in str(e) or time.monotonic() - began > timeout_s:
        raise
    time.sleep(_POLL_S)


def _wait_while_cut_off(cpu, me: int, n: int, round_: int, timeout_s: float) -> float:
  """Waits while this process is cut off from the job's majority (step 7 of the module), until
  it hears a majority again or the majority dropped it; returns the seconds it waited."""
  heard, unheard = _reach(cpu, me, n)
  if 1 + len(heard) > len(unheard):
    return 0.0
  logger.warning("jaxcc.optim.admit: process %d at round %d hears processes %s and not %s (silent "
                 "or dropped as stuck): cut off from the job's majority, it waits to rejoin "
                 "rather than train alone", me, round_, heard, unheard)
  began = time.monotonic()
  while 1 + len(heard) <= len(unheard):
    # The key-value store may be cut off too: its calls fail until the cut heals.
    with contextlib.suppress(jax.errors.JaxRuntimeError):
      if compat.kv_try_get(f"{_KV}/dropped/{me}") == str(_incarnation()):
        break
    if time.monotonic() - began > timeout_s:
      raise RuntimeError(f"jaxcc.optim.admit: process {me} was cut off for {timeout_s:g} s at "
                         f"round {round_}: it hears processes {heard}, not {unheard}, and no "
                         "majority dropped it (a cut into equal parts leaves none)")
    time.sleep(_POLL_S)
    heard, unheard = _reach(cpu, me, n)
  return time.monotonic() - began


def _parse(decision: str) -> tuple[int, int]:
  at, source = decision.split("/")
  return int(at), int(source)


def _is_gossip(x) -> bool:
  return isinstance(x, GossipDiLoCoState)


def _rank_processes(live: jax.Array) -> list[int]:
  """The process of each rank along the workers' axis, from the sharding of ``live`` (n, n)."""
  procs = [-1] * live.shape[0]
  for device, index in live.sharding.devices_indices_map(live.shape).items():
    for r in range(*index[0].indices(live.shape[0])):
      procs[r] = device.process_index
  return procs


def _live_processes(live: jax.Array, n: int) -> list[bool]:
  """Per process, whether this worker's view has its ranks live."""
  procs = _rank_processes(live)
  view = np.asarray(live.addressable_shards[0].data).reshape(-1, live.shape[-1])[0]
  out = [False] * n
  for r, p in enumerate(procs):
    out[p] = out[p] or bool(view[r])
  return out


def _first_gossip(tree, api: str) -> GossipDiLoCoState:
  """The first GossipDiLoCoState in ``tree``."""
  for s in jax.tree.leaves(tree, is_leaf=_is_gossip):
    if _is_gossip(s):
      return s
  raise ValueError(f"{api}: the tree holds no GossipDiLoCoState")


def _ranks_of(tree, process: int) -> list[int]:
  """The ranks of ``process`` along the workers' axis, in order."""
  live = _first_gossip(tree, "jaxcc.optim.rejoin").live
  return [r for r, p in enumerate(_rank_processes(live)) if p == process]


def _set_live(tree, q: int, value: bool):
  """``tree`` with process ``q``'s ranks live (or not) in every GossipDiLoCoState."""

  def fix(s):
    if not _is_gossip(s):
      return s
    ranks = [r for r, p in enumerate(_rank_processes(s.live)) if p == q]
    shards = []
    for shard in s.live.addressable_shards:
      data = np.asarray(shard.data).copy()
      data[..., ranks] = value
      shards.append(data)
    return s._replace(live=_with_local_shards(s.live, shards))

  return jax.tree.map(fix, tree, is_leaf=_is_gossip)


def _with_local_shards(like: jax.Array, shards: list[np.ndarray]) -> jax.Array:
  """A global array like ``like`` whose addressable shards hold ``shards``, in order."""
  return jax.make_array_from_single_device_arrays(
      like.shape, like.sharding,
      [jax.device_put(np.asarray(d, like.dtype).reshape(s.data.shape), s.device)
       for d, s in zip(shards, like.addressable_shards)])
