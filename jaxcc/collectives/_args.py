"""What every collective checks at trace time: each error names the public function called."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxcc import codec as codec_lib
from jaxcc.codec import choice
from jaxcc._src import compat
from jaxcc._src.reduce import REDUCIBLE_DTYPES
from jaxcc.collectives._buckets import DEFAULT_BUCKET_BYTES
from jaxcc.network import active
from jaxcc import planner
from jaxcc.topology import Topology

EXECUTORS = ("auto", "native", "xla")
# What `codec=` takes on a collective: None (raw pieces), a codec that moves encoded bytes, or
# "auto" (jaxcc.codec.choice: per dtype, where coding pays on the topology's slowest port).
WIRE_CODECS = (None, "fixed", "entropy", "auto")
REDUCE_OPS = ("sum", "mean", "max", "min")
# The network assumed when no topology is given: uniform 25 GB/s ports (a 200 Gb/s NIC).
DEFAULT_BANDWIDTH = 25e9


def check_axis(api: str, axis_name, executor: str, codec) -> dict:
  """Validate the arguments every collective takes; return the params that place its ranks.

  Returns:
    ``axis_name`` (a str, or a tuple of axes in ``lax``'s rank order),
    ``axes`` ((name, size) pairs), ``axis_size`` (their product) and
    ``group_axes`` (the other manual mesh axes, None in a partial-manual
    shard_map) and ``cross_group_axes`` (over a tuple of axes, those other
    than the outer one; else None).
  """
  axes = compat.bound_axes(axis_name, api)
  size = int(np.prod([n for _, n in axes]))
  if not (codec is None or isinstance(codec, str) and codec in WIRE_CODECS):
    raise ValueError(f"{api}: codec must be one of {WIRE_CODECS}, got codec={codec!r}")
  if executor not in EXECUTORS:
    raise ValueError(f"{api}: executor must be one of {EXECUTORS}, got {executor!r}")
  group_axes = compat.group_axes(axis_name)
  # Over a tuple of axes: the other axes of the outer one (a hierarchical cross phase).
  cross_group_axes = compat.group_axes(axes[0][0]) if len(axes) > 1 else None
  if executor == "native" and group_axes is None:
    raise NotImplementedError(
        f"{api}: executor='native' runs in a shard_map whose axes are all manual (a partial-"
        f"manual shard_map hides which instance of the axis a device is in); use "
        f"executor='auto' or 'xla'")
  return {"axis_name": axis_name, "axes": axes, "axis_size": size, "group_axes": group_axes,
          "cross_group_axes": cross_group_axes}


def resolve(api: str, collective: str, axis_name, algorithm: str, executor: str,
            topology: Topology | None, codec) -> dict:
  """Validate the arguments of a planned collective; return ``check_axis``'s params plus the
  algorithm, executor, codec and topology to plan on, and ``measured``: whether the topology is
  a measured network's."""
  params = check_axis(api, axis_name, executor, codec)
  size = params["axis_size"]
  if not isinstance(algorithm, str):
    raise TypeError(f"{api}: algorithm must be a str, got {algorithm!r}")
  if algorithm != "lax":
    planner.check_algorithm(collective, algorithm, api)
  elif codec not in (None, "auto"):
    raise ValueError(f"{api}: algorithm='lax' is XLA's own collective, which cannot move "
                     f"encoded bytes; use codec=None with it, or another algorithm with "
                     f"codec={codec!r}")
  measured = None
  if topology is None:  # a measured network's (MeasuredNetwork.jit), else uniform ports
    measured = active.topology(axis_name)
    topology = default_topology(params["axes"]) if measured is None else measured
  elif not isinstance(topology, Topology):
    raise TypeError(f"{api}: topology must be a jaxcc.Topology or None, got "
                    f"{type(topology).__name__}")
  elif topology.size != size:
    raise ValueError(f"{api}: topology has {topology.size} ranks but axis {axis_name!r} has "
                     f"{size}; build the topology for {size} ranks")
  return dict(params, algorithm=algorithm, executor=executor, topology=topology, codec=codec,
              measured=measured is not None)


def xla_form(x, axis_name, axis_index_groups=None) -> bool:
  """Whether a call on the leaf ``x`` takes a form that only XLA's collective runs: replica
  groups (``axis_index_groups``), or ``x`` reduced or unreduced along the axes (jax's ``mat``
  types). Such a call runs on ``lax``'s collective, with its result and type."""
  if axis_index_groups is not None:
    return True
  return bool(compat.reduced_axes(jax.typeof(x)) & set(compat.axis_names(axis_name, "xla_form")))


def native_leaves(leaves, dims, by_xla, axis_name) -> tuple[list[int], list, list[int]]:
  """The leaves that do not run on lax's collective (``by_xla`` False): their indices, the
  leaves cast to vary along the axes, and their dimensions."""
  rest = [i for i, on_xla in enumerate(by_xla) if not on_xla]
  return rest, [compat.make_varying(leaves[i], axis_name) for i in rest], [dims[i] for i in rest]


def group_size(api: str, axis_index_groups, axis_size: int) -> int:
  """The ranks in each group of ``axis_index_groups`` (``axis_size`` for None), or a ValueError
  unless the groups are equal in size and split the axis' ranks, as lax requires."""
  if axis_index_groups is None:
    return axis_size
  try:
    groups = [[int(r) for r in g] for g in axis_index_groups]
  except TypeError:
    groups = None
  if (not groups or len({len(g) for g in groups}) != 1
      or sorted(r for g in groups for r in g) != list(range(axis_size))):
    raise ValueError(f"{api}: axis_index_groups must split the {axis_size} ranks of the axis into "
                     f"groups of equal size, got {axis_index_groups!r}")
  return len(groups[0])


def default_topology(axes) -> Topology:
  """The network assumed when none is given: uniform ports of ``DEFAULT_BANDWIDTH``; over a
  tuple of mesh axes each group of the outer axis is a cluster (same bandwidth both levels)."""
  size = int(np.prod([n for _, n in axes]))
  if len(axes) < 2:
    return Topology.uniform(size, DEFAULT_BANDWIDTH)
  outer = axes[0][1]
  return Topology.clusters([size // outer] * outer, DEFAULT_BANDWIDTH, DEFAULT_BANDWIDTH)


def leaves_of(api: str, x) -> tuple[list[jax.Array], object]:
  """The leaves of the pytree ``x`` as arrays, and its structure; a TypeError names a leaf that
  is not an array."""
  leaves, tree = jax.tree.flatten(x)
  return [as_array(api, v) for v in leaves], tree


def as_array(api: str, v) -> jax.Array:
  try:
    return jnp.asarray(v)
  except TypeError:
    raise TypeError(f"{api}: every leaf of x must be an array, got {type(v).__name__} "
                    f"{v!r:.40}") from None


def check_op(api: str, op) -> str:
  if op not in REDUCE_OPS:
    raise ValueError(f"{api}: op must be one of {REDUCE_OPS}, got op={op!r}")
  return op


def check_codec(api: str, codec, dtype) -> None:
  """A codec compresses bf16, f16 and f32 only: a TypeError naming the fix for other dtypes
  ("auto" leaves them raw)."""
  if codec not in (None, "auto") and np.dtype(dtype) not in codec_lib.CODEC_DTYPES:
    raise TypeError(f"{api}: codec={codec!r} cannot take {np.dtype(dtype).name}; codecs take "
                    f"{', '.join(d.name for d in codec_lib.CODEC_DTYPES)}; use codec=None")


def wire_codecs(params: dict, dtypes) -> tuple[dict, object]:
  """The codec of each dtype's bucket (``codec="auto"``: ``jaxcc.codec.auto_choice`` on the
  call's topology; raw with algorithm "lax") and the call's (the first coded one, or None)."""
  codec = params["codec"]
  if codec != "auto":
    return {d: codec for d in dtypes}, codec
  lax_only = params.get("algorithm") == "lax"
  codecs = {d: None if lax_only else choice.auto_choice(d, params["topology"])[0]
            for d in dtypes}
  return codecs, next((c for c in codecs.values() if c is not None), None)


def check_reducible(api: str, dtype) -> None:
  if np.dtype(dtype) not in REDUCIBLE_DTYPES:
    raise TypeError(f"{api}: cannot reduce dtype {np.dtype(dtype).name}; supported: "
                    f"{', '.join(d.name for d in REDUCIBLE_DTYPES)}")


def check_dimension(api: str, name: str, dim, ndim: int) -> int:
  """``dim`` normalised to [0, ndim), or a ValueError naming the argument."""
  if isinstance(dim, bool) or not isinstance(dim, int) or not -ndim <= dim < ndim:
    raise ValueError(f"{api}: {name}={dim!r} is out of range for an array of rank {ndim}")
  return dim % ndim


def check_bucket_bytes(api: str, bucket_bytes) -> int:
  if bucket_bytes is None:
    return DEFAULT_BUCKET_BYTES
  if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes < 1:
    raise ValueError(f"{api}: bucket_bytes must be a positive int (bytes), got {bucket_bytes!r}")
  return bucket_bytes
