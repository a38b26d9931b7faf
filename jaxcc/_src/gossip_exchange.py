"""The gossip exchange across processes: ``start`` posts a vector to peers, ``done`` takes theirs,
in the same program or a later one, over jaxcc's TCP transport from programs of any backend.

``start(x, send_to, recv_from)`` (inside shard_map, over the TCP transport)
posts a copy of this rank's flat ``x`` to each rank ``send_to[j]`` as the
piece of slot j and returns a handle at once; the pieces travel on the
transport's progress thread while the process computes, even across program
executions. ``done(handles)`` waits, for each exchange, for the piece of
slot j from each ``recv_from[j]`` and returns them as rows, a status per slot
(``ARRIVED`` 1, 0 none expected, -1 the peer's connection is lost: no piece,
no error) and which ranks' processes are lost. A peer whose process sends no
byte (a live process' transport beats every 100 ms, however slow its
compute) for half the call site's period (the time between its last two
dones, at least 500 ms) while ``done`` waits for its piece is stuck (stopped
or cut off): ``done`` drops it, closing its connection, so it is lost from then
on, here and on its side (``jaxcc.optim.rejoin`` takes it back). Before a
call site's period is known (its first done), a peer that is up but silent
past ``JAXCC_TIMEOUT_S`` fails ``done`` with an error that names it. Slots
hold ranks or -1; sender and receiver of a pair use the same slot.

Bytes per call: ``x.nbytes`` (with a codec, its encoded size) to each
``send_to`` slot that is not -1, in one step. The pure-JAX twin is
``lax.ppermute`` per slot with the same masks (``jaxcc.optim`` uses it within
one process).

Paths: on the CPU both are FFI custom calls of the CPU module (the default);
elsewhere (GPU, TPU), or with ``JAXCC_EXCHANGE=host``, they are host callbacks
(``jax.pure_callback``: XLA copies x to host memory and the pieces back) that
call the same native code through the CPU module, so a program of any backend
keeps the exchange's behaviour: overlap across programs, codecs, a lost peer a
lost message. The two paths move the same bits, and a start of one may be
finished by a done of the other.

Order: each call takes an ``after`` value and runs once it is computed;
``done`` follows its ``start`` through the handle. Every process runs a call
site's exchanges in the same order (its programs' order), and a done waits
only for starts, which never wait, so exchanges cannot deadlock. Like jaxcc's
native collectives on jax >= 0.11 they carry no jax effect: an effect makes
XLA:CPU run the whole program synchronously, measured 1.5x slower for the
char transformer's inner step.
"""

from __future__ import annotations

import functools
import hashlib

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxcc._src import compat, config, ffi, native_executor, tcp_bootstrap
from jaxcc._src.bits import as_bits, word_of

ARRIVED = 1  # a slot's status when its piece came


def start(x: jax.Array, send_to: jax.Array, recv_from: jax.Array, axis_name: str,
          codec: str | None = None, after: jax.Array | None = None) -> jax.Array:
  """Post flat ``x`` to the ranks ``send_to`` (int32 ``(k,)``, -1: none), once ``after`` is
  computed; the int32 handle."""
  if x.ndim != 1:
    raise ValueError(f"gossip exchange: x must be flat, got shape {x.shape}")
  if send_to.shape != recv_from.shape or send_to.ndim != 1:
    raise ValueError(f"gossip exchange: send_to {send_to.shape} and recv_from "
                     f"{recv_from.shape} must be equal (k,) slots")
  axes = compat.bound_axes(axis_name, "gossip exchange")
  group_axes = compat.group_axes(axis_name)
  after = jnp.zeros((), jnp.float32) if after is None else after
  return _start_p.bind(*(compat.make_varying(a, axis_name) for a in (
      x, send_to.astype(jnp.int32), recv_from.astype(jnp.int32), after)),
                       axes=axes, group_axes=group_axes, codec=codec)


def done(handles: jax.Array, like: jax.Array, slots: int, nranks: int,
         after: jax.Array | None = None):
  """The exchanges ``handles`` (int32 ``(m,)``), once ``after`` (any value) is computed.

  Returns:
    The pieces ``(m, slots, n)`` like ``like`` (flat, n elements), the status
    of each slot ``(m, slots)`` and which ranks' processes are lost ``(nranks,)``.
  """
  bits = word_of(like.dtype)
  after = jnp.zeros((), jnp.float32) if after is None else after
  axes = tuple(compat.varying_axes(jax.typeof(handles))) if compat.check_vma() else ()
  got, status, lost = _done_p.bind(handles, compat.make_varying(after, axes) if axes else after,
                                   shape=(handles.shape[0], slots, like.size),
                                   dtype=bits, nranks=nranks)
  if got.dtype != like.dtype:
    got = lax.bitcast_convert_type(got, like.dtype)
  return got, status, lost


