// The jaxcc codec formats, all of them, shared by the CPU kernels
// (xla_ffi/cpu/codec*.cc), the CUDA kernels (xla_ffi/cuda/codec*.cu) and, byte
// for byte, the numpy twin (jaxcc/codec/reference.py).
//
// Elements of bf16, f16 and f32 are split into an exponent stream and
// sign+mantissa byte planes:
//
//   dtype  exponent        sign+mantissa planes
//   bf16   e = v>>7 & 255  p1 = sign<<7 | m[6:0]
//   f32    e = v>>23 & 255 p1 = m[7:0], p2 = m[15:8], p3 = sign<<7 | m[22:16]
//   f16    e = v>>10 & 31  p1 = m[7:0], p2 = sign<<2 | m[9:8]     (3 bits)
//
// Every encoding starts with the same 32-byte little-endian header:
//
//   0  u32 magic "JCC1"     8  u64 element count
//   4  u8  codec (1 fixed, 2 entropy)     16 u64 nbytes (whole encoding)
//   5  u8  dtype (1 bf16, 2 f16, 3 f32)   24 u32 checksum A
//   6  u8  log2 of the block size         28 u32 checksum B
//   7  u8  0
//
// The checksum covers every byte of the encoding except [24, 32), as
// little-endian u32 words w_i (i = byte offset / 4, the tail zero-padded):
// A = sum w_i, B = sum (2i+1) w_i, mod 2^32. Sums are order-free, so the GPU
// reduces them in parallel.
//
// "fixed" (blocks of kFixedBlock = 256 elements; static size when it fits):
//
//   header | block table: nb x {u8 base, u8 esc} | codes: 4 bits per element
//   | planes (bf16: N B; f32: 3 x N B; f16: N B + 3 bits per element packed)
//   | spill: a pool of kFixedSpill(N) = ceil(N/32) bytes, extended if needed
//
//   base = max(max exponent of the block, 15). An exponent e is coded as
//   0 if e == 0, else e - base + 15 if that is in [1, 15], else it escapes
//   (code 0). A block's escapes ({u8 index, u8 exponent} in index order, esc
//   of them) or, when they would cost more, its raw exponents (esc = 255: the
//   codes hold the low 4 bits, the spill the high E-4 bits, packed) go to the
//   spill area in block order. nbytes = max(static size, end of spill): the
//   static size FixedStaticBytes(N) whenever the spill fits its pool, and
//   never more than raw + header + 2 bytes per block.
//
// "entropy" (blocks of kEntropyBlock = 65536 elements, variable size):
//
//   header | u32 block sizes[nb] | blocks
//   block: u8 kind, then
//     kind 0 dense:  the exponent plane, then the sm planes, over m elements
//     kind 1 sparse: u32 nnz, a plane of ceil(m/8) bitmap bytes (bit i%8 of
//                    byte i/8 set iff element i != +0.0 bits), then the
//                    exponent and sm planes of the nnz nonzero elements
//     kind 2 raw:    the m elements verbatim
//   plane of c byte symbols: u8 kind, then
//     0 raw:      c bytes
//     1 huffman:  u8 lo, u8 hi, ceil((hi-lo+1)/2) bytes of 4-bit code lengths
//                 (low nibble first) for symbols lo..hi; u16 sizes of the
//                 ceil(c/1024) sub-streams; the sub-streams, each a canonical
//                 Huffman code of <= 1024 symbols (<= 11 bits), LSB first,
//                 padded to a byte
//     2 constant: u8 symbol
//   The encoder picks, per plane and per block, the smallest by a bound on
//   the size (Huffman only if it saves 1/32; sign+mantissa planes first
//   judged on a 1/16 sample), so a block is never larger than 1 + its raw
//   bytes.
//
// The split layout (the Tcp transport's pieces of bf16 or f32 that must start
// to leave before their exponents are coded: xla_ffi/cpu/piece_codec.h; the
// numpy twin's split_encode), n elements in two parts sent back to back:
//
//   part A: the 32-byte header above but with magic "JCS1" (kSplitMagic;
//           codec 2, block 2^16, nbytes: part A's size, checksum of part A),
//           then the sign+mantissa planes verbatim (plane k at 32 + (k-1) n),
//           zero-padded to 4 bytes;
//   part B: u32 sizes of the exponent blocks, then per block of 65536
//           elements its exponent plane coded as an "entropy" plane, then
//           u32 A, u32 B: the checksum of part B's bytes before it (the same
//           sums, from word 0).
//
//   Part A costs one pass over the input; part B holds ~3 bits per element.
#ifndef JAXCC_CODEC_H_
#define JAXCC_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "jaxcc/dtypes.h"

