"""The native executor: one ``jaxcc_collective`` FFI call runs a whole Schedule.

The call gets the serialised schedule, this rank's position along the axis,
which instance of the axis it is in (a multi-axis mesh has one per
coordinate of the other axes) and an op id naming the call site; the C++
interpreter walks the steps over a transport (InProcess: the devices of this
process read each other's buffers directly) and sums with the
``jaxcc_reduce`` kernel in the canonical order, so its results equal the XLA
executor's bit for bit. The buffer is updated in place (the result aliases
the operand).
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxcc._src import ffi as _ffi  # noqa: F401  (registers jaxcc_collective)
from jaxcc.schedules.ir import Schedule

_op_ids = itertools.count(1)


def run_schedule(buf: jax.Array, schedule: Schedule, axis_name: str,
                 group_axes: tuple[tuple[str, int], ...]) -> jax.Array:
  """Run ``schedule`` on this rank's flat ``buf`` in one FFI call (inside shard_map)."""
  if buf.ndim != 1 or buf.shape[0] != schedule.length:
    raise ValueError(f"run_schedule: buffer of shape {buf.shape} for a schedule of "
                     f"{schedule.length} elements")
  if not len(schedule.table):
    return buf
  rank = lax.axis_index(axis_name).astype(jnp.int32)
  group = jnp.int32(0)
  for name, size in group_axes:
    group = group * size + lax.axis_index(name).astype(jnp.int32)
  out, _ = jax.ffi.ffi_call(
      "jaxcc_collective",
      (jax.ShapeDtypeStruct(buf.shape, buf.dtype), jax.ShapeDtypeStruct((), jnp.int32)),
      has_side_effect=True, input_output_aliases={0: 0})(
          buf, rank, group, jnp.int32(0),
          table=np.ascontiguousarray(schedule.table.reshape(-1)),
          num_steps=np.int64(schedule.num_steps), nranks=np.int64(schedule.nranks),
          op_id=np.int64(next(_op_ids)), digest=np.int64(int(schedule.digest[:15], 16)),
          name=schedule.collective)
  return out
