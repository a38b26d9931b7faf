"""The TCP transport against a hostile peer: tests/tcp_fuzz_worker.py as 2 processes.

The peer (process 1) passes the real handshake, then sends rank 1's frame of a
native all_gather honestly or broken: every header field mutated (fixed cases
naming the field they must be refused for, and seeded random ones), a frame
cut in the header or the payload, one that stalls, garbage, a duplicate, beats
(harmless) and a beat with a payload, and
with integrity on, frames whose MAC does not verify. jaxcc (process 0) must
end every broken collective within the timeout with an error naming process 1
and the field, never a wrong result, and the honest collective after each one
must give the right result.
"""

import collections
import json
import os
import re

import pytest

from jaxcc import launcher

pytestmark = pytest.mark.multiprocess

WORKER = os.path.join(os.path.dirname(__file__), "tcp_fuzz_worker.py")
TIMEOUT_S = 2


@pytest.mark.parametrize("integrity", ["off", "hmac"])
def test_broken_frames_fail_the_collective_naming_the_field_and_the_next_one_works(integrity):
  jaxcc_side, _ = launcher.launch(
      WORKER, ["7"], nproc=2, local_devices=1, timeout_s=400,
      env={"JAXCC_TIMEOUT_S": str(TIMEOUT_S), "JAXCC_TCP_INTEGRITY": integrity})
  assert "OK" in jaxcc_side.stdout, jaxcc_side.stdout[-3000:] + jaxcc_side.stderr[-3000:]
  rows = [json.loads(line) for line in jaxcc_side.stdout.splitlines() if line.startswith("{")]
  refused = collections.Counter()
  for row in rows:
    result, expect = row["result"], row["expect"]
    assert row["seconds"] < TIMEOUT_S + 3, row
    assert not result.startswith("WRONG"), row
    if expect is None:
      assert result == "ok", row
    elif expect == "any":
      assert result == "ok" or re.search(r"process 1|rank 1", result), row
    else:
      assert re.fullmatch(f"(?s).*({expect}).*", result), row
      assert result == "ok" or "jaxcc all_gather" in result, row
    if result != "ok":  # counted by what the error names
      named = re.search(r"whose (\w+)|(in the middle of a frame)|(timed out)|(planned a different "
                        r"schedule)|(aborted the call)", result)
      refused[next(g for g in named.groups() if g) if named else "other"] += 1
  honest = [r for r in rows if r["expect"] is None]
  print(f"\nintegrity {integrity}: {len(rows) - len(honest)} broken frames, "
        f"{sum(refused.values())} refused: {dict(refused)}; {len(honest)} honest collectives right")
