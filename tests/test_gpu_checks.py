"""The GPU check script, as far as a machine without a GPU can check it: every CUDA entry point
is named in tests/gpu/run.sh with the check that runs it, and that check uses it."""

import os
import pathlib
import re
import shutil

import pytest

from jaxcc._src import ffi

ROOT = pathlib.Path(__file__).resolve().parents[1]
# What a check calls for a target it does not name: the public functions that lower to it.
CALLS = {"jaxcc_reduce": "reduce_sum", "jaxcc_codec_encode_fixed": "codec.encode",
         "jaxcc_codec_decode_fixed": "codec.decode", "jaxcc_codec_encode_entropy": "codec.encode",
         "jaxcc_codec_decode_entropy": "codec.decode"}


def cuda_targets():
  text = (ROOT / "xla_ffi/cuda/module.cc").read_text()
  table = text[text.index("kTargets[]"):text.index("};", text.index("kTargets[]"))]
  return re.findall(r'\{"(\w+)",', table)


def test_every_cuda_entry_point_has_its_check():
  targets = cuda_targets()
  assert "jaxcc_collective" in targets and "jaxcc_piece_hop" in targets
  script = (ROOT / "tests/gpu/run.sh").read_text()
  header = script[:script.index("set -euo pipefail")]
  for target in targets:
    line = re.search(rf"^#\s+{target}\b(.*)$", header, re.M)
    assert line, f"tests/gpu/run.sh does not name {target}"
    # The check of a target is on its line or on the first line above that names one.
    above = header[:line.start()] + line.group(0)
    check = re.findall(r"(check_\w+\.py)", above)[-1]
    source = (ROOT / "tests/gpu" / check).read_text()
    assert target in source or CALLS.get(target, target) in source, (target, check)


def test_the_cuda_module_is_built_where_nvcc_is():
  """CI has nvcc and no GPU: the CUDA module is built there (every source for sm_80 and sm_90,
  warnings as errors under CI=true) and imports without a GPU, with every target."""
  if not shutil.which(os.environ.get("CUDACXX", "nvcc")) or (
      os.environ.get("JAXCC_ENABLE_CUDA", "AUTO").upper() in ("OFF", "0", "FALSE", "NO")):
    pytest.skip("a CPU-only build: no nvcc here, or JAXCC_ENABLE_CUDA=OFF (make test's newest "
                "leg; the .venv leg builds the CUDA module)")
  assert ffi.HAS_CUDA, "nvcc is on PATH but jaxcc was built without its CUDA module"
  registered = set(ffi._jaxcc_cuda.registrations())
  want = set(cuda_targets())
  if os.environ.get("CI") == "true":  # `make` fetched nccl.h: collective.cu is compiled too
    assert ffi._jaxcc_cuda.has_nccl(), "the CUDA module was built without the Nccl transport"
  elif not ffi._jaxcc_cuda.has_nccl():
    want.discard("jaxcc_collective")
  assert registered == want
