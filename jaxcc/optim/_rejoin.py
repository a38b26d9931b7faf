"""Rejoin: a restarted gossip worker takes parameters and optimizer state from a live peer.

A gossip worker whose process died is a lost peer to the others (it leaves
their ``live`` set; ``gossip_diloco``). Restarted with the same process id
(``jax_enable_recoverability`` on before ``jax.distributed.initialize``), it
calls ``rejoin``; the live workers call ``admit`` at the start of every round.
The protocol, with the job's key-value store for three small keys and jaxcc's
TCP transport for the state:

1. *Ask.* The restarted process q (incarnation k, from
   ``jaxcc.launcher``'s ``JAXCC_INCARNATION`` or ``rejoin``'s argument)
   starts its TCP transport (which reconnects to every process) and puts
   ``ready/q = k``.
2. *Decide.* At the start of round r every live worker that sees ``ready/q``
   for an incarnation it has not admitted proposes ``decision/q/k = (r + 2,
   source)`` with a write that fails if the key exists: the first proposal
   stands, whoever made it, and every worker reads the same decision. The
   source is the first live process after q in ring order (q + 1, q + 2, ...
   modulo the process count): a neighbour rather than a fixed process, so
   rejoins of processes far apart on the ring draw on different peers, and
   process 0 is a source only where it is the first live one after q. Two
   rounds of slack let workers a round behind the proposer see the decision
   before its round; one that sees it too late (past the round) fails,
   naming the rounds.
3. *Admit.* At the start of the decided round every live worker marks q's
   ranks live again in each ``GossipDiLoCoState`` of its tree (from that
   round on they exchange with it), and the source sends q, over the
   transport (``tcp_send_bytes``), its own tree's local shards and its
   transport's instance counts for its ranks, in one message.
4. *Take.* q receives them, loads the shards into its tree (local shard i
   of the source into local shard i of q), takes the counts as its ranks'
   (so its next exchanges meet the others') and resumes at the decided round.

Bytes: the source's local shards of the tree once (parameters, AdamW's two
moments and the gossip state's anchor, momentum and mix buffer: about 6x the
parameters), plus a few bytes per call site, at the transport's rate; nothing
from the other workers.

The tree's arrays are global jax Arrays whose leading axis is the workers'
axis (what ``init`` and the step give inside ``jax.shard_map`` with
``P(axis_name)``): row r of each ``GossipDiLoCoState.live`` is rank r's view,
and the sharding tells which process holds which ranks.
The key-value store (the jax.distributed coordination service's) carries the
two keys per rejoin; a worker polls ``ready`` and ``decision`` once per round
per lost process.
"""

from __future__ import annotations

import io
import os

import jax
import numpy as np

from jaxcc._src import compat, config, ffi, tcp_bootstrap
from jaxcc.optim._gossip import GossipDiLoCoState

_KV = "jaxcc/rejoin"
_TAG = 1 << 40  # host message tags of rejoins: _TAG + incarnation


def rejoin(tree, *, incarnation: int | None = None, timeout_s: float | None = None):
  """Take ``tree`` (this process' freshly initialised params and optimizer state, any pytree of
  jax Arrays laid out as the live workers' are) from a live peer; call once after a restart,
  before the first step.

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
  compat.kv_set(f"{_KV}/ready/{me}", str(k), overwrite=True)
  round_, source = _parse(compat.kv_get(f"{_KV}/decision/{me}/{k}", timeout_s))
  cpu = ffi.load().cpu
  blob = cpu.tcp_recv_bytes(source, _TAG + k, 1 << 40, timeout_s)
  got = np.load(io.BytesIO(blob), allow_pickle=False)
  leaves, treedef = jax.tree.flatten(tree)
  tree = jax.tree.unflatten(treedef, [_with_local_shards(a, [got[f"a{i}_{j}"] for j in range(
      len(a.addressable_shards))]) for i, a in enumerate(leaves)])
  theirs = {int(r): i for i, r in enumerate(got["ranks"])}
  cpu.tcp_set_instances([(int(o), int(g), mine[theirs[int(r)]], int(c))
                         for o, g, r, c in got["instances"] if int(r) in theirs])
  return tree, round_, source


def admit(tree, round_: int, admitted: dict[int, int], *, wait_for=(),
          timeout_s: float | None = None):
  """At the start of round ``round_`` on a live worker: take back restarted processes that asked.

  Call it before the round's first inner step, on every live worker, every
  round (it costs one key-value read per process that is not live here). It
  marks a rejoining process' ranks live in every ``GossipDiLoCoState`` of
  ``tree`` at its decided round, and the source process sends it ``tree``.

  Args:
    tree: this worker's params and optimizer state (a pytree of jax Arrays).
    round_: the round about to start.
    admitted: a dict this worker keeps across rounds (starts empty): per process, the
      incarnation it admitted last.
    wait_for: processes whose request to rejoin this worker waits for at this round
      (a benchmark's fixed schedule; every live worker must name the same at the same
      round, and the others wait on it meanwhile).
    timeout_s: limit of each wait (default ``JAXCC_TIMEOUT_S``).

  Returns:
    ``(tree, joined)``: the tree, with the rejoiners of this round live, and their process ids.
  """
  me, n = jax.process_index(), jax.process_count()
  timeout_s = config.timeout_s() if timeout_s is None else timeout_s
  live = _live_processes(_first_gossip(tree, "jaxcc.optim.admit").live, n)
  cpu = ffi.load().cpu
  joined = []
  for q in range(n):
    if q == me or live[q]:
      continue
    asked = (compat.kv_get(f"{_KV}/ready/{q}", timeout_s) if q in wait_for else
             compat.kv_try_get(f"{_KV}/ready/{q}"))
    if asked is None or int(asked) <= admitted.get(q, 0):
      continue
    k = int(asked)
    key = f"{_KV}/decision/{q}/{k}"
    decision = compat.kv_try_get(key)
    if decision is None:
      source = next(s for s in ((q + i) % n for i in range(1, n)) if live[s])
      try:
        compat.kv_set(key, f"{round_ + 2}/{source}")
      except jax.errors.JaxRuntimeError:  # another worker's proposal came first: it stands
        pass
      decision = compat.kv_get(key, timeout_s)
    at, source = _parse(decision)
    if at < round_:
      raise RuntimeError(f"jaxcc.optim.admit: process {me} is at round {round_}, past round "
                         f"{at} at which process {q} rejoins; it fell more than two rounds "
                         "behind the worker that decided")
    if at != round_:
      continue
    tree = _set_live(tree, q)
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
      cpu.tcp_send_bytes(q, _TAG + k, buf.getvalue())
  return tree, joined


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


def _set_live(tree, q: int):
  """``tree`` with process ``q``'s ranks live in every GossipDiLoCoState."""

  def fix(s):
    if not _is_gossip(s):
      return s
    ranks = [r for r, p in enumerate(_rank_processes(s.live)) if p == q]
    shards = []
    for shard in s.live.addressable_shards:
      data = np.asarray(shard.data).copy()
      data[..., ranks] = True
      shards.append(data)
    return s._replace(live=_with_local_shards(s.live, shards))

  return jax.tree.map(fix, tree, is_leaf=_is_gossip)


def _with_local_shards(like: jax.Array, shards: list[np.ndarray]) -> jax.Array:
  """A global array like ``like`` whose addressable shards hold ``shards``, in order."""
  return jax.make_array_from_single_device_arrays(
      like.shape, like.sharding,
      [jax.device_put(np.asarray(d, like.dtype).reshape(s.data.shape), s.device)
       for d, s in zip(shards, like.addressable_shards)])