def _start_abstract(x, *_, **__):
  return x.update(shape=(), dtype=np.dtype(np.int32))


def _done_abstract(handles, after, *, shape, dtype, nranks):
  del after
  return (handles.update(shape=shape, dtype=dtype), handles.update(shape=shape[:2]),
          handles.update(shape=(nranks,)))


def _host_path(platform: str) -> bool:
  """Whether the exchange lowered for ``platform`` runs as host callbacks."""
  return platform != "cpu" or config.exchange() == "host"


def _lower_start(x, send_to, recv_from, after, *, axes, group_axes, codec, platform):
  if group_axes:
    raise NotImplementedError("gossip exchange over one mesh axis only")
  (axis_name, nranks), = axes
  procs = native_executor.process_map(axis_name, ())
  if procs is None or not len(procs):
    procs = np.full(nranks, jax.process_index(), np.int64)
  tcp_bootstrap.ensure_started()
  bits = as_bits(x)
  digest = hashlib.sha256(f"{x.size}/{np.dtype(x.dtype).name}/{codec}".encode()).hexdigest()
  cpu = ffi.load().cpu
  rank = lax.axis_index(axis_name).astype(jnp.int32)
  attrs = dict(nranks=np.int64(nranks), op_id=np.int64(native_executor.next_op_id()),
               digest=np.int64(int(digest[:15], 16)),
               codec=np.int64(native_executor.CODEC_IDS[codec]),
               timeout_ms=np.int64(config.timeout_ms()))
  procs = np.ascontiguousarray(procs, np.int64)
  if not _host_path(platform):
    return [_start_ffi_p.bind(bits, send_to, recv_from, rank, after,
                              procs=native_executor.ArrayAttr(procs),
                              dtype=np.int64(native_executor.bits_type_id(x.dtype)), **attrs)]
  codec_type = native_executor.FFI_FLOAT_TYPES.get(np.dtype(x.dtype), 0)

  def host_start(bits, send_to, recv_from, rank, after):
    del after
    return np.int32(cpu.exchange_start(np.ravel(bits), send_to, recv_from, int(rank),
                                       procs=procs, codec_type=codec_type, **attrs))

  return [jax.pure_callback(host_start, jax.ShapeDtypeStruct((), np.int32), bits, send_to,
                            recv_from, rank, after)]


def _host_done(handles, after, *, shape, dtype, nranks):
  """``done`` as a host callback."""
  cpu = ffi.load().cpu

  def host_done(handles, after):
    del after
    got, status = np.empty(shape, dtype), np.empty(shape[:2], np.int32)
    lost = np.empty(nranks, np.int32)
    cpu.exchange_done(np.ascontiguousarray(handles, np.int32), got, status, lost)
    return got, status, lost

  return jax.pure_callback(host_done, (jax.ShapeDtypeStruct(shape, dtype),
                                       jax.ShapeDtypeStruct(shape[:2], np.int32),
                                       jax.ShapeDtypeStruct((nranks,), np.int32)),
                           handles, after)


def _lower_done(ctx, handles, after, *, platform, **params):
  if _host_path(platform):
    return compat.mlir.lower_fun(functools.partial(_host_done, **params),
                                 multiple_results=True)(ctx, handles, after)
  return _lower_done_ffi(ctx, handles, after)


_start_ffi_p = compat.Primitive("jaxcc_exchange_start")
_start_ffi_p.def_abstract_eval(_start_abstract)
_lower_start_ffi = jax.ffi.ffi_lowering("jaxcc_exchange_start", has_side_effect=True)
compat.mlir.register_lowering(
    _start_ffi_p, lambda ctx, *args, procs, **attrs: _lower_start_ffi(ctx, *args,
                                                                     procs=procs.array, **attrs),
    platform="cpu")
_lower_done_ffi = jax.ffi.ffi_lowering("jaxcc_exchange_done", has_side_effect=True)

_start_p = compat.Primitive("jaxcc_gossip_exchange_start")
_start_p.def_abstract_eval(_start_abstract)
_done_p = compat.Primitive("jaxcc_gossip_exchange_done")
_done_p.multiple_results = True
_done_p.def_abstract_eval(_done_abstract)
for _platform in ("cpu", None):  # None: every other platform, always on the host path
  compat.mlir.register_lowering(
      _start_p, compat.lower_in_axis_env(_lower_start, platform=_platform or "host"),
      platform=_platform)
  compat.mlir.register_lowering(
      _done_p, functools.partial(_lower_done, platform=_platform or "host"), platform=_platform)