namespace jaxcc {
namespace codec {

enum CodecId : uint8_t { kFixed = 1, kEntropy = 2 };
enum DTypeId : uint8_t { kBF16 = 1, kF16 = 2, kF32 = 3 };

constexpr uint32_t kMagic = 0x3143434Au;       // "JCC1"
constexpr uint32_t kSplitMagic = 0x3153434Au;  // "JCS1": part A of a split piece
constexpr size_t kHeaderBytes = 32;
constexpr size_t kChecksumOffset = 24;

constexpr int kFixedBlockLog2 = 8;
constexpr size_t kFixedBlock = size_t{1} << kFixedBlockLog2;
constexpr uint8_t kFixedRawExponents = 255;  // esc value of a raw-exponent block

constexpr int kEntropyBlockLog2 = 16;
constexpr size_t kEntropyBlock = size_t{1} << kEntropyBlockLog2;
constexpr size_t kSubStream = 1024;  // symbols per Huffman sub-stream
constexpr int kMaxCodeLen = 11;
constexpr uint32_t kTableSize = 1u << kMaxCodeLen;
enum BlockKind : uint8_t { kDense = 0, kSparse = 1, kRawBlock = 2 };
enum PlaneKind : uint8_t { kRawPlane = 0, kHuffman = 1, kConstant = 2 };
constexpr int kMaxPlanes = 4;

// ---------------------------------------------------------------------------
// Element layout per dtype.
// ---------------------------------------------------------------------------

// bytes per element, exponent bits, planes (exponent plane included)
struct DTypeInfo {
  int elem_bytes;
  int exp_bits;
  int planes;
};

JAXCC_HD constexpr DTypeInfo Info(DTypeId d) {
  switch (d) {
    case kBF16: return {2, 8, 2};
    case kF16: return {2, 5, 3};
    default: return {4, 8, 4};
  }
}

// Splits element bits v into planes[0] (exponent) ... planes[Info.planes - 1].
template <DTypeId D>
JAXCC_HD inline void Split(uint32_t v, uint8_t* p) {
  if constexpr (D == kBF16) {
    p[0] = static_cast<uint8_t>(v >> 7);
    p[1] = static_cast<uint8_t>(((v >> 8) & 0x80u) | (v & 0x7fu));
  } else if constexpr (D == kF16) {
    p[0] = static_cast<uint8_t>((v >> 10) & 0x1fu);
    p[1] = static_cast<uint8_t>(v);
    p[2] = static_cast<uint8_t>(((v >> 13) & 4u) | ((v >> 8) & 3u));
  } else {
    p[0] = static_cast<uint8_t>(v >> 23);
    p[1] = static_cast<uint8_t>(v);
    p[2] = static_cast<uint8_t>(v >> 8);
    p[3] = static_cast<uint8_t>(((v >> 24) & 0x80u) | ((v >> 16) & 0x7fu));
  }
}

template <DTypeId D>
JAXCC_HD inline uint8_t Exponent(uint32_t v) {
  if constexpr (D == kF16) return static_cast<uint8_t>((v >> 10) & 0x1fu);
  else if constexpr (D == kBF16) return static_cast<uint8_t>(v >> 7);
  else return static_cast<uint8_t>(v >> 23);
}

// The inverse of Split.
template <DTypeId D>
JAXCC_HD inline uint32_t Join(uint32_t e, uint32_t p1, uint32_t p2 = 0, uint32_t p3 = 0) {
  if constexpr (D == kBF16) {
    return ((p1 & 0x80u) << 8) | (e << 7) | (p1 & 0x7fu);
  } else if constexpr (D == kF16) {
    return ((p2 & 4u) << 13) | (e << 10) | ((p2 & 3u) << 8) | p1;
  } else {
    return ((p3 & 0x80u) << 24) | (e << 23) | ((p3 & 0x7fu) << 16) | (p2 << 8) | p1;
  }
}

// ---------------------------------------------------------------------------
// Header and checksum.
// ---------------------------------------------------------------------------

JAXCC_HD inline uint32_t Load32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
JAXCC_HD inline uint64_t Load64(const uint8_t* p) {
  return uint64_t{Load32(p)} | uint64_t{Load32(p + 4)} << 32;
}
JAXCC_HD inline void Store32(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
  p[2] = static_cast<uint8_t>(v >> 16);
  p[3] = static_cast<uint8_t>(v >> 24);
}
JAXCC_HD inline void Store64(uint8_t* p, uint64_t v) {
  Store32(p, static_cast<uint32_t>(v));
  Store32(p + 4, static_cast<uint32_t>(v >> 32));
}

struct Header {
  uint8_t codec = 0;
  uint8_t dtype = 0;
  uint8_t block_log2 = 0;
  uint64_t count = 0;
  uint64_t nbytes = 0;
  uint32_t sum_a = 0;
  uint32_t sum_b = 0;
};

JAXCC_HD inline void WriteHeader(uint8_t* p, const Header& h) {
  Store32(p, kMagic);
  p[4] = h.codec;
  p[5] = h.dtype;
  p[6] = h.block_log2;
  p[7] = 0;
  Store64(p + 8, h.count);
  Store64(p + 16, h.nbytes);
  Store32(p + 24, h.sum_a);
  Store32(p + 28, h.sum_b);
}

// False if the magic or the reserved byte is wrong.
JAXCC_HD inline bool ReadHeader(const uint8_t* p, Header* h) {
  h->codec = p[4];
  h->dtype = p[5];
  h->block_log2 = p[6];
  h->count = Load64(p + 8);
  h->nbytes = Load64(p + 16);
  h->sum_a = Load32(p + 24);
  h->sum_b = Load32(p + 28);
  return Load32(p) == kMagic && p[7] == 0;
}

struct Checksum {
  uint32_t a = 0;
  uint32_t b = 0;
};

// Word i (zero-padded past nbytes) of an encoding of nbytes bytes.
JAXCC_HD inline uint32_t ChecksumWord(const uint8_t* data, uint64_t nbytes, uint64_t i) {
  const uint64_t off = 4 * i;
  if (off + 4 <= nbytes) return Load32(data + off);
  uint32_t w = 0;
  for (uint64_t k = off; k < nbytes; ++k) w |= uint32_t{data[k]} << (8 * (k - off));
  return w;
}

// The contribution of word i to the checksum (zero for the checksum field).
JAXCC_HD inline void ChecksumAdd(Checksum* c, uint32_t w, uint64_t i) {
  if (i == kChecksumOffset / 4 || i == kChecksumOffset / 4 + 1) return;
  c->a += w;
  c->b += (2u * static_cast<uint32_t>(i) + 1u) * w;
}

// ---------------------------------------------------------------------------
// "fixed" layout.
// ---------------------------------------------------------------------------

JAXCC_HD inline uint64_t CeilDiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

struct FixedLayout {
  uint64_t blocks;        // nb
  uint64_t table;         // offset of the block table
  uint64_t codes;         // offset of the 4-bit codes
  uint64_t planes;        // offset of plane 1; plane k at planes + (k-1) * n
  uint64_t packed3;       // f16: offset of the 3-bit plane
  uint64_t spill;         // offset of the spill area
  uint64_t static_bytes;  // size when the spill fits its pool
  uint64_t max_bytes;     // size when every block has raw exponents
};

// Bytes of the high exponent bits of a raw-exponent block of m elements.
JAXCC_HD inline uint64_t FixedRawSpill(DTypeId d, uint64_t m) {
  return CeilDiv(m * (Info(d).exp_bits - 4), 8);
}

JAXCC_HD inline FixedLayout MakeFixedLayout(DTypeId d, uint64_t n) {
  const DTypeInfo info = Info(d);
  FixedLayout l;
  l.blocks = CeilDiv(n, kFixedBlock);
  l.table = kHeaderBytes;
  l.codes = l.table + 2 * l.blocks;
  l.planes = l.codes + CeilDiv(n, 2);
  const uint64_t byte_planes = d == kF16 ? 1 : info.elem_bytes - 1;
  l.packed3 = l.planes + byte_planes * n;
  l.spill = l.packed3 + (d == kF16 ? CeilDiv(3 * n, 8) : 0);
  l.static_bytes = l.spill + CeilDiv(n, 32);
  uint64_t raw_spill = 0;
  if (l.blocks) {
    raw_spill = (l.blocks - 1) * FixedRawSpill(d, kFixedBlock) +
                FixedRawSpill(d, n - (l.blocks - 1) * kFixedBlock);
  }
  l.max_bytes = l.spill + (raw_spill > CeilDiv(n, 32) ? raw_spill : CeilDiv(n, 32));
  return l;
}

// Block base: the largest exponent, at least 15 so that codes 1..15 map to
// exponents >= 1.
JAXCC_HD inline uint32_t FixedBase(uint32_t max_exp) { return max_exp > 15 ? max_exp : 15; }

// Code of exponent e in a block with base b (0 for e == 0 and for escapes).
JAXCC_HD inline uint32_t FixedCode(uint32_t e, uint32_t b) {
  return (e != 0 && e + 15 > b) ? e + 15 - b : 0;
}
JAXCC_HD inline bool FixedEscapes(uint32_t e, uint32_t b) { return e != 0 && e + 15 <= b; }
JAXCC_HD inline uint32_t FixedExponent(uint32_t code, uint32_t b) {
  return code ? code + b - 15 : 0;
}

// Spill bytes of a block: esc escapes of 2 bytes, or its raw exponent bits.
JAXCC_HD inline uint64_t FixedBlockSpill(DTypeId d, uint32_t esc, uint64_t m) {
  return esc == kFixedRawExponents ? FixedRawSpill(d, m) : 2 * uint64_t{esc};
}

// The esc byte for a block with `escapes` escaping elements.
JAXCC_HD inline uint32_t FixedEscByte(DTypeId d, uint64_t escapes, uint64_t m) {
  return (2 * escapes <= FixedRawSpill(d, m) && escapes < kFixedRawExponents)
             ? static_cast<uint32_t>(escapes)
             : kFixedRawExponents;
}

// ---------------------------------------------------------------------------
// "entropy": Huffman codes.
// ---------------------------------------------------------------------------

JAXCC_HD inline uint64_t EntropyMaxBytes(DTypeId d, uint64_t n) {
  const uint64_t blocks = CeilDiv(n, kEntropyBlock);
  return kHeaderBytes + 5 * blocks + n * Info(d).elem_bytes;
}

JAXCC_HD inline uint32_t NumSubStreams(uint64_t c) {
  return static_cast<uint32_t>(CeilDiv(c, kSubStream));
}

// Code lengths (<= kMaxCodeLen, 0 for absent symbols) of a complete prefix
// code for freq[0..255], at least two of them nonzero. Huffman's algorithm
// (two queues, a leaf wins ties), lengths over kMaxCodeLen folded back as in
// JPEG (ITU T.81 K.3), then lengths handed out shortest first in the order
// of decreasing (freq, symbol). Deterministic; the numpy twin does the same.
JAXCC_HD inline void BuildCodeLengths(const uint32_t* freq, uint8_t* len) {
  uint16_t sym[256];
  uint64_t w[512];
  int16_t parent[512];
  uint8_t depth[512];
  int n = 0;
  for (int s = 0; s < 256; ++s) {
    len[s] = 0;
    if (freq[s]) sym[n++] = static_cast<uint16_t>(s);
  }
  if (n < 2) return;
  // Insertion sort by (freq, symbol) ascending (symbols arrive ascending).
  for (int i = 1; i < n; ++i) {
    const uint16_t s = sym[i];
    int j = i - 1;
    while (j >= 0 && freq[sym[j]] > freq[s]) {
      sym[j + 1] = sym[j];
      --j;
    }
    sym[j + 1] = s;
  }
  for (int i = 0; i < n; ++i) w[i] = freq[sym[i]];
  int leaf = 0, node = n, next = n;
  for (int k = 0; k < n - 1; ++k) {
    int pick[2];
    for (int t = 0; t < 2; ++t) {
      if (leaf < n && (node >= next || w[leaf] <= w[node])) {
        pick[t] = leaf++;
      } else {
        pick[t] = node++;
      }
    }
    w[next] = w[pick[0]] + w[pick[1]];
    parent[pick[0]] = parent[pick[1]] = static_cast<int16_t>(next);
    ++next;
  }
  const int root = next - 1;
  depth[root] = 0;
  for (int i = root - 1; i >= n; --i) depth[i] = depth[parent[i]] + 1;
  int count[64] = {0};
  for (int i = 0; i < n; ++i) {
    int d = depth[parent[i]] + 1;
    count[d < 63 ? d : 63]++;
  }
  for (int i = 63; i > kMaxCodeLen; --i) {
    while (count[i] > 0) {
      int j = i - 2;
      while (count[j] == 0) --j;
      count[i] -= 2;
      count[i - 1] += 1;
      count[j + 1] += 2;
      count[j] -= 1;
    }
  }
  int l = 1, k = n - 1;
  for (; l <= kMaxCodeLen; ++l) {
    for (int c = 0; c < count[l]; ++c) len[sym[k--]] = static_cast<uint8_t>(l);
  }
}

// Canonical codes (ordered by (length, symbol)), bit-reversed for LSB-first
// streams. len must describe a complete code.
JAXCC_HD inline void CanonicalCodes(const uint8_t* len, uint16_t* code) {
  int count[kMaxCodeLen + 1] = {0};
  for (int s = 0; s < 256; ++s) count[len[s]]++;
  count[0] = 0;
  uint32_t next[kMaxCodeLen + 2];
  uint32_t c = 0;
  for (int l = 1; l <= kMaxCodeLen; ++l) {
    c = (c + count[l - 1]) << 1;
    next[l] = c;
  }
  for (int s = 0; s < 256; ++s) {
    code[s] = 0;
    const int l = len[s];
    if (!l) continue;
    uint32_t v = next[l]++, r = 0;
    for (int i = 0; i < l; ++i) r |= ((v >> i) & 1u) << (l - 1 - i);
    code[s] = static_cast<uint16_t>(r);
  }
}

// Bytes of a serialised table with symbols lo..hi.
JAXCC_HD inline uint32_t TableBytes(uint32_t lo, uint32_t hi) { return 2 + (hi - lo + 2) / 2; }

struct PlanePlan {
  uint8_t kind;      // PlaneKind
  uint8_t lo, hi;    // huffman: symbol range; constant: lo is the symbol
  uint64_t bound;    // upper bound of the serialised plane size, kind byte included
};

// Huffman coding must save 1/32 of a plane's raw bytes to be used: decoding
// a raw plane is a copy.
JAXCC_HD inline bool WorthCoding(uint64_t bytes, uint64_t raw_bytes) {
  return bytes + (raw_bytes >> 5) < raw_bytes;
}

// Chooses how to store a plane of c symbols with histogram freq; fills len
// (and the Huffman lengths when kind == kHuffman).
JAXCC_HD inline PlanePlan PlanPlane(const uint32_t* freq, uint64_t c, uint8_t* len) {
  PlanePlan p{kRawPlane, 0, 0, 1 + c};
  if (c == 0) return p;
  int lo = 256, hi = -1;
  for (int s = 0; s < 256; ++s) {
    if (freq[s]) {
      if (lo == 256) lo = s;
      hi = s;
    }
  }
  if (lo == hi) return {kConstant, static_cast<uint8_t>(lo), static_cast<uint8_t>(lo), 2};
  BuildCodeLengths(freq, len);
  uint64_t bits = 0;
  for (int s = lo; s <= hi; ++s) bits += uint64_t{freq[s]} * len[s];
  const uint32_t subs = NumSubStreams(c);
  // Each sub-stream pads to a byte: sum ceil(bits_j / 8) <= (bits + 7 subs) / 8.
  const uint64_t bound = 1 + TableBytes(lo, hi) + 2 * subs + (bits + 7 * subs) / 8;
  if (WorthCoding(bound, 1 + c)) {
    p = {kHuffman, static_cast<uint8_t>(lo), static_cast<uint8_t>(hi), bound};
  }
  return p;
}

// Sign+mantissa planes of dense blocks (no sparse candidate) are first judged
// on every kSampleStride-th symbol when there are at least kSampleMin: if a
// Huffman code of the sample would not save 1/32, the plane is raw and its
// full histogram is never taken.
constexpr uint32_t kSampleStride = 16;
constexpr uint64_t kSampleMin = 4096;

JAXCC_HD inline bool SampleWorthCoding(const uint32_t* sample_freq, uint64_t sample_count) {
  uint8_t len[256];
  int distinct = 0;
  for (int s = 0; s < 256; ++s) distinct += sample_freq[s] != 0;
  if (distinct < 2) return true;
  BuildCodeLengths(sample_freq, len);
  uint64_t bits = 0;
  for (int s = 0; s < 256; ++s) bits += uint64_t{sample_freq[s]} * len[s];
  return WorthCoding(bits, 8 * sample_count);
}

// Fills a decode table of kTableSize entries (symbol | length << 8) from
// lengths of symbols lo..hi. False unless the lengths form a complete code.
JAXCC_HD inline bool BuildDecodeTable(const uint8_t* len, uint32_t lo, uint32_t hi,
                                      uint16_t* table) {
  uint32_t kraft = 0;
  for (uint32_t s = lo; s <= hi; ++s) {
    if (len[s] > kMaxCodeLen) return false;
    if (len[s]) kraft += kTableSize >> len[s];
  }
  if (kraft != kTableSize) return false;
  uint16_t code[256];
  CanonicalCodes(len, code);
  for (uint32_t s = lo; s <= hi; ++s) {
    const uint32_t l = len[s];
    if (!l) continue;
    const uint16_t entry = static_cast<uint16_t>(s | l << 8);
    for (uint32_t k = code[s]; k < kTableSize; k += 1u << l) table[k] = entry;
  }
  return true;
}

}  // namespace codec
}  // namespace jaxcc

#endif  // JAXCC_CODEC_H_
