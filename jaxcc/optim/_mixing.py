"""One worker's side of a gossip mixing round, with seeded message drops and a failed worker."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxcc._src import compat, gossip_exchange
from jaxcc.collectives import all_reduce, ppermute
from jaxcc.optim._graphs import phases


class Mixer:
  """Mixes a vector over the graph along ``axis_name``; built at trace time inside shard_map.

  A mixing round is named by its outer round ``t`` and an ``op`` index within
  it (0: the overlapped anchor mix, 1 + r: blocking mix r). Which messages of
  a round are lost is drawn from ``fold_in(fold_in(key(seed), t), op)``: the
  same bits on every worker, so sender and receiver agree without talking.
  The failed worker, from round ``fail_round`` on, neither sends nor receives.
  Each receiver divides by the weight of what arrived (its own vector always
  arrives), so its weights still sum to one.

  Across processes (``by_exchange``: the job has more than one process and the
  graph is not "complete"), on any backend, a message travels by jaxcc's
  gossip exchange over its TCP transport (``gossip_exchange``: an FFI call on
  the CPU, host callbacks elsewhere), which may finish in a later program than
  it starts.
  A peer whose connection is lost, or that is not ``live`` in this worker's
  view, is a lost message. Within one process ``lax.ppermute`` (jaxcc's)
  carries it: the pure-JAX twin, equal bit for bit.
  """

  def __init__(self, api: str, axis_name: str, graph: str, *, drop_rate: float,
               failed_worker: int | None, fail_round: int, seed: int, codec, algorithm: str,
               topology):
    self.n = compat.axis_size(axis_name, api)
    if failed_worker is not None and not 0 <= failed_worker < self.n:
      raise ValueError(f"{api}: failed_worker={failed_worker} is not a worker of axis "
                       f"{axis_name!r} (size {self.n})")
    self.axis_name, self.graph, self.codec = axis_name, graph, codec
    self.drop_rate, self.failed_worker, self.fail_round = drop_rate, failed_worker, fail_round
    self.seed, self.algorithm, self.topology = seed, algorithm, topology
    self.phases = phases(graph, self.n)
    self.me = lax.axis_index(axis_name)
    self.by_exchange = graph != "complete" and jax.process_count() > 1

  @property
  def slots(self) -> int:
    """Messages a worker receives (and sends) per mixing round."""
    return len(self.phases[0])

  @property
  def num_phases(self) -> int:
    return len(self.phases)

  def arrived(self, t: jax.Array, op: int, phase: jax.Array) -> jax.Array:
    """Which messages reach this worker in round (t, op).

    Returns:
      For "complete", a bool ``(n,)`` over senders (all False on a failed
      worker); otherwise a bool ``(k,)`` over the shifts of ``phase``.
    """
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(self.seed), t), op)
    alive = self._alive(t)
    if self.graph == "complete":
      return (jax.random.uniform(key, (self.n,)) >= self.drop_rate) & alive & alive[self.me]
    shifts = jnp.asarray(self.phases, jnp.int32)[phase]
    ok = jax.random.uniform(key, (len(self.phases[0]), self.n)) >= self.drop_rate
    return ok[:, self.me] & alive[self.me] & alive[(self.me - shifts) % self.n]

  def peers(self, t: jax.Array, op: int, phase: jax.Array, live: jax.Array):
    """The ranks this worker sends to and receives from in round (t, op): int32 ``(k,)``, -1 none.

    A message is left out when it is dropped (``arrived`` on its receiver's
    side), or its sender or receiver failed or is not ``live`` (bool ``(n,)``).
    """
    shifts = jnp.asarray(self.phases, jnp.int32)[phase]
    dst, src = (self.me + shifts) % self.n, (self.me - shifts) % self.n
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(self.seed), t), op)
    ok = jax.random.uniform(key, (len(self.phases[0]), self.n)) >= self.drop_rate
    alive = self._alive(t)
    sends = ok[jnp.arange(len(self.phases[0])), dst] & alive[self.me] & alive[dst] & live[dst]
    receives = self.arrived(t, op, phase) & live[src]
    return jnp.where(sends, dst, -1), jnp.where(receives, src, -1)

  def start(self, x: jax.Array, t: jax.Array, op: int, phase: jax.Array, live: jax.Array,
            after: jax.Array | None = None) -> jax.Array:
    """Starts the gossip exchange of flat ``x`` in round (t, op), after ``after``: its handle."""
    send_to, recv_from = self.peers(t, op, phase, live)
    return gossip_exchange.start(x, send_to, recv_from, self.axis_name, self.codec, after)

  def done(self, handles: jax.Array, like: jax.Array, after: jax.Array | None = None):
    """Gossip exchanges ``handles`` (m,), finished after ``after`` is computed.

    Returns:
      The sum of what arrived per exchange ``(m,) + like.shape``, which slots
      arrived ``(m, k)`` and the peers found lost ``(n,)``.
    """
    got, status, lost = gossip_exchange.done(handles, like, self.slots, self.n, after)
    arrived = status == gossip_exchange.ARRIVED
    return jnp.sum(jnp.where(arrived[..., None], got, 0), axis=1), arrived, lost > 0

  def receive(self, x: jax.Array, arrived: jax.Array, phase: jax.Array) -> jax.Array:
    """The sum of the neighbours' ``x`` that arrived (for "complete", of all arrived, own included).

    Sends ``x`` once to each peer of the phase (``x.nbytes`` per peer), or
    all-reduces it for "complete" (``2(n-1)/n x.nbytes`` on a ring).
    """
    if self.graph == "complete":
      return all_reduce(jnp.where(arrived[self.me], x, 0), self.axis_name,
                        algorithm=self.algorithm, topology=self.topology, codec=self.codec)
    if not self.phases[0]:
      return jnp.zeros_like(x)
    branches = [lambda v, shifts=shifts: self._shift_all(v, shifts) for shifts in self.phases]
    got = branches[0](x) if len(branches) == 1 else lax.switch(phase, branches, x)
    return jnp.sum(jnp.where(arrived.reshape((-1,) + (1,) * x.ndim), got, 0), axis=0)

  def combine(self, x: jax.Array, received: jax.Array, arrived: jax.Array) -> jax.Array:
    """This worker's mixed vector: own ``x`` and ``received``, renormalised over what arrived."""
    others = jnp.sum(arrived, dtype=x.dtype)
    if self.graph == "complete":
      own = ~arrived[self.me]  # its own contribution is in ``received`` when it arrived
      # A failed worker (nothing arrived) still took part in the all-reduce: ignore its result.
      return (jnp.where(own, x, 0) + jnp.where(others > 0, received, 0)) / (own + others)
    return (x + received) / (1 + others)

  def mix(self, x: jax.Array, t: jax.Array, op: int, phase: jax.Array, live: jax.Array,
          after: jax.Array | None = None):
    """One blocking mixing round of ``x`` (after ``after``): (mixed x, the peers found lost,
    bool ``(n,)``)."""
    if self.by_exchange:
      handle = self.start(x, t, op, phase, live, after)
      received, arrived, lost = self.done(handle[None], x)
      return self.combine(x, received[0], arrived[0]), lost
    arrived = self.arrived(t, op, phase)
    return self.combine(x, self.receive(x, arrived, phase), arrived), jnp.zeros(self.n, bool)

  def _alive(self, t: jax.Array) -> jax.Array:
    ranks = jnp.arange(self.n)
    return (ranks != (-1 if self.failed_worker is None else self.failed_worker)) | (
        t < self.fail_round)

  def _shift_all(self, x, shifts):
    n = self.n
    return jnp.stack([ppermute(x, self.axis_name, [(j, (j + s) % n) for j in range(n)],
                               codec=self.codec) for s in shifts])
