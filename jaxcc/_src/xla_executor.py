"""The XLA executor: runs any Schedule with XLA collectives — the oracle and fallback.

Each step is split into rounds by the shift ``(dst - src) mod p``; a round is a
partial permutation, so it is one ``lax.ppermute`` of the round's longest
piece, with per-rank offsets and lengths looked up by ``lax.axis_index``.
Copies land through masked ``dynamic_update_slice``; the reduce transfers into
a rank are summed with its own values in one ``jaxcc_reduce`` call, in the
canonical order (ascending shift). Steps run one after another (the IR's
reference semantics), so the native executor must match it bit for bit.
16-bit floats move as their bits (``jaxcc._src.bits``); only the reduction
sees them as floats.
Moves ``p`` times the longest piece of each round: equal pieces cost nothing
extra, weighted shards pay for padding. With a codec every round's piece is
encoded before its ``ppermute`` and decoded after (``encoded_ppermute``):
the same results, bit for bit.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxcc._src import encoded_ppermute
from jaxcc._src.bits import word_of
from jaxcc._src.reduce import reduce_sum
from jaxcc.schedules.ir import (COPY, DST, DST_START, LENGTH, OP, SRC, SRC_START, STEP, Schedule,
                                read_table)


@dataclasses.dataclass(frozen=True)
class _Round:
  perm: tuple[tuple[int, int], ...]
  width: int                 # longest piece of the round
  send_start: np.ndarray     # (p,) where each rank's piece starts (0 if it sends none)
  recv_start: np.ndarray     # (p,) where the received piece lands
  copy_len: np.ndarray       # (p,) elements copied in (0 unless a COPY lands on the rank)
  reduce_len: np.ndarray     # (p,) elements reduced in (0 unless a REDUCE lands on the rank)


@dataclasses.dataclass(frozen=True)
class _Step:
  rounds: tuple[_Round, ...]
  reduce_start: np.ndarray   # (p,) the rank's reduce range
  reduce_len: np.ndarray     # (p,) its length (0: no reduce on this rank)


@functools.lru_cache(maxsize=64)
def _compile(schedule: Schedule) -> tuple[tuple[_Step, ...], int]:
  """The rounds of every step, read from the serialized table (its header checked)."""
  p = schedule.nranks
  table = read_table(schedule.serialized, f"jaxcc.{schedule.collective}")
  bounds = np.searchsorted(table[:, STEP], np.arange(schedule.num_steps + 1))
  steps = []
  pad = 0
  for t in range(schedule.num_steps):
    rows = table[bounds[t]:bounds[t + 1]]
    shift = (rows[:, DST] - rows[:, SRC]) % p
    rounds = []
    red_start = np.zeros(p, np.int64)
    red_len = np.zeros(p, np.int64)
    for s in np.unique(shift):
      r = rows[shift == s]
      src, dst = r[:, SRC], r[:, DST]
      send_start = np.zeros(p, np.int64)
      recv_start = np.zeros(p, np.int64)
      copy_len = np.zeros(p, np.int64)
      reduce_len = np.zeros(p, np.int64)
      send_start[src] = r[:, SRC_START]
      recv_start[dst] = r[:, DST_START]
      is_copy = r[:, OP] == COPY
      copy_len[dst[is_copy]] = r[is_copy, LENGTH]
      reduce_len[dst[~is_copy]] = r[~is_copy, LENGTH]
      red_start[dst[~is_copy]] = r[~is_copy, DST_START]
      red_len[dst[~is_copy]] = r[~is_copy, LENGTH]
      width = int(r[:, LENGTH].max())
      pad = max(pad, width)
      rounds.append(_Round(tuple(zip(src.tolist(), dst.tolist())), width, send_start,
                           recv_start, copy_len, reduce_len))
    steps.append(_Step(tuple(rounds), red_start, red_len))
  return tuple(steps), pad


def run_schedule(buf: jax.Array, schedule: Schedule, axis_name, codec: str | None = None,
                 op: str = "sum") -> jax.Array:
  """Run ``schedule`` on this rank's flat buffer ``buf`` (inside shard_map over ``axis_name``).

  ``codec`` (None, "fixed" or "entropy") encodes each round's piece on the
  wire; see ``encoded_ppermute.ppermute`` for the bytes it moves. ``op``
  ("sum", "max" or "min") is what a reduce transfer applies: sums in the
  canonical order through ``jaxcc_reduce``, max and min as ``lax.max`` and
  ``lax.min`` (whose results do not depend on the order).
  """
  if buf.ndim != 1 or buf.shape[0] != schedule.length:
    raise ValueError(f"run_schedule: buffer of shape {buf.shape} for a schedule of "
                     f"{schedule.length} elements")
  steps, pad = _compile(schedule)
  if not steps:
    return buf
  rank = lax.axis_index(axis_name)
  dtype = buf.dtype
  word = word_of(dtype)
  identity = _additive_identity(dtype).view(word)

  def as_bits(x):
    return lax.bitcast_convert_type(x, word)

  def as_values(x):
    return lax.bitcast_convert_type(x, dtype)

  work = jnp.concatenate([as_bits(buf), jnp.full((pad,), identity, word)])

  def window(x, start, width):
    return lax.dynamic_slice(x, (start,), (width,))

  def put(x, start, width, valid, new):
    old = window(x, start, width)
    mask = jnp.arange(width) < valid
    return lax.dynamic_update_slice(x, jnp.where(mask, new, old), (start,))

  def at(table):
    return jnp.asarray(table, jnp.int32)[rank]

  for step in steps:
    received = encoded_ppermute.ppermute(
        [as_values(window(work, at(rd.send_start), rd.width)) for rd in step.rounds], axis_name,
        [rd.perm for rd in step.rounds], codec)
    received = [as_bits(got) for got in received]
    for rd, got in zip(step.rounds, received):
      if rd.copy_len.any():
        work = put(work, at(rd.recv_start), rd.width, at(rd.copy_len), got)
    if step.reduce_len.any():
      width = int(step.reduce_len.max())
      start = at(step.reduce_start)
      lane = jnp.arange(width)
      inputs = [window(work, start, width)]
      for rd, got in zip(step.rounds, received):
        if rd.reduce_len.any():
          got = _fit(got, width, identity)
          # Lanes past the piece add the identity (sum) or repeat the rank's own value (max, min).
          inputs.append(jnp.where(lane < at(rd.reduce_len), got,
                                  identity if op == "sum" else inputs[0]))
      total = _reduce(op, [as_values(x) for x in inputs])
      work = put(work, start, width, at(step.reduce_len), as_bits(total))
  return as_values(work[:schedule.length])


def _reduce(op: str, inputs: list[jax.Array]) -> jax.Array:
  if op == "sum":
    return reduce_sum(inputs)
  return functools.reduce(functools.partial(extremum, op), inputs)


def extremum(op: str, a: jax.Array, b: jax.Array) -> jax.Array:
  """``max(a, b)`` or ``min(a, b)`` as jaxcc's max and min reductions take it, whatever the order.

  A NaN loses to a number (as in XLA:CPU's all-reduce and IEEE 754's
  maximumNumber), and -0.0 < +0.0, so the result does not depend on the order
  in which a schedule combines the ranks' values.
  """
  if not jnp.issubdtype(a.dtype, jnp.floating):
    return lax.max(a, b) if op == "max" else lax.min(a, b)
  beats = b > a if op == "max" else b < a
  zero_tie = (a == b) & (a == 0) & (jnp.signbit(a) != jnp.signbit(b))
  zero_beats = zero_tie & (jnp.signbit(a) if op == "max" else jnp.signbit(b))
  return jnp.where(jnp.isnan(a) | beats | zero_beats, b, a)


def _fit(x: jax.Array, width: int, fill) -> jax.Array:
  if x.shape[0] >= width:
    return x[:width]
  return jnp.concatenate([x, jnp.full((width - x.shape[0],), fill, x.dtype)])


def _additive_identity(dtype):
  """-0.0 for floats (x + -0.0 == x bit for bit, -0.0 included), 0 otherwise."""
  if jnp.issubdtype(dtype, jnp.floating):
    return np.array(-0.0, dtype)
  return np.array(0, dtype)

