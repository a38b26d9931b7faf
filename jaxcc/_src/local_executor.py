"""The in-process executor: one ``jaxcc_local_collective`` FFI call per collective.

The ranks of one process share memory, so a collective there needs no
network schedule: the ranks' calls meet once, each publishes its input and
output buffers, each computes its own part reading every peer's buffer
directly (C++, vectorised), and a completion barrier ends the call. Inputs
and results have their true shapes (no flat in-place buffer) and dtypes, so
each function here is the one FFI call: XLA moves no data into or out of a
custom call, so 16-bit floats keep their bits without going through uint16
(``jaxcc._src.bits``), which would cost a copy each way on XLA:CPU.

Sums add, per element, the owner's value first and then ranks ``r-1, r-2,
...`` (mod p), where the owner of an element is the rank whose equal shard of
the flattened array (``jaxcc.schedules.pieces.equal_shards``; for
reduce_scatter, its block) holds it: the order of the "direct" schedule, so
the results equal the XLA executor's direct all-reduce and reduce-scatter bit
for bit, with ``jaxcc_reduce``'s kernel and rounding. Max and min fold in
rank order, as ``lax.pmax`` and ``lax.pmin`` do on the CPU, with the same
bits (``jaxcc._src.reduce``).

Each function is called inside the lowering of a jaxcc primitive, with its
axes bound (as ``native_executor.run_schedule`` is): ``axis_name`` is one mesh
axis or a tuple of them (ranks in ``lax.axis_index`` order), ``group_axes``
the other manual mesh axes as (name, size), in mesh order. Calls take and
return a token (``compat.chained_ffi_lowering``), so every device runs its
native calls in program order; on jax 0.10 it is the program-order effect's,
which also keeps one execution's calls on a device from overlapping the
next one's (that XLA:CPU runs several executions of a program at once, and
blocked calls of a later one can hold the threads that an earlier one's
ranks need: a stall until the timeout; newer clients launch them one after
another). Every wait ends within
``JAXCC_TIMEOUT_S`` (``config.timeout_s``) with an error naming the rank that
never arrived.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxcc._src import compat, config, ffi
from jaxcc._src.reduce import OPS, REDUCIBLE_DTYPES

# The `collective` attribute: the index in kCollectiveNames (xla_ffi/cpu/local_collective.cc).
_COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "ppermute")
# Op ids count down from -1: instance counters are kept per op id, and jaxcc_collective's
# count up from 1.
_op_ids = itertools.count(-1, -1)


def all_reduce(x: jax.Array, axis_name, axis_size: int,
               group_axes: tuple[tuple[str, int], ...], op: str = "sum") -> jax.Array:
  """The ``op`` ("sum", "max" or "min") of ``x`` over the ranks; ``lax.psum``'s result shape.

  Rank r reduces shard r (``N / p`` elements, N = ``x.size``) of every rank's
  ``x`` and writes it into every rank's result: it reads ``N`` elements and
  writes ``(p-1) N / p`` into its peers' memory, in one step.
  """
  _check_reducible("jaxcc.all_reduce", x, op)
  return _call(x, x.shape, "all_reduce", axis_name, axis_size, group_axes, op=op)


def reduce_scatter(x: jax.Array, axis_name, axis_size: int,
                   group_axes: tuple[tuple[str, int], ...], scatter_dimension: int, tiled: bool,
                   op: str = "sum") -> jax.Array:
  """``lax.psum_scatter`` (with ``op``): rank r gets block r of ``scatter_dimension``, reduced.

  Rank r reads block r of every rank's ``x`` (``N`` elements in all, N =
  ``x.size``) and writes its own ``N / p``, in one step.
  """
  api = "jaxcc.reduce_scatter"
  _check_reducible(api, x, op)
  dim = _check_dimension(api, "scatter_dimension", scatter_dimension, x.ndim)
  n = x.shape[dim]
  if (tiled and n % axis_size) or (not tiled and n != axis_size):
    need = f"divisible by {axis_size}" if tiled else f"equal to {axis_size}"
    raise ValueError(f"{api}: dimension {dim} of x has size {n}, which must be {need} (the size "
                     f"of axis {axis_name!r}) with tiled={tiled}")
  shape = list(x.shape)
  if tiled:
    shape[dim] //= axis_size
  else:
    del shape[dim]
  return _call(x, tuple(shape), "reduce_scatter", axis_name, axis_size, group_axes,
               op=op, outer=math.prod(x.shape[:dim]))


def all_gather(x: jax.Array, axis_name, axis_size: int,
               group_axes: tuple[tuple[str, int], ...], gather_dimension: int, tiled: bool) -> jax.Array:
  """``lax.all_gather``: block q of ``gather_dimension`` is rank q's ``x``.

  Rank r copies every rank's ``x`` into its own result (``p N`` elements read,
  N = ``x.size``; nothing written to peers), in one step.
  """
  dim = _check_dimension("jaxcc.all_gather", "gather_dimension", gather_dimension,
                         x.ndim + (0 if tiled else 1))
  shape = list(x.shape)
  if tiled:
    shape[dim] *= axis_size
  else:
    shape.insert(dim, axis_size)
  return _call(x, tuple(shape), "all_gather", axis_name, axis_size, group_axes,
               outer=math.prod(x.shape[:dim]))


def broadcast(x: jax.Array, axis_name, axis_size: int,
              group_axes: tuple[tuple[str, int], ...], root: int) -> jax.Array:
  """Every rank gets rank ``root``'s ``x``: each copies the root's ``N`` elements, one step."""
  if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not (
      0 <= root < axis_size):
    raise ValueError(f"jaxcc.broadcast: root must be a rank in [0, {axis_size}), got {root!r}")
  return _call(x, x.shape, "broadcast", axis_name, axis_size, group_axes,
               root=int(root))


def ppermute(x: jax.Array, axis_name, axis_size: int, group_axes: tuple[tuple[str, int], ...],
             perm) -> jax.Array:
  """``lax.ppermute``: rank ``dst`` gets rank ``src``'s ``x`` for each pair; zeros if none.

  Each receiving rank copies its source's ``N`` elements, in one step.
  """
  sources = [-1] * axis_size
  seen = set()
  for pair in perm:
    src, dst = (int(v) for v in pair)
    if not (0 <= src < axis_size and 0 <= dst < axis_size) or src in seen or sources[dst] >= 0:
      raise ValueError(f"jaxcc.ppermute: perm must be pairs (src, dst) of ranks in "
                       f"[0, {axis_size}), each rank at most once as a source and once as a "
                       f"destination; got {perm!r}")
    seen.add(src)
    sources[dst] = src
  return _call(x, x.shape, "ppermute", axis_name, axis_size, group_axes,
               sources=tuple(sources))


def _call(x, out_shape, collective, axis_name, axis_size, group_axes, *, op="sum",
          outer=1, root=0, sources=()):
  """One ``jaxcc_local_collective`` call: this rank, its group, and the collective's attributes."""
  ffi.load()
  rank = lax.axis_index(axis_name).astype(jnp.int32)
  group = jnp.int32(0)
  for name, size in group_axes:
    group = group * size + lax.axis_index(name).astype(jnp.int32)
  return local_collective_p.bind(
      x, rank, group, out_shape=tuple(out_shape), collective=_COLLECTIVES.index(collective),
      nranks=int(axis_size), op_id=next(_op_ids), op=OPS[op], outer=int(outer), root=int(root),
      sources=tuple(sources), timeout_ms=int(math.ceil(config.timeout_s() * 1000)))


