"""The numpy twin of the codec kernels: the same bytes, slowly, on the host.

Formats (documented in full in ``xla_ffi/include/jaxcc/codec.h``):

* Every encoding starts with a 32-byte header: magic ``JCC1``, codec id,
  dtype id, log2 block size, element count (u64), total size (u64) and a
  checksum (two u32 sums over the rest of the bytes).
* ``"fixed"``, blocks of 256 elements: 2 bytes per block (base exponent,
  escape count), 4 bits of exponent code per element, the sign+mantissa
  planes verbatim, and a spill area (escapes or raw exponent bits) whose pool
  of ceil(N/32) bytes is part of the static size.
* ``"entropy"``, blocks of 65536 elements: a u32 size per block; each block
  dense (Huffman-coded byte planes), sparse (a zero bitmap, then the planes of
  the nonzero elements) or raw.
* The split layout of a bf16/f32 piece that the native executor sends in two
  parts over TCP (:func:`split_encode`).

Used by the tests as the oracle (the FFI kernels must match it byte for byte)
and by :func:`jaxcc.codec.encode` / :func:`jaxcc.codec.decode` when
``JAXCC_USE_FFI=0``.
"""

from __future__ import annotations

import numpy as np

MAGIC = 0x3143434A
SPLIT_MAGIC = 0x3153434A
HEADER_BYTES = 32
CODEC_IDS = {"fixed": 1, "entropy": 2}
DTYPE_IDS = {"bfloat16": 1, "float16": 2, "float32": 3}
FIXED_BLOCK = 256
FIXED_RAW = 255
ENTROPY_BLOCK = 1 << 16
SUB_STREAM = 1024
MAX_CODE_LEN = 11
SAMPLE_STRIDE = 16
SAMPLE_MIN = 4096
DENSE, SPARSE, RAW_BLOCK = 0, 1, 2
RAW_PLANE, HUFFMAN, CONSTANT = 0, 1, 2
_BLOCK_LOG2 = {"fixed": 8, "entropy": 16}
# bytes per element, exponent bits, planes (exponent plane included)
_INFO = {"bfloat16": (2, 8, 2), "float16": (2, 5, 3), "float32": (4, 8, 4)}


class DecodeError(ValueError):
  """The bytes are not a valid encoding (corrupted, truncated or mismatched)."""


def max_nbytes(n: int, dtype_name: str, codec: str) -> int:
  """Bytes that any encoding of ``n`` elements fits in: raw + headers."""
  if codec == "fixed":
    return _fixed_layout(n, dtype_name)["max_bytes"]
  return HEADER_BYTES + 5 * _ceil_div(n, ENTROPY_BLOCK) + n * _INFO[dtype_name][0]


def fixed_nbytes(n: int, dtype_name: str) -> int:
  """The size of a ``"fixed"`` encoding whose escapes fit the spill pool."""
  return _fixed_layout(n, dtype_name)["static_bytes"]


def encode(x: np.ndarray, codec: str) -> np.ndarray:
  """Encodes a bf16/f16/f32 array; returns exactly ``nbytes`` uint8 bytes."""
  name = np.dtype(x.dtype).name
  bits = _bits(np.ascontiguousarray(x).reshape(-1))
  body = _encode_fixed(bits, name) if codec == "fixed" else _encode_entropy(bits, name)
  return _finish(body, codec, name, bits.size)


def decode(data: np.ndarray, nbytes: int, shape, dtype, codec: str) -> np.ndarray:
  """Decodes ``data[:nbytes]``; raises :class:`DecodeError` on any inconsistency."""
  name = np.dtype(dtype).name
  n = int(np.prod(shape, dtype=np.int64))
  data = np.asarray(data, np.uint8).reshape(-1)
  _check(data, int(nbytes), codec, name, n)
  data = data[:nbytes]
  if codec == "fixed":
    bits = _decode_fixed(data, name, n)
  else:
    bits = _decode_entropy(data, name, n)
  return bits.view(np.dtype(dtype)).reshape(shape)


