"""The GPU (Nccl transport) path of the native executor, as far as a CPU-only host can check it:
lowering for CUDA picks jaxcc_collective or the XLA executor, and names why."""

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxcc
from jaxcc._src import nccl_bootstrap

CASES = {
    "all_reduce": lambda ex: lambda v: jaxcc.all_reduce(v, "x", executor=ex),
    "reduce_scatter": lambda ex: lambda v: jaxcc.reduce_scatter(v, "x", executor=ex),
    "all_gather": lambda ex: lambda v: jaxcc.all_gather(v, "x", executor=ex),
    "broadcast": lambda ex: lambda v: jaxcc.broadcast(v, "x", root=1, executor=ex),
}


def lower_for_cuda(body):
  mesh = jax.make_mesh((2, 2), ("y", "x"), devices=jax.devices()[:4])
  spec = P(("y", "x"))
  x = jax.device_put(np.arange(64, dtype=np.float32), NamedSharding(mesh, spec))
  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))
  return f.trace(x).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("name", sorted(CASES))
def test_native_lowers_to_jaxcc_collective_with_comm_key(monkeypatch, name):
  made = []

  def ensure_comms(mesh, axis_name, group_axes):
    key, devices = nccl_bootstrap.comm_key(mesh, axis_name, group_axes)
    made.append([[d.id for d in ranks] for ranks in devices])
    return key

  monkeypatch.setattr(nccl_bootstrap, "unavailable", lambda: None)
  monkeypatch.setattr(nccl_bootstrap, "ensure_comms", ensure_comms)
  text = lower_for_cuda(CASES[name]("native"))
  assert "jaxcc_collective" in text and "comm_key" in text
  assert made == [[[0, 1], [2, 3]]]  # one group per y, ranks along x


def test_without_the_transport_auto_falls_back_and_native_says_why(monkeypatch):
  monkeypatch.setattr(nccl_bootstrap, "unavailable", lambda: "no libnccl.so.2 here")
  assert "jaxcc_collective" not in lower_for_cuda(CASES["all_reduce"]("auto"))
  assert "jaxcc_collective" not in lower_for_cuda(CASES["all_reduce"]("xla"))
  with pytest.raises(NotImplementedError, match="no libnccl.so.2 here"):
    lower_for_cuda(CASES["all_reduce"]("native"))


def test_comm_key_depends_on_axis_and_devices():
  devices = jax.devices()[:4]
  a = jax.make_mesh((2, 2), ("y", "x"), devices=devices)
  b = jax.make_mesh((2, 2), ("y", "x"), devices=devices[::-1])
  key_x, _ = nccl_bootstrap.comm_key(a, "x", (("y", 2),))
  key_y, _ = nccl_bootstrap.comm_key(a, "y", (("x", 2),))
  key_b, _ = nccl_bootstrap.comm_key(b, "x", (("y", 2),))
  assert len({key_x, key_y, key_b}) == 3
  assert all(0 <= k < 1 << 63 for k in (key_x, key_y, key_b))
