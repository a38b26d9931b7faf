"""The GPU (Nccl transport) path of the native executor, as far as a CPU-only host can check it:
lowering for CUDA picks jaxcc_collective or the XLA executor, and names why."""

import re

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


def _fake_comms(monkeypatch):
  """Lowering without a GPU: the transport counts as there and communicator keys are made, not
  communicators; returns the (axis, groups of device ids) of every key asked for."""
  made = []

  def ensure_comms(mesh, axis_name, group_axes):
    key, devices = nccl_bootstrap.comm_key(mesh, axis_name, group_axes)
    made.append((axis_name, [[d.id for d in ranks] for ranks in devices]))
    return key

  monkeypatch.setattr(nccl_bootstrap, "unavailable", lambda: None)
  monkeypatch.setattr(nccl_bootstrap, "ensure_comms", ensure_comms)
  return made


@pytest.mark.parametrize("codec", [None, "fixed", "entropy"])
@pytest.mark.parametrize("algorithm", ["auto", "ring", "direct"])
def test_codec_travels_to_the_nccl_call(monkeypatch, codec, algorithm):
  """With codec= the Nccl transport encodes its pieces: the call carries the codec's id (auto
  without a codec on equal ports is XLA's collective)."""
  _fake_comms(monkeypatch)
  text = lower_for_cuda(lambda v: jaxcc.all_reduce(v, "x", algorithm=algorithm, codec=codec))
  calls = [line for line in text.splitlines() if "jaxcc_collective" in line]
  if algorithm == "auto" and codec is None:
    assert not calls and "all_reduce" in text
    return
  assert calls, text[:2000]
  ids = {None: 0, "fixed": 1, "entropy": 2}
  assert all(re.search(rf"\bcodec = {ids[codec]} : i64", line) for line in calls), calls[0]


def test_codec_on_other_dtypes_fails_at_trace_time(monkeypatch):
  _fake_comms(monkeypatch)
  mesh = jax.make_mesh((2, 2), ("y", "x"), devices=jax.devices()[:4])
  x = jax.device_put(np.arange(64, dtype=np.int32), NamedSharding(mesh, P(("y", "x"))))
  f = jax.jit(jax.shard_map(lambda v: jaxcc.all_reduce(v, "x", codec="fixed"), mesh=mesh,
                            in_specs=P(("y", "x")), out_specs=P(("y", "x"))))
  with pytest.raises(TypeError, match="codec='fixed' cannot take int32"):
    f.trace(x).lower(lowering_platforms=("cuda",))


@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter", "all_gather"])
def test_hierarchical_runs_intra_on_xla_and_cross_on_nccl(monkeypatch, collective):
  """On the GPU the border engine is the default: the intra-cluster phases on XLA's collective
  (NCCL through XLA) over "ici", the cross-cluster phase on jaxcc's Nccl transport over
  "dcn"."""
  made = _fake_comms(monkeypatch)
  mesh = jax.make_mesh((2, 2), ("dcn", "ici"), devices=jax.devices()[:4])
  axes = ("dcn", "ici")
  fn = getattr(jaxcc, collective)
  body = lambda v: fn(v, axes, algorithm="hierarchical")
  spec = P() if collective == "all_reduce" else P(axes)
  x = jax.device_put(np.arange(4 * 64, dtype=np.float32), NamedSharding(mesh, P(axes)))
  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(axes), out_specs=spec))
  text = f.trace(x).lower(lowering_platforms=("cuda",)).as_text()
  assert "jaxcc_collective" in text
  intra = {"all_reduce": ("all_to_all", "all_gather"), "reduce_scatter": ("all_to_all",),
           "all_gather": ("all_gather",)}[collective]
  for op in intra:
    assert op in text or op.replace("_", "-") in text, op
  assert made == [("dcn", [[0, 2], [1, 3]])]  # the cross phase: one group per ici rank
