"""The host logic of the Nccl transport's coded steps (xla_ffi/include/jaxcc/piece_layout.h),
checked on the CPU: piece sizes, segment offsets from announced sizes, and every rank's coded
plan, run for all ranks at once with the CPU piece codec.

The run is the GPU transport's protocol on the host: per step each rank encodes its sends or
forwards what the previous step left (a copy's received bytes, or the encoded sum of its
reduce), the sizes and bytes go to the receivers in pair order, copies decode and the reduce
sums and re-encodes. A forwarded piece must be byte for byte the fresh encoding of its range,
the two ends of every pair must post the same pieces in the same order, the plan's areas must
not overlap, and the result must be the raw schedule's.
"""

import numpy as np
import pytest

import bitwise
from bitwise import segment_sizes
from jaxcc import Topology, _jaxcc_cpu, plan
from jaxcc.codec import reference
from jaxcc.schedules.ir import DST, DST_START, LENGTH, OP, REDUCE, SRC, SRC_START, STEP

SEGMENT = reference.ENTROPY_BLOCK
SEED = np.random.SeedSequence().entropy
CODECS = ("fixed", "entropy")


def ids(codec, dtype):
  return reference.CODEC_IDS[codec], reference.DTYPE_IDS[np.dtype(dtype).name]


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("n", [1, 255, 4099, SEGMENT, 2 * SEGMENT + 3])
def test_max_bytes_bound_every_piece(codec, dtype, n):
  bound = _jaxcc_cpu.piece_max_bytes(*ids(codec, dtype), n)
  segments = [min(SEGMENT, n - i) for i in range(0, n, SEGMENT)]
  assert bound == sum(reference.max_nbytes(m, dtype, codec) for m in segments)
  rng = np.random.default_rng([SEED, n])
  for kind in ("special", "bits", "sparse", "weights"):
    x = bitwise.float_data(kind, n, dtype, rng)
    assert len(_jaxcc_cpu.piece_encode(*ids(codec, dtype), x.tobytes(), False)) <= bound


@pytest.mark.parametrize("codec", CODECS)
def test_segment_offsets_from_announced_sizes(codec):
  n = 3 * SEGMENT + 11
  x = bitwise.float_data("weights", n, "float32", np.random.default_rng([SEED, 3]))
  data = _jaxcc_cpu.piece_encode(*ids(codec, np.float32), x.tobytes(), False)
  sizes = segment_sizes(data)
  cap = _jaxcc_cpu.piece_max_bytes(*ids(codec, np.float32), n)
  offsets, total = _jaxcc_cpu.segment_offsets(*ids(codec, np.float32), n, sizes, cap)
  assert offsets == list(np.cumsum([0] + sizes[:-1])) and total == len(data)
  for bad, match in (([31] + sizes[1:], "announced as 31 bytes"),
                     (sizes[:-1] + [cap], "announced as"),
                     (sizes[:-1], "3 sizes for 4 segments")):
    with pytest.raises(ValueError, match=match):
      _jaxcc_cpu.segment_offsets(*ids(codec, np.float32), n, bad, cap)
  with pytest.raises(ValueError, match="more than the"):
    _jaxcc_cpu.segment_offsets(*ids(codec, np.float32), n, sizes, len(data) - 1)


def schedules():
  """Schedules of every shape the transport meets: rings (forwarded copies and sums), direct
  and OptCC (many pieces per step), the chain broadcast, hierarchical clusters, pipelined
  chunks, odd lengths that cross segments."""
  straggler = Topology.uniform(5, 1.0).with_straggler(2, 0.5)
  clusters = Topology.clusters([2, 3], 1.0, 0.25)
  length = 2 * SEGMENT + 37
  yield plan("all_reduce", 4 * 3 * length, Topology.uniform(3, 1.0), "ring")
  yield plan("all_reduce", 4 * 5 * 4099, straggler, "optcc")
  yield plan("all_reduce", 4 * 4 * 1001, Topology.uniform(4, 1.0), "direct", chunks=3)
  yield plan("reduce_scatter", 4 * 4 * 777, Topology.uniform(4, 1.0), "ring", chunks=2)
  yield plan("all_gather", 4 * 3 * length, Topology.uniform(3, 1.0), "ring")
  yield plan("broadcast", 4 * length, Topology.uniform(4, 1.0), "ring", root=1, chunks=2)
  yield plan("all_reduce", 4 * 5 * 301, clusters, "hierarchical")


