"""``codec="auto"``: code a collective's pieces where that is faster than moving them raw.

A piece of ``N`` raw bytes over a port of ``B`` bytes/s takes ``N / B`` raw
and about ``r N / B + N / E + N / D`` coded ("entropy": ratio ``r``, encode
``E`` and decode ``D`` bytes/s, counted whole although the pipelined schedules
overlap them with the wire). "auto" codes where that is at most ``MARGIN``
of the raw time on the topology's slowest port (inside a cluster or across,
whichever the schedule crosses): bf16 gradients on a 20 Mbit/s link are
coded (``0.67 + 2.5e6 * (1/1.59e9 + 1/3.28e9)``: 0.67 of raw), float32 on a
link of 1 GB/s or more is not (0.83 + 0.54 > 1).

``r``, ``E`` and ``D`` are those ``benchmarks/codec_table.py`` measured on
the MiniLM-L6 gradients (``benchmarks/codec_table.json``); f16, which no
model there holds, takes bf16's speeds and a ratio of 0.85 (its 5-bit
exponent leaves less to code). ``declare_ratio`` sets the ratio of a dtype's
data for this process (every process of a job must declare the same: the
choice is part of the plan). The choice is logged (logger "jaxcc", INFO)
the first time each (dtype, port, choice) is made, and ``auto_choice`` says
it and why.
"""

from __future__ import annotations

import logging

import numpy as np

from jaxcc.topology import Topology

logger = logging.getLogger("jaxcc")
MARGIN = 0.9
# dtype name: (ratio, encode bytes/s, decode bytes/s), "entropy" on the MiniLM-L6 gradients.
MEASURED = {"bfloat16": (0.672, 1.591e9, 3.282e9), "float32": (0.827, 2.722e9, 5.677e9),
            "float16": (0.85, 1.591e9, 3.282e9)}
_declared: dict[str, float] = {}
_logged: set = set()


def declare_ratio(dtype, ratio: float | None) -> None:
  """Set (None: clear) the encoded/raw ratio ``codec="auto"`` expects of ``dtype``'s data.

  Raises:
    ValueError: ``dtype`` is not one the codecs take, or ``ratio`` is not in (0, 1.1].
  """
  name = np.dtype(dtype).name
  if name not in MEASURED:
    raise ValueError(f"jaxcc.codec.declare_ratio: the codecs take {sorted(MEASURED)}, not {name}")
  if ratio is None:
    _declared.pop(name, None)
  elif not 0 < ratio <= 1.1:
    raise ValueError(f"jaxcc.codec.declare_ratio: ratio must be in (0, 1.1], got {ratio!r}")
  else:
    _declared[name] = float(ratio)


def auto_choice(dtype, topology: Topology) -> tuple[str | None, str]:
  """What ``codec="auto"`` picks for ``dtype`` on ``topology``: ("entropy" or None, why)."""
  name = np.dtype(dtype).name
  if name not in MEASURED:
    return None, f"{name} is not a dtype the codecs take"
  ratio, encode, decode = MEASURED[name]
  ratio = _declared.get(name, ratio)
  port = min(topology.ports)  # the slowest a schedule on it moves bytes through
  coded = ratio + port * (1 / encode + 1 / decode)
  choice = "entropy" if coded <= MARGIN else None
  why = (f"{name} over a port of {port / 1e6:.3g} MB/s: coded {coded:.2f} of the raw time "
         f"(ratio {ratio:.3f}, encode {encode / 1e9:.2f} GB/s, decode {decode / 1e9:.2f} GB/s), "
         f"{'at most' if choice else 'more than'} {MARGIN}")
  key = (name, port, choice)
  if key not in _logged:
    _logged.add(key)
    logger.info("jaxcc: codec='auto' chose %s: %s", choice, why)
  return choice, why

