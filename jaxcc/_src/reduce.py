"""Elementwise sum (or max, min) of k same-shaped arrays, in a fixed order, with one rounding.

``reduce_sum`` runs the ``jaxcc_reduce`` FFI op (C++ on CPU, CUDA on GPU);
``reduce_sum_reference`` is its pure-JAX twin. Both compute

  out = round(((x0 + x1) + x2) + ... + x{k-1})

adding in the given order in the accumulator dtype (float32 for bfloat16,
float16 and float32; float64 for float64; the integer dtype itself, wrapping,
for integers) and rounding once at the end, so they are bit-identical for every
dtype. A NaN sum is the first NaN met in that order, quieted (IEEE 754 leaves
the choice open; the contract fixes it). The executors use this for every
reduction step of a schedule: a fixed order makes float sums bit-identical from
run to run.

``reduce`` and ``reduce_reference`` take ``op``: "sum" as above, or "max" /
"min", XLA:CPU's all-reduce fold in the given order (``lax.pmax`` and
``lax.pmin`` over ranks in rank order give the same bits)::

  a = -inf (max; +inf for min; the dtype's limits for integers)
  a = where(a < x_j, x_j, a)   (min: where(x_j < a, x_j, a))   for j = 0 .. k-1

in the accumulator dtype, rounded once. So NaNs are skipped (all-NaN gives
-inf for max), of -0.0 and +0.0 the first wins, and a single input is a copy.
A subnormal result (in the accumulator dtype: f32 for bf16) is flushed to
zero of its sign, as the max / min instruction does on XLA:CPU's threads,
which treat subnormal operands as zero (and compare them so, here too).
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxcc._src import compat, config, ffi

# The reductions jaxcc_reduce takes, by their ``op`` attribute (xla_ffi/include/jaxcc/reduce.h).
OPS = {"sum": 0, "max": 1, "min": 2}
# The dtypes the jaxcc_reduce kernel reduces (the native module's reducible_dtypes(), checked when
# it loads).
REDUCIBLE_DTYPES = tuple(
    np.dtype(d) for d in (jnp.float32, jnp.bfloat16, jnp.float16, jnp.float64, jnp.int32,
                          jnp.int64, jnp.uint32, jnp.uint8, jnp.int8))


def reduce_sum(inputs: Sequence[jax.Array]) -> jax.Array:
  """Sums k >= 1 arrays elementwise, in order, through the ``jaxcc_reduce`` FFI op.

  Differentiable (it is linear: the tangent is the sum of the tangents) and
  vmappable. Inside ``jax.shard_map`` each device sums its own shards; no data
  moves between devices. ``JAXCC_USE_FFI=0`` routes it to
  :func:`reduce_sum_reference`.

  Args:
    inputs: k >= 1 arrays of one shape and one dtype (float32, bfloat16, float16,
      float64, int32, int64, uint32, uint8 or int8).

  Returns:
    ``round(((inputs[0] + inputs[1]) + ...) + inputs[k-1])``, accumulated in
    float32 for 16-bit floats; integer sums wrap.
  """
  inputs = _check_inputs(inputs, "reduce_sum")
  if not config.USE_FFI:
    return reduce_sum_reference(inputs)
  inputs = _match_varying_axes(inputs)
  if jnp.issubdtype(inputs[0].dtype, jnp.inexact):
    return _reduce_sum_differentiable(*inputs)
  return _reduce_sum_ffi(*inputs)


def reduce_sum_reference(inputs: Sequence[jax.Array]) -> jax.Array:
  """The pure-JAX twin of :func:`reduce_sum`: same order, same accumulation, same bits.

  .. note:: Bit-identical as long as XLA computes the inputs as they are; if it
     fuses an input's producer into the sum, it may contract a multiply and
     the first add into one FMA, which rounds once instead of twice.

  Args:
    inputs: as for :func:`reduce_sum`.

  Returns:
    The same array as :func:`reduce_sum`, bit for bit.
  """
  return _sum_in_order(_check_inputs(inputs, "reduce_sum_reference"), nan_rule=True)


def reduce(inputs: Sequence[jax.Array], op: str = "sum") -> jax.Array:
  """Reduces k >= 1 arrays elementwise, in order, with ``op`` through the ``jaxcc_reduce`` FFI op.

  "sum" is :func:`reduce_sum`; "max" and "min" are the fold in the module
  docstring (not differentiable). ``JAXCC_USE_FFI=0`` routes it to
  :func:`reduce_reference`.

  Args:
    inputs: as for :func:`reduce_sum`.
    op: "sum", "max" or "min".
  """
  _check_op(op, "reduce")
  if op == "sum":
    return reduce_sum(inputs)
  inputs = _check_inputs(inputs, "reduce")
  if not config.USE_FFI:
    return reduce_reference(inputs, op)
  return _reduce_ffi(*_match_varying_axes(inputs), op=op)


def reduce_reference(inputs: Sequence[jax.Array], op: str = "sum") -> jax.Array:
  """The pure-JAX twin of :func:`reduce`: same order, same accumulation, same bits.

  Args:
    inputs: as for :func:`reduce_sum`.
    op: "sum", "max" or "min".
  """
  _check_op(op, "reduce_reference")
  if op == "sum":
    return reduce_sum_reference(inputs)
  inputs = _check_inputs(inputs, "reduce_reference")
  if len(inputs) == 1:
    return inputs[0]
  dtype = inputs[0].dtype
  acc_dtype = accumulator_dtype(dtype)
  if jnp.issubdtype(acc_dtype, jnp.floating):
    start = -np.inf if op == "max" else np.inf
  else:
    start = np.iinfo(acc_dtype).min if op == "max" else np.iinfo(acc_dtype).max
  acc = jnp.full(inputs[0].shape, start, acc_dtype)
  for x in inputs:
    x = x.astype(acc_dtype)
    acc = jnp.where(acc < x if op == "max" else x < acc, x, acc)
  if jnp.issubdtype(acc_dtype, jnp.floating):
    zero = jnp.copysign(jnp.zeros((), acc_dtype), acc)
    acc = jnp.where(jnp.abs(acc) < jnp.finfo(acc_dtype).tiny, zero, acc)
  return acc.astype(dtype)


def accumulator_dtype(dtype) -> np.dtype:
  """float32 for 16-bit floats, the dtype itself otherwise."""
  dtype = np.dtype(dtype)
  if dtype in (np.dtype(jnp.bfloat16), np.dtype(jnp.float16)):
    return np.dtype(jnp.float32)
  return dtype


def _sum_in_order(inputs: list[jax.Array], nan_rule: bool) -> jax.Array:
  if len(inputs) == 1:
    return inputs[0]
  dtype = inputs[0].dtype
  acc_dtype = accumulator_dtype(dtype)
  nan_rule = nan_rule and jnp.issubdtype(acc_dtype, jnp.floating)
  acc = inputs[0].astype(acc_dtype)
  for x in inputs[1:]:
    x = x.astype(acc_dtype)
    acc = _add_nan_first(acc, x) if nan_rule else acc + x
  return acc.astype(dtype)


@jax.custom_jvp
def _add_nan_first(a: jax.Array, b: jax.Array) -> jax.Array:
  """``a + b``, except that a NaN ``a`` wins over a NaN ``b`` (quieted: ``a + a``).

  When two NaNs meet, XLA may return either one (it may swap the operands of
  an add); the contract says the first. Differentiates like ``a + b``.
  """
  return jnp.where(jnp.isnan(a), a + a, a + b)


_add_nan_first.defjvps(lambda ta, out, a, b: ta, lambda tb, out, a, b: tb)


def _check_op(op, api_name: str) -> None:
  if op not in OPS:
    raise ValueError(f"{api_name}: op must be one of {tuple(OPS)}, got {op!r}")


def _check_inputs(inputs, api_name: str) -> list[jax.Array]:
  if isinstance(inputs, (jax.Array, np.ndarray)) or not isinstance(inputs, Sequence):
    raise TypeError(f"{api_name}: inputs must be a sequence (list or tuple) of arrays, got "
                    f"{type(inputs).__name__}")
  if not inputs:
    raise ValueError(f"{api_name}: needs at least one input array, got an empty sequence")
  inputs = [jnp.asarray(x) for x in inputs]
  dtype, shape = inputs[0].dtype, inputs[0].shape
  if dtype not in REDUCIBLE_DTYPES:
    names = ", ".join(d.name for d in REDUCIBLE_DTYPES)
    raise TypeError(f"{api_name}: unsupported dtype {dtype.name}; supported: {names}")
  for i, x in enumerate(inputs[1:], start=1):
    if x.dtype != dtype:
      raise TypeError(f"{api_name}: inputs[{i}] has dtype {x.dtype.name} but inputs[0] has "
                      f"{dtype.name}; cast them to one dtype first")
    if x.shape != shape:
      raise ValueError(f"{api_name}: inputs[{i}] has shape {x.shape} but inputs[0] has {shape}; "
                       f"all inputs must have the same shape")
  return inputs


def _match_varying_axes(inputs: list[jax.Array]) -> list[jax.Array]:
  """Casts every input to vary along the union of their manual axes (as ``+`` does)."""
  if not compat.check_vma():
    return inputs
  axes = [compat.varying_axes(jax.typeof(x)) for x in inputs]
  union = frozenset().union(*axes)
  return [x if a == union else jax.lax.pcast(x, tuple(sorted(union - a)), to="varying")
          for x, a in zip(inputs, axes)]


def _reduce_ffi(*inputs: jax.Array, op: str) -> jax.Array:
  ffi.load()
  # The result has the inputs' type: shape, dtype, sharding and varying axes.
  return jax.ffi.ffi_call("jaxcc_reduce", jax.typeof(inputs[0]),
                          vmap_method="broadcast_all")(*inputs, op=np.int64(OPS[op]))


def _reduce_sum_ffi(*inputs: jax.Array) -> jax.Array:
  return _reduce_ffi(*inputs, op="sum")


@jax.custom_jvp
def _reduce_sum_differentiable(*inputs: jax.Array) -> jax.Array:
  return _reduce_sum_ffi(*inputs)


@_reduce_sum_differentiable.defjvp
def _reduce_sum_jvp(primals, tangents):
  # The tangent is the same in-order sum of the tangents, in pure JAX: reverse
  # mode must transpose it, and an FFI call has no transpose rule. (The NaN
  # rule is left out: it is not linear, and a NaN tangent stays NaN anyway.)
  return _reduce_sum_ffi(*primals), _sum_in_order(list(tangents), nan_rule=False)