def run_raw(sched, bufs):
  """The schedule on raw elements (float64: the data are small integers, so every order of the
  sums gives the same value)."""
  bufs = [b.astype(np.float64) for b in bufs]
  rows = sched.table
  for t in range(sched.num_steps):
    step = rows[rows[:, STEP] == t]
    before = [b.copy() for b in bufs]
    for r in step:
      piece = before[r[SRC]][r[SRC_START]:r[SRC_START] + r[LENGTH]]
      dst = bufs[r[DST]][r[DST_START]:r[DST_START] + r[LENGTH]]
      if r[OP] == REDUCE:
        dst += piece
      else:
        dst[:] = piece
  return bufs


def run_coded(sched, bufs, codec, dtype):
  """Every rank's coded plan, step by step, over the CPU piece codec."""
  cid, did = ids(codec, dtype)
  p, n = sched.nranks, sched.length
  plans = [_jaxcc_cpu.coded_plan(sched.serialized, sched.num_steps, p, r, n, cid, did)
           for r in range(p)]
  bufs = [b.copy() for b in bufs]
  received = [[] for _ in range(p)]  # the bytes of the previous step's recvs
  sums = [None] * p                  # the encoded sum of the previous step's reduce
  for t in range(sched.num_steps):
    wire = {}  # (src, dst) -> [(piece, sizes, bytes)] in the sender's pair order
    for r in range(p):
      sends, _, _, send_words, _ = plans[r][0][t]
      words = 0
      for peer, src, dst, length, forwards, forwards_sum, _, word in sends:
        fresh = _jaxcc_cpu.piece_encode(cid, did, bufs[r][src:src + length].tobytes(), False)
        data = (received[r][forwards] if forwards >= 0 else
                sums[r] if forwards_sum else fresh)
        assert data == fresh, (t, r, peer, forwards, forwards_sum)
        assert word == words
        words += -(-length // SEGMENT)
        wire.setdefault((r, peer), []).append(((src, dst, length), segment_sizes(data), data))
      assert words == send_words
    new_received, new_sums = [[] for _ in range(p)], [None] * p
    for r in range(p):
      _, recvs, keeps_sum, _, recv_words = plans[r][0][t]
      words = 0
      got, reduce_terms = [], {}
      for i, (peer, src, dst, length, reduce, _, word) in enumerate(recvs):
        piece, sizes, data = wire[(peer, r)].pop(0)
        assert piece == (src, dst, length), (t, r, peer)  # NCCL matches in posting order
        assert word == words and len(sizes) == -(-length // SEGMENT)
        words += len(sizes)
        offsets, total = _jaxcc_cpu.segment_offsets(
            cid, did, length, sizes, _jaxcc_cpu.piece_max_bytes(cid, did, length))
        assert total == len(data)
        got.append(data)
        if reduce:
          reduce_terms[(r - peer) % p] = (data, dst, length)
        else:
          out = _jaxcc_cpu.piece_decode(cid, did, data, length)
          bufs[r][dst:dst + length] = np.frombuffer(out, bufs[r].dtype)
      assert words == recv_words
      if reduce_terms:
        terms = [reduce_terms[k] for k in sorted(reduce_terms)]  # the canonical order
        _, dst, length = terms[0]
        own = bufs[r][dst:dst + length].tobytes()
        total, encoded = _jaxcc_cpu.piece_decode_reduce(cid, did, [d for d, _, _ in terms], own,
                                                        keeps_sum)
        bufs[r][dst:dst + length] = np.frombuffer(total, bufs[r].dtype)
        new_sums[r] = encoded if keeps_sum else None
      else:
        assert not keeps_sum
      new_received[r] = got
    assert not any(wire.values()), "pieces sent that nobody received"
    received, sums = new_received, new_sums
  return bufs


def check_areas(coded, sched, codec, dtype):
  """Aligned, disjoint areas inside the plan's totals."""
  steps, totals = coded
  cid, did = ids(codec, dtype)
  for sends, recvs, _, _, _ in steps:
    fresh = [(s[6], _jaxcc_cpu.piece_max_bytes(cid, did, s[3])) for s in sends
             if s[4] < 0 and not s[5]]
    staged = [(r[5], _jaxcc_cpu.piece_max_bytes(cid, did, r[3])) for r in recvs]
    for areas, total in ((fresh, totals["send_bytes"]), (staged, totals["staging_bytes"])):
      end = 0
      for at, size in sorted(areas):
        assert at % 256 == 0 and at >= end and at + size <= total
        end = at + size
    for items in (sends, recvs):
      keys = [item[:4] for item in items]
      assert keys == sorted(keys), "not in pair order"


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("dtype", [np.float32, "bfloat16"])
def test_coded_steps_forward_exactly_and_give_the_raw_result(codec, dtype):
  rng = np.random.default_rng([SEED, len(codec)])
  dt = np.dtype(dtype)
  forwarded = 0
  for sched in schedules():
    bufs = [rng.integers(-8, 9, sched.length).astype(dt) for _ in range(sched.nranks)]
    want = run_raw(sched, bufs)
    got = run_coded(sched, bufs, codec, dt)
    for r in range(sched.nranks):
      np.testing.assert_array_equal(got[r].astype(np.float64), want[r],
                                    err_msg=f"{sched.algorithm} rank {r} seed={SEED}")
      coded = _jaxcc_cpu.coded_plan(sched.serialized, sched.num_steps, sched.nranks, r,
                                    sched.length, *ids(codec, dt))
      check_areas(coded, sched, codec, dt)
      forwarded += sum(s[4] >= 0 or s[5] for step in coded[0] for s in step[0])
  assert forwarded > 0  # the rings forward


def test_a_ring_forwards_every_piece_after_the_first_step():
  sched = plan("all_reduce", 4 * 4 * 1000, Topology.uniform(4, 1.0), "ring", chunks=1)
  steps, totals = _jaxcc_cpu.coded_plan(sched.serialized, sched.num_steps, 4, 0, sched.length,
                                        *ids("fixed", np.float32))
  (first, *rest) = [step[0] for step in steps]
  assert all(s[4] < 0 and not s[5] for s in first)
  p = 4
  for t, sends in enumerate(rest, 1):
    kind = "sum" if t < p - 1 else "copy"  # reduce-scatter steps forward sums, then copies
    for s in sends:
      assert (s[5] if kind == "sum" or t == p - 1 else s[4] >= 0), (t, s)
  assert totals["sum_bytes"] > 0 and totals["reduce_inputs"] == 1


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("n,k,add,encode", [(1, 0, False, True), (4099, 1, False, False),
                                            (2 * SEGMENT + 3, 3, True, True),
                                            (SEGMENT, 9, True, False)])
def test_hop_work_areas_are_aligned_disjoint_and_large_enough(codec, dtype, n, k, add, encode):
  """The device work areas of one hop: what each kernel of xla_ffi/cuda/codec_*.cu writes
  there fits, and no two areas overlap."""
  cid, did = ids(codec, dtype)
  w = _jaxcc_cpu.hop_work_layout(cid, did, n, k, add, encode)
  itemsize, planes = {"bfloat16": (2, 2), "float16": (2, 3), "float32": (4, 4)}[dtype]
  blocks, segments = -(-n // 256), -(-n // SEGMENT)
  align = lambda b: -(-b // 256) * 256  # noqa: E731
  need = {"inputs": k * w["hop_input_bytes"]}
  if codec == "fixed":
    need.update(spill=k * align(4 * blocks), meta=2 * blocks, spill_size=4 * blocks,
                spill_offset=4 * blocks)
  else:
    need.update(planes=segments * (planes + 1) * SEGMENT,
                decoded=k * n * itemsize if add else 0)
    if encode:
      need.update(nz=segments * planes * SEGMENT, bitmap=segments * SEGMENT // 8,
                  slots=segments * (1 + SEGMENT * itemsize), block_sizes=4 * (segments + 1))
  areas = sorted((w[name], size, name) for name, size in need.items() if size)
  end = 0
  for at, size, name in areas:
    assert at % 256 == 0 and at >= end, (name, at, end)
    end = at + size
  assert end <= w["bytes"]
