"""An emulated cluster on one Linux host: network namespaces shaped by ``tc``.

``jaxcc.launcher.launch(script, cluster=cluster)`` runs a JAX program in it.
"""

from jaxcc.testbed.netns import Cluster, cleanup_stale, mode, parse_rate, require_privileges

__all__ = ["Cluster", "cleanup_stale", "mode", "parse_rate", "require_privileges"]