# --- planes -----------------------------------------------------------------


def _bits(x: np.ndarray) -> np.ndarray:
  return x.view(np.uint32 if x.dtype.itemsize == 4 else np.uint16)


def _split(v: np.ndarray, name: str) -> list[np.ndarray]:
  v = v.astype(np.uint32)
  u8 = lambda a: (a & 0xFF).astype(np.uint8)
  if name == "bfloat16":
    return [u8(v >> 7), u8(((v >> 8) & 0x80) | (v & 0x7F))]
  if name == "float16":
    return [u8((v >> 10) & 0x1F), u8(v), u8(((v >> 13) & 4) | ((v >> 8) & 3))]
  return [u8(v >> 23), u8(v), u8(v >> 8), u8(((v >> 24) & 0x80) | ((v >> 16) & 0x7F))]


def _join(planes: list[np.ndarray], name: str) -> np.ndarray:
  p = [q.astype(np.uint32) for q in planes]
  if name == "bfloat16":
    return (((p[1] & 0x80) << 8) | (p[0] << 7) | (p[1] & 0x7F)).astype(np.uint16)
  if name == "float16":
    return (((p[2] & 4) << 13) | ((p[0] & 31) << 10) | ((p[2] & 3) << 8) | p[1]).astype(np.uint16)
  return ((p[3] & 0x80) << 24) | (p[0] << 23) | ((p[3] & 0x7F) << 16) | (p[2] << 8) | p[1]


