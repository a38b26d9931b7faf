"""jaxcc._src.config: every JAXCC_* setting parsed once, with errors that name the variable."""

import os
import re
import subprocess
import sys
from unittest import mock

import pytest

from jaxcc._src import config, ffi


@pytest.mark.parametrize("value, seconds", [(None, 300.0), ("", 300.0), ("2", 2.0),
                                            ("0.5", 0.5), (" 1e3 ", 1000.0)])
def test_timeout_s(value, seconds):
  env = {} if value is None else {"JAXCC_TIMEOUT_S": value}
  with mock.patch.dict(os.environ, env):
    if value is None:
      os.environ.pop("JAXCC_TIMEOUT_S", None)
    assert config.timeout_s() == seconds
    assert config.timeout_ms() == int(seconds * 1000)


@pytest.mark.parametrize("value", ["abc", "0", "-1", "nan", "inf", "5s"])
def test_timeout_s_rejects(value):
  with mock.patch.dict(os.environ, {"JAXCC_TIMEOUT_S": value}):
    with pytest.raises(ValueError, match=r"JAXCC_TIMEOUT_S=.*number of seconds > 0"):
      config.timeout_s()


@pytest.mark.parametrize("value, nbytes", [("", 262144), ("0", 0), ("4096", 4096)])
def test_split_send_bytes(value, nbytes):
  with mock.patch.dict(os.environ, {"JAXCC_SPLIT_SEND_BYTES": value}):
    assert config.split_send_bytes() == nbytes


@pytest.mark.parametrize("value", ["-1", "1.5", "lots"])
def test_split_send_bytes_rejects(value):
  with mock.patch.dict(os.environ, {"JAXCC_SPLIT_SEND_BYTES": value}):
    with pytest.raises(ValueError, match=r"JAXCC_SPLIT_SEND_BYTES=.*whole number of bytes >= 0"):
      config.split_send_bytes()


@pytest.mark.parametrize("name, read, value, want", [
    ("JAXCC_INTRA_ENGINE", config.intra_engine, None, "auto"),
    ("JAXCC_INTRA_ENGINE", config.intra_engine, "", "auto"),
    ("JAXCC_INTRA_ENGINE", config.intra_engine, "xla", "xla"),
    ("JAXCC_INTRA_ENGINE", config.intra_engine, "native", "native"),
    ("JAXCC_EXCHANGE", config.exchange, None, "native"),
    ("JAXCC_EXCHANGE", config.exchange, "", "native"),
    ("JAXCC_EXCHANGE", config.exchange, "host", "host"),
    ("JAXCC_EXCHANGE", config.exchange, "native", "native")])
def test_choice_settings(name, read, value, want, monkeypatch):
  if value is None:
    monkeypatch.delenv(name, raising=False)
  else:
    monkeypatch.setenv(name, value)
  assert read() == want
  monkeypatch.setenv(name, "nccl")
  with pytest.raises(ValueError, match=f"{name}='nccl': expected one of"):
    read()


def test_settings_are_read_at_each_call():
  with mock.patch.dict(os.environ, {"JAXCC_TIMEOUT_S": "7"}):
    assert config.timeout_s() == 7.0
    os.environ["JAXCC_TIMEOUT_S"] = "8"
    assert config.timeout_s() == 8.0


MISSING_RANK = """
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
import jaxcc
from jaxcc._src import native_executor
sched = jaxcc.plan("all_reduce", 4 * 40, jaxcc.Topology.uniform(5, 1.0), "ring")
mesh = jax.make_mesh((4,), ("x",))
x = jax.device_put(np.ones((4 * 40,), np.float32), NamedSharding(mesh, P("x")))
f = jax.jit(jax.shard_map(lambda b: native_executor.run_schedule(b, sched, "x", ()),
                          mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False))
np.asarray(f(x))
"""


def test_the_native_executor_takes_a_fractional_timeout():
  """JAXCC_TIMEOUT_S=0.5 reaches the handler as 500 ms: a missing rank fails after 0.5 s."""
  env = dict(os.environ, JAXCC_TIMEOUT_S="0.5", JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=4")
  proc = subprocess.run([sys.executable, "-c", MISSING_RANK], env=env, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode != 0
  assert re.search(r"timed out after 0.5 s at step \d+ waiting for rank \d.*never joined: rank 4",
                   proc.stderr), proc.stderr[-3000:]


def test_a_bad_timeout_fails_the_lowering_naming_the_variable():
  env = dict(os.environ, JAXCC_TIMEOUT_S="soon", JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=4")
  proc = subprocess.run([sys.executable, "-c", MISSING_RANK], env=env, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode != 0
  assert "ValueError: JAXCC_TIMEOUT_S='soon': expected a number of seconds > 0" in proc.stderr, (
      proc.stderr[-3000:])


NATIVE_FROM = """
from jaxcc import _jaxcc_cpu
from jaxcc._src import ffi
native = ffi.load()
print(_jaxcc_cpu.__file__, native.cpu is _jaxcc_cpu, native.cuda)
"""


def test_native_dir_imports_the_native_modules_from_there(tmp_path, monkeypatch):
  """JAXCC_NATIVE_DIR (as `make sanitize` sets it): the modules in it, and no others."""
  cpu = ffi.load().cpu.__file__
  os.symlink(cpu, tmp_path / os.path.basename(cpu))
  proc = subprocess.run([sys.executable, "-c", NATIVE_FROM], capture_output=True, text=True,
                        env=dict(os.environ, JAXCC_NATIVE_DIR=str(tmp_path)), timeout=300)
  assert proc.stdout.split() == [str(tmp_path / os.path.basename(cpu)), "True", "None"], (
      proc.stderr[-3000:])
  (tmp_path / os.path.basename(cpu)).unlink()
  proc = subprocess.run([sys.executable, "-c", NATIVE_FROM], capture_output=True, text=True,
                        env=dict(os.environ, JAXCC_NATIVE_DIR=str(tmp_path)), timeout=300)
  assert f"no jaxcc._jaxcc_cpu in JAXCC_NATIVE_DIR={tmp_path}" in proc.stderr, proc.stderr[-3000:]
  monkeypatch.setenv("JAXCC_NATIVE_DIR", str(tmp_path / "absent"))
  with pytest.raises(ValueError, match="JAXCC_NATIVE_DIR=.*absent'?: expected a directory"):
    config.native_dir()
