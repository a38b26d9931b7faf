"""What the tests that build a testbed share: the privilege gate and a namespace listing."""

import os
import subprocess

import pytest

from jaxcc import testbed
from jaxcc.testbed import netns


def require():
  """Skip where no testbed can be built (neither root nor user namespaces, or no iproute2),
  except under CI (``CI`` set), where that fails the test."""
  try:
    testbed.require_privileges()
  except RuntimeError as e:
    if os.environ.get("CI"):
      pytest.fail(f"CI must run the testbed tests: {e}")
    pytest.skip(str(e))


def namespaces(prefix: str = netns.PREFIX) -> list[str]:
  """The network namespaces whose names start with ``prefix``."""
  out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
  return [line.split()[0] for line in out.splitlines() if line.startswith(prefix)]