def _ceil_div(a: int, b: int) -> int:
  return -(-a // b)


# --- header and checksum ----------------------------------------------------


def checksum(data: np.ndarray, skip_field: bool = True) -> tuple[int, int]:
  """(A, B) over little-endian u32 words w_i, skipping words 6 and 7 (the header's field)."""
  padded = np.zeros(_ceil_div(data.size, 4) * 4, np.uint8)
  padded[:data.size] = data
  w = padded.view("<u4").astype(np.uint64)
  if skip_field:
    w[6:8] = 0
  i = np.arange(w.size, dtype=np.uint64)
  a = int(w.sum()) & 0xFFFFFFFF
  b = int(((2 * i + 1) * w).sum()) & 0xFFFFFFFF
  return a, b


def _finish(body: np.ndarray, codec: str, name: str, n: int) -> np.ndarray:
  out = body
  head = np.zeros(HEADER_BYTES, np.uint8)
  head[0:4] = np.frombuffer(np.uint32(MAGIC).tobytes(), np.uint8)
  head[4], head[5], head[6] = CODEC_IDS[codec], DTYPE_IDS[name], _BLOCK_LOG2[codec]
  head[8:16] = np.frombuffer(np.uint64(n).tobytes(), np.uint8)
  head[16:24] = np.frombuffer(np.uint64(out.size).tobytes(), np.uint8)
  out[:HEADER_BYTES] = head
  a, b = checksum(out)
  out[24:32] = np.frombuffer(np.array([a, b], "<u4").tobytes(), np.uint8)
  return out


def _check(data: np.ndarray, nbytes: int, codec: str, name: str, n: int) -> None:
  if data.size < HEADER_BYTES:
    raise DecodeError(f"truncated: the buffer holds {data.size} bytes, less than the "
                      f"{HEADER_BYTES}-byte header")
  head = data[:HEADER_BYTES]
  u32 = lambda o: int(head[o:o + 4].view("<u4")[0])
  u64 = lambda o: int(head[o:o + 8].view("<u8")[0])
  if u32(0) != MAGIC or head[7] != 0:
    raise DecodeError("bad header: not a jaxcc encoding (wrong magic bytes)")
  if head[4] != CODEC_IDS[codec]:
    raise DecodeError(f"bad header: codec id {head[4]}, expected {CODEC_IDS[codec]}")
  if head[5] != DTYPE_IDS[name] or head[6] != _BLOCK_LOG2[codec]:
    raise DecodeError(f"bad header: dtype id {head[5]}, expected {name}")
  if u64(8) != n:
    raise DecodeError(f"bad header: {u64(8)} elements, expected {n}")
  if u64(16) != nbytes:
    raise DecodeError(f"size mismatch: the header says {u64(16)} bytes, nbytes says {nbytes}")
  if nbytes > data.size or nbytes < HEADER_BYTES:
    raise DecodeError(f"truncated: the header says {nbytes} bytes but the buffer holds "
                      f"{data.size}")
  if checksum(data[:nbytes]) != (u32(24), u32(28)):
    raise DecodeError("checksum mismatch: the data is corrupted")


# --- "fixed" ----------------------------------------------------------------


def _fixed_layout(n: int, name: str) -> dict:
  elem, exp_bits, _ = _INFO[name]
  blocks = _ceil_div(n, FIXED_BLOCK)
  table = HEADER_BYTES
  codes = table + 2 * blocks
  planes = codes + _ceil_div(n, 2)
  packed3 = planes + (1 if name == "float16" else elem - 1) * n
  spill = packed3 + (_ceil_div(3 * n, 8) if name == "float16" else 0)
  pool = _ceil_div(n, 32)
  raw_spill = 0
  if blocks:
    last = n - (blocks - 1) * FIXED_BLOCK
    raw_spill = ((blocks - 1) * _ceil_div(FIXED_BLOCK * (exp_bits - 4), 8) +
                 _ceil_div(last * (exp_bits - 4), 8))
  return dict(blocks=blocks, table=table, codes=codes, planes=planes, packed3=packed3,
              spill=spill, static_bytes=spill + pool, max_bytes=spill + max(raw_spill, pool))


def _pack_nibbles(c: np.ndarray) -> np.ndarray:
  c = np.concatenate([c, np.zeros(c.size % 2, np.uint8)])
  return (c[0::2] | (c[1::2] << 4)).astype(np.uint8)


def _pack3(h: np.ndarray, n: int) -> np.ndarray:
  bits = np.stack([(h >> k) & 1 for k in range(3)], axis=1).reshape(-1).astype(np.uint8)
  return np.packbits(bits, bitorder="little")[:_ceil_div(3 * n, 8)]


def _encode_fixed(v: np.ndarray, name: str) -> np.ndarray:
  n = v.size
  _, exp_bits, _ = _INFO[name]
  lay = _fixed_layout(n, name)
  nb = lay["blocks"]
  planes = _split(v, name)
  e = np.zeros(nb * FIXED_BLOCK, np.int64)
  e[:n] = planes[0]
  eb = e.reshape(nb, FIXED_BLOCK)
  base = np.maximum(eb.max(axis=1, initial=0), 15)
  bb = base[:, None]
  escaping = (eb != 0) & (eb + 15 <= bb)
  codes = np.where((eb != 0) & (eb + 15 > bb), eb + 15 - bb, 0)
  m = np.minimum(FIXED_BLOCK, n - np.arange(nb) * FIXED_BLOCK)
  raw_spill = -(-(m * (exp_bits - 4)) // 8)
  count = escaping.sum(axis=1)
  esc = np.where((2 * count <= raw_spill) & (count < FIXED_RAW), count, FIXED_RAW)
  raw = esc == FIXED_RAW
  codes = np.where(raw[:, None], eb & 15, codes).reshape(-1)[:n].astype(np.uint8)
  spill = []
  for b in np.flatnonzero((esc != 0)):
    blk = eb[b, :m[b]]
    if raw[b]:
      high = (blk >> 4).astype(np.uint8)
      spill.append(_pack_nibbles(high) if exp_bits == 8 else
                   np.packbits(high & 1, bitorder="little"))
    else:
      idx = np.flatnonzero(escaping[b])
      spill.append(np.stack([idx, blk[idx]], axis=1).reshape(-1).astype(np.uint8))
  spill = np.concatenate(spill) if spill else np.zeros(0, np.uint8)
  out = np.zeros(max(lay["static_bytes"], lay["spill"] + spill.size), np.uint8)
  out[lay["table"]:lay["codes"]] = np.stack([base, esc], axis=1).reshape(-1)
  out[lay["codes"]:lay["planes"]] = _pack_nibbles(codes)
  if name == "float16":
    out[lay["planes"]:lay["planes"] + n] = planes[1]
    out[lay["packed3"]:lay["spill"]] = _pack3(planes[2], n)
  else:
    for k, p in enumerate(planes[1:]):
      out[lay["planes"] + k * n:lay["planes"] + (k + 1) * n] = p
  out[lay["spill"]:lay["spill"] + spill.size] = spill
  return out


def _decode_fixed(data: np.ndarray, name: str, n: int) -> np.ndarray:
  _, exp_bits, _ = _INFO[name]
  lay = _fixed_layout(n, name)
  if data.size < lay["static_bytes"]:
    raise DecodeError(f"truncated: {data.size} bytes, less than the static size "
                      f"{lay['static_bytes']}")
  nb = lay["blocks"]
  table = data[lay["table"]:lay["codes"]].reshape(nb, 2).astype(np.int64)
  base, esc = table[:, 0], table[:, 1]
  nib = data[lay["codes"]:lay["planes"]]
  codes = np.stack([nib & 15, nib >> 4], axis=1).reshape(-1)[:n].astype(np.int64)
  e = np.zeros(nb * FIXED_BLOCK, np.int64)
  e[:n] = codes
  eb = e.reshape(nb, FIXED_BLOCK)
  m = np.minimum(FIXED_BLOCK, n - np.arange(nb) * FIXED_BLOCK)
  raw_spill = -(-(m * (exp_bits - 4)) // 8)
  bad = (base >= (1 << exp_bits)) | (base < 15) | ((esc != FIXED_RAW) & (2 * esc > raw_spill))
  if bad.any():
    raise DecodeError(f"bad block header in block {int(np.flatnonzero(bad)[0])}")
  raw = esc == FIXED_RAW
  out_e = np.where(eb != 0, eb + base[:, None] - 15, 0)
  need = np.where(raw, raw_spill, 2 * esc)
  offsets = lay["spill"] + np.concatenate([[0], np.cumsum(need)])
  if offsets[-1] > data.size:
    raise DecodeError("bad block header: the spill runs past the end")
  for b in np.flatnonzero(esc != 0):
    s = data[offsets[b]:offsets[b + 1]].astype(np.int64)
    if raw[b]:
      if exp_bits == 8:
        high = np.stack([s & 15, s >> 4], axis=1).reshape(-1)[:m[b]]
      else:
        high = np.unpackbits(s.astype(np.uint8), bitorder="little")[:m[b]]
      out_e[b, :m[b]] = eb[b, :m[b]] | (high << 4)
      continue
    idx, ex = s[0::2], s[1::2]
    ok = (np.all(np.diff(idx) > 0) and np.all(idx < m[b]) and np.all(eb[b, idx] == 0) and
          np.all((ex != 0) & (ex + 15 <= base[b])))
    if not ok:
      raise DecodeError(f"bad escape in block {int(b)}")
    out_e[b, idx] = ex
  if data.size != max(lay["static_bytes"], offsets[-1]):
    raise DecodeError(f"size mismatch: {data.size} bytes, the blocks need "
                      f"{max(lay['static_bytes'], offsets[-1])}")
  e = out_e.reshape(-1)[:n]
  if name == "float16":
    bits = np.unpackbits(data[lay["packed3"]:lay["spill"]], bitorder="little")
    bits = bits[:3 * n].reshape(n, 3).astype(np.uint8)
    hi3 = bits[:, 0] | (bits[:, 1] << 1) | (bits[:, 2] << 2)
    planes = [e, data[lay["planes"]:lay["planes"] + n], hi3]
  else:
    k = _INFO[name][0] - 1
    planes = [e] + [data[lay["planes"] + j * n:lay["planes"] + (j + 1) * n] for j in range(k)]
  return _join(planes, name)


# --- "entropy": Huffman -----------------------------------------------------


def build_code_lengths(freq) -> np.ndarray:
  """Code lengths (<= 11) of a complete prefix code; the C++ BuildCodeLengths."""
  freq = [int(f) for f in freq]
  syms = [s for _, s in sorted((f, s) for s, f in enumerate(freq) if f)]
  n = len(syms)
  w = [freq[s] for s in syms] + [0] * n
  parent = [0] * (2 * n)
  leaf, node, nxt = 0, n, n
  for _ in range(n - 1):
    pick = []
    for _ in range(2):
      if leaf < n and (node >= nxt or w[leaf] <= w[node]):
        pick.append(leaf)
        leaf += 1
      else:
        pick.append(node)
        node += 1
    w[nxt] = w[pick[0]] + w[pick[1]]
    parent[pick[0]] = parent[pick[1]] = nxt
    nxt += 1
  root = nxt - 1
  depth = [0] * (2 * n)
  for i in range(root - 1, n - 1, -1):
    depth[i] = depth[parent[i]] + 1
  count = [0] * 64
  for i in range(n):
    count[min(depth[parent[i]] + 1, 63)] += 1
  for i in range(63, MAX_CODE_LEN, -1):
    while count[i] > 0:
      j = i - 2
      while count[j] == 0:
        j -= 1
      count[i] -= 2
      count[i - 1] += 1
      count[j + 1] += 2
      count[j] -= 1
  lengths = np.zeros(256, np.int64)
  k = n - 1
  for length in range(1, MAX_CODE_LEN + 1):
    for _ in range(count[length]):
      lengths[syms[k]] = length
      k -= 1
  return lengths


def canonical_codes(lengths: np.ndarray) -> np.ndarray:
  """Canonical codes ordered by (length, symbol), bit-reversed (LSB first)."""
  count = np.bincount(lengths, minlength=MAX_CODE_LEN + 1)
  count[0] = 0
  nxt, c = [0] * (MAX_CODE_LEN + 2), 0
  for length in range(1, MAX_CODE_LEN + 1):
    c = (c + int(count[length - 1])) << 1
    nxt[length] = c
  codes = np.zeros(256, np.int64)
  for s in range(256):
    length = int(lengths[s])
    if length:
      v = nxt[length]
      nxt[length] += 1
      codes[s] = int(format(v, f"0{length}b")[::-1], 2)
  return codes


def _plan_plane(hist: np.ndarray, c: int):
  """(kind, lo, hi, bound, lengths): the C++ PlanPlane."""
  if c == 0:
    return RAW_PLANE, 0, 0, 1 + c, None
  present = np.flatnonzero(hist)
  lo, hi = int(present[0]), int(present[-1])
  if lo == hi:
    return CONSTANT, lo, lo, 2, None
  lengths = build_code_lengths(hist)
  bits = int((hist.astype(np.int64) * lengths).sum())
  subs = _ceil_div(c, SUB_STREAM)
  bound = 1 + 2 + (hi - lo + 2) // 2 + 2 * subs + (bits + 7 * subs) // 8
  if _worth_coding(bound, 1 + c):
    return HUFFMAN, lo, hi, bound, lengths
  return RAW_PLANE, 0, 0, 1 + c, None


def _worth_coding(size: int, raw: int) -> bool:
  """Huffman coding must save 1/32 of the raw bytes."""
  return size + (raw >> 5) < raw


def _sample_worth_coding(plane: np.ndarray) -> bool:
  """Judges a sign+mantissa plane on every SAMPLE_STRIDE-th symbol."""
  hist = np.bincount(plane[::SAMPLE_STRIDE], minlength=256)
  if np.count_nonzero(hist) < 2:
    return True
  bits = int((hist * build_code_lengths(hist)).sum())
  return _worth_coding(bits, 8 * int(hist.sum()))


def _huffman_streams(sym: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(u16 sizes, stream bytes) of the sub-streams of ``sym``."""
  codes = canonical_codes(lengths)
  c = sym.size
  subs = _ceil_div(c, SUB_STREAM)
  ln, cd = lengths[sym], codes[sym]
  sub = np.arange(c) // SUB_STREAM
  ends = np.cumsum(ln)
  sub_bits = np.add.reduceat(ln, np.arange(0, c, SUB_STREAM))
  sub_bytes = -(-sub_bits // 8)
  sub_start = 8 * np.concatenate([[0], np.cumsum(sub_bytes)[:-1]])
  first_end = np.concatenate([[0], ends[np.arange(SUB_STREAM, c, SUB_STREAM) - 1]])
  pos = sub_start[sub] + (ends - ln) - first_end[sub]
  bits = np.zeros(8 * int(sub_bytes.sum()), np.uint8)
  for k in range(MAX_CODE_LEN):
    has = ln > k
    bits[pos[has] + k] = (cd[has] >> k) & 1
  sizes = sub_bytes.astype("<u2").view(np.uint8)
  assert sizes.size == 2 * subs
  return sizes, np.packbits(bits, bitorder="little")


def _write_plane(sym: np.ndarray, plan) -> list[np.ndarray]:
  kind, lo, hi, _, lengths = plan
  if kind == RAW_PLANE:
    return [np.array([kind], np.uint8), sym.astype(np.uint8)]
  if kind == CONSTANT:
    return [np.array([kind, lo], np.uint8)]
  nib = _pack_nibbles(lengths[lo:hi + 1].astype(np.uint8))
  sizes, data = _huffman_streams(sym.astype(np.int64), lengths)
  return [np.array([kind, lo, hi], np.uint8), nib, sizes, data]


def _encode_entropy(v: np.ndarray, name: str) -> np.ndarray:
  n = v.size
  elem, _, _ = _INFO[name]
  blocks = _ceil_div(n, ENTROPY_BLOCK)
  parts, sizes = [], []
  for b in range(blocks):
    blk = v[b * ENTROPY_BLOCK:(b + 1) * ENTROPY_BLOCK]
    m = blk.size
    planes = _split(blk, name)
    nonzero = blk != 0
    zeros = m - int(nonzero.sum())
    sparse_candidate = zeros * 8 >= m
    hists = [np.bincount(p, minlength=256) for p in planes]
    dense = []
    for k, (p, h) in enumerate(zip(planes, hists)):
      sampled_raw = (k > 0 and not sparse_candidate and m >= SAMPLE_MIN and
                     not _sample_worth_coding(p))
      dense.append((RAW_PLANE, 0, 0, 1 + m, None) if sampled_raw else _plan_plane(h, m))
    best, kind = 1 + m * elem, RAW_BLOCK
    if 1 + sum(p[3] for p in dense) < best:
      best, kind = 1 + sum(p[3] for p in dense), DENSE
    if sparse_candidate:
      bitmap = np.packbits(nonzero, bitorder="little")
      bm_plan = _plan_plane(np.bincount(bitmap, minlength=256), bitmap.size)
      nz_hists = [h.copy() for h in hists]
      for h in nz_hists:
        h[0] -= zeros
      nz_plans = [_plan_plane(h, m - zeros) for h in nz_hists]
      sparse = 1 + 4 + bm_plan[3] + sum(p[3] for p in nz_plans)
      if sparse < best:
        best, kind = sparse, SPARSE
    block = [np.array([kind], np.uint8)]
    if kind == RAW_BLOCK:
      block.append(blk.view(np.uint8))
    elif kind == DENSE:
      for p, plan in zip(planes, dense):
        block += _write_plane(p, plan)
    else:
      block.append(np.frombuffer(np.uint32(m - zeros).tobytes(), np.uint8))
      block += _write_plane(bitmap, bm_plan)
      for p, plan in zip(planes, nz_plans):
        block += _write_plane(p[nonzero], plan)
    block = np.concatenate(block)
    parts.append(block)
    sizes.append(block.size)
  table = np.array(sizes, "<u4").view(np.uint8)
  return np.concatenate([np.zeros(HEADER_BYTES, np.uint8), table] + parts)


class _Reader:

  def __init__(self, data: np.ndarray, start: int, end: int):
    self.data, self.pos, self.end = data, start, end

  def take(self, k: int) -> np.ndarray:
    if k > self.end - self.pos:
      raise DecodeError("corrupted plane: it runs past its block")
    out = self.data[self.pos:self.pos + k]
    self.pos += k
    return out


def _decode_table(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  size = 1 << MAX_CODE_LEN
  present = lengths > 0
  if (lengths > MAX_CODE_LEN).any() or int((size >> lengths[present]).sum()) != size:
    raise DecodeError("corrupted plane: the Huffman code lengths are not a complete code")
  codes = canonical_codes(lengths)
  sym = np.zeros(size, np.int64)
  ln = np.zeros(size, np.int64)
  for s in np.flatnonzero(present):
    idx = np.arange(codes[s], size, 1 << int(lengths[s]))
    sym[idx], ln[idx] = s, lengths[s]
  return sym, ln


def _read_plane(r: _Reader, c: int) -> np.ndarray:
  kind = int(r.take(1)[0])
  if kind == RAW_PLANE:
    return r.take(c).copy()
  if kind == CONSTANT:
    if c == 0:
      raise DecodeError("corrupted plane: a constant plane of no symbols")
    return np.full(c, r.take(1)[0], np.uint8)
  if kind != HUFFMAN or c == 0:
    raise DecodeError(f"corrupted plane: kind {kind}")
  lo, hi = (int(t) for t in r.take(2))
  if lo >= hi:
    raise DecodeError("corrupted plane: empty Huffman symbol range")
  nib = r.take((hi - lo + 2) // 2)
  lengths = np.zeros(256, np.int64)
  lengths[lo:hi + 1] = np.stack([nib & 15, nib >> 4], axis=1).reshape(-1)[:hi - lo + 1]
  if (hi - lo) % 2 == 0 and nib[-1] >> 4:
    raise DecodeError("corrupted plane: nonzero padding nibble")
  tsym, tlen = _decode_table(lengths)
  subs = _ceil_div(c, SUB_STREAM)
  sizes = r.take(2 * subs).view("<u2").astype(np.int64)
  out = np.zeros(c, np.uint8)
  for j in range(subs):
    stream = r.take(int(sizes[j]))
    count = min(SUB_STREAM, c - j * SUB_STREAM)
    bits = np.unpackbits(stream, bitorder="little").astype(np.int64)
    bits = np.concatenate([bits, np.zeros(count * MAX_CODE_LEN + MAX_CODE_LEN, np.int64)])
    width = bits.size - MAX_CODE_LEN
    window = sum(bits[k:k + width] << k for k in range(MAX_CODE_LEN))
    syms, lens = tsym[window].tolist(), tlen[window].tolist()
    p, got = 0, []
    for _ in range(count):
      got.append(syms[p])
      p += lens[p]
    if _ceil_div(p, 8) != sizes[j]:
      raise DecodeError("corrupted plane: a Huffman sub-stream has the wrong length")
    out[j * SUB_STREAM:j * SUB_STREAM + count] = got
  return out


def _decode_entropy(data: np.ndarray, name: str, n: int) -> np.ndarray:
  elem, _, _ = _INFO[name]
  blocks = _ceil_div(n, ENTROPY_BLOCK)
  start = HEADER_BYTES + 4 * blocks
  if start > data.size:
    raise DecodeError("truncated: the block table does not fit")
  sizes = data[HEADER_BYTES:start].view("<u4").astype(np.int64)
  dtype = np.uint32 if elem == 4 else np.uint16
  out = np.zeros(n, dtype)
  pos = start
  for b in range(blocks):
    m = min(ENTROPY_BLOCK, n - b * ENTROPY_BLOCK)
    if sizes[b] == 0 or pos + sizes[b] > data.size:
      raise DecodeError(f"truncated: block {b} runs past the end")
    r = _Reader(data, pos, pos + int(sizes[b]))
    pos += int(sizes[b])
    kind = int(r.take(1)[0])
    dst = out[b * ENTROPY_BLOCK:b * ENTROPY_BLOCK + m]
    if kind == RAW_BLOCK:
      if r.end - r.pos != m * elem:
        raise DecodeError(f"bad raw block size in block {b}")
      dst[:] = r.take(m * elem).view(dtype)
    elif kind == DENSE:
      planes = [_read_plane(r, m) for _ in range(_INFO[name][2])]
      dst[:] = _join(planes, name)
    elif kind == SPARSE:
      nnz = int(r.take(4).view("<u4")[0])
      if nnz > m:
        raise DecodeError(f"corrupted plane in block {b}")
      bitmap = _read_plane(r, _ceil_div(m, 8))
      planes = [_read_plane(r, nnz) for _ in range(_INFO[name][2])]
      flags = np.unpackbits(bitmap, bitorder="little")
      if int(flags.sum()) != nnz or flags[m:].any():
        raise DecodeError(f"bad zero bitmap in block {b}")
      dst[:] = 0
      dst[flags[:m].astype(bool)] = _join(planes, name)
    else:
      raise DecodeError(f"bad block kind in block {b}")
    if r.pos != r.end:
      raise DecodeError(f"corrupted plane in block {b}")
  if pos != data.size:
    raise DecodeError("size mismatch: the blocks end before nbytes")
  return out


def split_encode(x: np.ndarray) -> np.ndarray:
  """A bf16/f32 piece in the split layout: part A (header, sign+mantissa planes), then part B.

  Part B is the exponent plane of each 65536-element block coded as an
  "entropy" plane, after a u32 size per block, and its checksum (from word 0).
  """
  name = np.dtype(x.dtype).name
  planes = _split(_bits(np.ascontiguousarray(x).reshape(-1)), name)
  n = planes[0].size
  end = HEADER_BYTES + (len(planes) - 1) * n
  head = np.zeros(_ceil_div(end, 4) * 4, np.uint8)
  head[HEADER_BYTES:end] = np.concatenate(planes[1:])
  head[0:4] = np.frombuffer(np.uint32(SPLIT_MAGIC).tobytes(), np.uint8)
  head[4], head[5], head[6] = CODEC_IDS["entropy"], DTYPE_IDS[name], _BLOCK_LOG2["entropy"]
  head[8:16] = np.frombuffer(np.uint64(n).tobytes(), np.uint8)
  head[16:24] = np.frombuffer(np.uint64(head.size).tobytes(), np.uint8)
  head[24:32] = np.frombuffer(np.array(checksum(head), "<u4").tobytes(), np.uint8)
  coded = []
  for start in range(0, n, ENTROPY_BLOCK):
    e = planes[0][start:start + ENTROPY_BLOCK]
    coded.append(np.concatenate(_write_plane(e, _plan_plane(np.bincount(e, minlength=256),
                                                            e.size))))
  table = np.array([c.size for c in coded], "<u4").view(np.uint8)
  body = np.concatenate([table] + coded)
  trailer = np.frombuffer(np.array(checksum(body, skip_field=False), "<u4").tobytes(), np.uint8)
  return np.concatenate([head, body, trailer])