def _check_reducible(api: str, x, op: str) -> None:
  if op not in OPS:
    raise ValueError(f"{api}: op must be one of {tuple(OPS)}, got {op!r}")
  if np.dtype(x.dtype) not in REDUCIBLE_DTYPES:
    raise TypeError(f"{api}: cannot reduce dtype {np.dtype(x.dtype).name}; supported: "
                    f"{', '.join(d.name for d in REDUCIBLE_DTYPES)}")


def _check_dimension(api: str, name: str, dim, ndim: int) -> int:
  if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or not -ndim <= dim < ndim:
    raise ValueError(f"{api}: {name}={dim!r} is out of range for an array of rank {ndim}")
  return int(dim) % ndim


# The FFI call as a primitive; its lowering orders it after the previous native call (the
# token is the handler's first operand and result).
local_collective_p = compat.Primitive("jaxcc_local_collective")
local_collective_p.def_effectful_abstract_eval(
    lambda x, rank, group, *, out_shape, **_: (x.update(shape=out_shape),
                                               compat.NATIVE_CALL_EFFECTS))
_lower_ffi = compat.chained_ffi_lowering("jaxcc_local_collective", has_side_effect=True)


def _lower(ctx, x, rank, group, *, out_shape, sources, **attrs):
  del out_shape  # in ctx.avals_out
  return _lower_ffi(ctx, x, rank, group, sources=np.asarray(sources, np.int64).reshape(-1),
                    **{k: np.int64(v) for k, v in attrs.items()})


compat.mlir.register_lowering(local_collective_p, _lower, platform="cpu", cacheable=False)
