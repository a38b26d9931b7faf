"""An emulated cluster on one Linux host (network namespaces shaped by ``tc``) and a launcher."""

from jaxcc.testbed.launcher import launch
from jaxcc.testbed.netns import Cluster, cleanup_stale, parse_rate, require_privileges

__all__ = ["Cluster", "cleanup_stale", "launch", "parse_rate", "require_privileges"]
