"""Calibration: the throughput a testbed's links really carry, against their configured rates.

Every host streams to the next around the ring at once (``stream.py``), so
each NIC carries one TCP flow out and one in, as in a ring all_reduce. The
ratio of measured goodput (payload bits/s, past TCP's start) to the link's
configured rate (the slower of the sender's and the receiver's) is the link
efficiency: what framing, ACKs and the token buckets leave of the rate.
``jaxcc.bench.collective`` simulates its schedules on the configured rates
times the median efficiency.
"""

from __future__ import annotations

import json
import os
import random
import statistics

from jaxcc.launcher import launch
from jaxcc.testbed import Cluster

STREAM = os.path.join(os.path.dirname(__file__), "stream.py")


def calibrate(cluster: Cluster, seconds: float = 2.0, timeout_s: float = 120) -> dict:
  """Measure every link of an entered ``cluster`` for about ``seconds``.

  Args:
    cluster: an entered ``jaxcc.testbed.Cluster``, at least 2 hosts.
    seconds: how long the slowest link streams.
    timeout_s: limit for the whole measurement.

  Returns:
    ``{"seconds", "nbytes", "links": [{"src", "dst", "configured_bps", "measured_bps",
    "ratio"}], "efficiency"}``: per link in ring order, and the median ratio.
  """
  if cluster.n < 2:
    raise ValueError(f"calibrate: needs at least 2 hosts, got {cluster.n}")
  configured = [cluster.link_rate(i, (i + 1) % cluster.n) for i in range(cluster.n)]
  nbytes = int(min(configured) / 8 * seconds)
  config = {"addresses": [cluster.address(i) for i in range(cluster.n)],
            "port": random.randint(20000, 40000), "nbytes": nbytes, "timeout_s": timeout_s}
  results = [p.json() for p in launch(STREAM, [json.dumps(config)], cluster=cluster,
                                      timeout_s=timeout_s)]
  links = []
  for i, rate in enumerate(configured):
    measured = results[(i + 1) % cluster.n]["goodput_bps"]  # host i + 1 measured what i sent
    links.append({"src": i, "dst": (i + 1) % cluster.n, "configured_bps": rate,
                  "measured_bps": measured, "ratio": measured / rate})
  return {"seconds": seconds, "nbytes": nbytes, "links": links,
          "efficiency": statistics.median(link["ratio"] for link in links)}
