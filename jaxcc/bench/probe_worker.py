"""One process of a topology probe: ``jaxcc.probe_topology`` on a 1-D mesh; print one JSON line.

Usage: ``python probe_worker.py CONFIG_JSON``, with CONFIG ``{"nbytes": int,
"seconds": float}``; ``jaxcc.bench.probe.run`` starts it on every host of a
testbed cluster. Prints ``{"process": i, "seconds": wall time of the probe,
"topology": {Topology fields}}``.
"""

import dataclasses
import json
import sys
import time

import jax

import jaxcc
from jaxcc.launcher import join


def main():
  config = json.loads(sys.argv[1])
  processes = join().num_processes
  mesh = jax.make_mesh((jax.device_count(),), ("x",))
  start = time.perf_counter()
  topology = jaxcc.probe_topology(mesh, "x", nbytes=config["nbytes"], seconds=config["seconds"])
  print(json.dumps({"process": jax.process_index(), "seconds": time.perf_counter() - start,
                    "topology": dataclasses.asdict(topology)}), flush=True)
  if processes > 1:
    jax.distributed.shutdown()


if __name__ == "__main__":
  main()
