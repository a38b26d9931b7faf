"""Creates the NCCL communicators of the native executor's Nccl transport (GPU).

One communicator per (instance of a mesh axis, local device). When a
collective over ``axis_name`` of ``mesh`` is first lowered, ``ensure_comms``:

1. names the axis' communicators by a ``comm_key`` (a hash of the axis name
   and the mesh's device ids in rank order), passed to the handler as an
   attribute; the handler finds its communicator by (comm_key, device
   ordinal), and each device is in exactly one instance of the axis, so that
   also gives its rank;
2. per instance (group) the process holding its rank 0 makes an ncclUniqueId
   and, with several processes, puts it in the jax.distributed key-value store
   (``compat.kv_set``); the others wait for it (``compat.kv_get``);
3. creates every local device's communicators in one NCCL group
   (``_jaxcc_cuda.nccl_init``), waiting up to ``config.timeout_s()``
   (``JAXCC_TIMEOUT_S``) for the peers.

Every process of an SPMD program lowers the same collectives in the same
order, so they meet here in the same order too.
"""

from __future__ import annotations

import hashlib
import os
import threading

import jax
import numpy as np

from jaxcc._src import compat, config, ffi

_KEY = "jaxcc/nccl"
_lock = threading.Lock()
_ready: dict[int, int] = {}  # comm_key -> number of local communicators made
_unavailable: str | None = None  # why the Nccl transport cannot run; "" when it can
_checked = False


def unavailable() -> str | None:
  """Why the Nccl transport cannot run here, or None when it can (loads libnccl.so.2 once)."""
  global _unavailable, _checked
  with _lock:
    if not _checked:
      _checked = True
      module = ffi.load().cuda
      if module is None:
        _unavailable = "jaxcc was built without its CUDA module (no nvcc at build time)"
      elif not module.has_nccl():
        _unavailable = ("jaxcc's CUDA module was built without the Nccl transport (nccl.h was not "
                        "found at build time; see CMakeLists.txt: JAXCC_NCCL_INCLUDE_DIR)")
      else:
        _unavailable = module.nccl_load(_library_candidates()) or ""
    return _unavailable or None


def _library_candidates() -> list[str]:
  """libnccl.so.2 of the nvidia-nccl wheel of this Python, if installed (jax[cuda13] has one)."""
  try:
    import nvidia.nccl as nccl  # pylint: disable=import-outside-toplevel
  except ImportError:
    return []
  return [os.path.join(path, "lib", "libnccl.so.2") for path in nccl.__path__]


def comm_key(mesh: jax.sharding.Mesh, axis_name: str,
             group_axes: tuple[tuple[str, int], ...]) -> tuple[int, np.ndarray]:
  """The key of ``axis_name``'s communicators and its devices as ``(groups, p)`` in group order."""
  names = list(mesh.axis_names)
  order = [names.index(name) for name, _ in group_axes] + [names.index(axis_name)]
  devices = mesh.devices.transpose(order).reshape(-1, mesh.shape[axis_name])
  ids = np.vectorize(lambda d: d.id, otypes=[np.int64])(devices)
  digest = hashlib.sha256(axis_name.encode() + b"\0" + ids.tobytes()).digest()
  return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1), devices


def ensure_comms(mesh: jax.sharding.Mesh, axis_name: str,
                 group_axes: tuple[tuple[str, int], ...]) -> int:
  """Create this process' communicators of ``axis_name`` over ``mesh`` unless made; return the key.

  Raises:
    RuntimeError: the Nccl transport cannot run, or NCCL failed.
    TimeoutError: the process holding a group's rank 0 did not publish its id in time.
  """
  reason = unavailable()
  if reason is not None:
    raise RuntimeError(f"jaxcc: the Nccl transport is unavailable: {reason}")
  key, devices = comm_key(mesh, axis_name, group_axes)
  with _lock:
    if key in _ready:
      return key
    me = jax.process_index()
    module = ffi.load().cuda
    entries = []
    for g, ranks in enumerate(devices):
      local = [(r, d) for r, d in enumerate(ranks) if d.process_index == me]
      if not local:
        continue
      store_key = f"{_KEY}/{key}/{g}"
      if ranks[0].process_index == me:
        uid = module.nccl_unique_id()
        if any(d.process_index != me for d in ranks):
          compat.kv_set(store_key, uid.hex())
      else:
        uid = bytes.fromhex(compat.kv_get(store_key, config.timeout_s()))
      entries += [(key, len(ranks), r, d.local_hardware_id, uid) for r, d in local]
    module.nccl_init(entries, config.timeout_s())
    _ready[key] = len(entries)
    return key
