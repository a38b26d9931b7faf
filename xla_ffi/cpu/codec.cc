// The jaxcc codecs on the CPU: jaxcc_codec_{encode,decode}_{fixed,entropy}.
// The formats are in xla_ffi/include/jaxcc/codec.h.
//
// One thread per call; every loop works on one block at a time (256
// elements for "fixed", 65536 for "entropy") in L1/L2-resident scratch.
// Huffman sub-streams are coded and decoded four at a time, interleaved, so
// the four dependency chains overlap; decoding takes up to six symbols per
// table lookup from a 64-bit bit buffer refilled branch-free.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "codec_host.h"
#include "jaxcc/codec.h"
#include "jaxcc/codec_ffi.h"
#include "jaxcc/reduce.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jaxcc {
namespace codec {
namespace {

// On x86-64 glibc the hot loops are compiled twice, for x86-64-v3 (AVX2 and
// BMI2: wide byte shuffles, shift-by-register without the cl register for the
// bit buffers) and for the baseline, and the loader picks one; the module
// still runs on any x86-64. Both give the same bytes.
#if defined(__x86_64__) && defined(__GLIBC__) && defined(__has_attribute)
#if __has_attribute(target_clones) && __has_attribute(flatten)
#define JAXCC_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default"), flatten))
#endif
#endif
#ifndef JAXCC_CPU_CLONES
#define JAXCC_CPU_CLONES
#endif

template <DTypeId D>
using Bits = std::conditional_t<D == kF32, uint32_t, uint16_t>;

inline uint64_t LoadLE64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline void StoreLE64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }

// A decoding failure: what is wrong, for the error message.
struct Failure {
  std::string what;
};

// ---------------------------------------------------------------------------
// Checksum.
// ---------------------------------------------------------------------------

JAXCC_CPU_CLONES Checksum ComputeChecksum(const uint8_t* data, uint64_t nbytes) {
  const uint64_t words = nbytes / 4;
  uint32_t a = 0, b = 0;
  for (uint64_t i = 0; i < words; ++i) {
    uint32_t w;
    std::memcpy(&w, data + 4 * i, 4);
    a += w;
    b += (2u * static_cast<uint32_t>(i) + 1u) * w;
  }
  Checksum c{a, b};
  for (uint64_t i = words; i < CeilDiv(nbytes, 4); ++i) ChecksumAdd(&c, ChecksumWord(data, nbytes, i), i);
  // Take the checksum field back out.
  for (uint64_t i = kChecksumOffset / 4; i < kChecksumOffset / 4 + 2 && i < words; ++i) {
    const uint32_t w = Load32(data + 4 * i);
    c.a -= w;
    c.b -= (2u * static_cast<uint32_t>(i) + 1u) * w;
  }
  return c;
}

void FinishHeader(uint8_t* out, CodecId codec, DTypeId dtype, int block_log2, uint64_t n,
                  uint64_t nbytes) {
  Header h;
  h.codec = codec;
  h.dtype = dtype;
  h.block_log2 = static_cast<uint8_t>(block_log2);
  h.count = n;
  h.nbytes = nbytes;
  WriteHeader(out, h);
  const Checksum c = ComputeChecksum(out, nbytes);
  Store32(out + kChecksumOffset, c.a);
  Store32(out + kChecksumOffset + 4, c.b);
}

const char* DTypeName(DTypeId d) {
  switch (d) {
    case kBF16: return "bfloat16";
    case kF16: return "float16";
    case kF32: return "float32";
  }
  return "?";
}

// Checks the header, the size and the checksum of an encoding.
bool CheckEncoding(const uint8_t* data, uint64_t buffer_bytes, uint64_t nbytes_arg, CodecId codec,
                   DTypeId dtype, int block_log2, uint64_t n, Failure* f) {
  if (buffer_bytes < kHeaderBytes) {
    f->what = "truncated: the buffer holds " + std::to_string(buffer_bytes) +
              " bytes, less than the " + std::to_string(kHeaderBytes) + "-byte header";
    return false;
  }
  Header h;
  if (!ReadHeader(data, &h)) {
    f->what = "bad header: not a jaxcc encoding (wrong magic bytes)";
    return false;
  }
  if (h.codec != codec) {
    f->what = "bad header: codec id " + std::to_string(h.codec) + ", expected " +
              std::to_string(codec) + " (decoded with the wrong codec?)";
    return false;
  }
  if (h.dtype != dtype || h.block_log2 != block_log2) {
    f->what = "bad header: dtype id " + std::to_string(h.dtype) + " / block 2^" +
              std::to_string(h.block_log2) + ", expected " + DTypeName(dtype) + " / block 2^" +
              std::to_string(block_log2);
    return false;
  }
  if (h.count != n) {
    f->what = "bad header: " + std::to_string(h.count) + " elements, expected " + std::to_string(n);
    return false;
  }
  if (h.nbytes != nbytes_arg) {
    f->what = "size mismatch: the header says " + std::to_string(h.nbytes) +
              " bytes, nbytes says " + std::to_string(nbytes_arg);
    return false;
  }
  if (h.nbytes > buffer_bytes || h.nbytes < kHeaderBytes) {
    f->what = "truncated: the header says " + std::to_string(h.nbytes) +
              " bytes but the buffer holds " + std::to_string(buffer_bytes);
    return false;
  }
  const Checksum c = ComputeChecksum(data, h.nbytes);
  if (c.a != h.sum_a || c.b != h.sum_b) {
    f->what = "checksum mismatch: the data is corrupted";
    return false;
  }
  return true;
}

// ---------------------------------------------------------------------------
// "fixed".
// ---------------------------------------------------------------------------

template <DTypeId D>
JAXCC_CPU_CLONES uint64_t FixedEncode(const Bits<D>* x, uint64_t n, uint8_t* out) {
  constexpr DTypeInfo info = Info(D);
  const FixedLayout l = MakeFixedLayout(D, n);
  uint8_t* spill = out + l.spill;
  uint64_t used = 0;
  for (uint64_t blk = 0; blk < l.blocks; ++blk) {
    const uint64_t start = blk * kFixedBlock;
    const uint32_t m = static_cast<uint32_t>(std::min<uint64_t>(kFixedBlock, n - start));
    const Bits<D>* v = x + start;
    alignas(64) uint8_t e[kFixedBlock] = {};
    uint8_t mx = 0;
    for (uint32_t i = 0; i < m; ++i) {
      e[i] = Exponent<D>(v[i]);
      mx = std::max(mx, e[i]);
    }
    const uint32_t base = FixedBase(mx);
    uint32_t escapes = 0;
    alignas(64) uint8_t c[kFixedBlock] = {};
    for (uint32_t i = 0; i < m; ++i) {
      c[i] = static_cast<uint8_t>(FixedCode(e[i], base));
      escapes += FixedEscapes(e[i], base);
    }
    const uint32_t esc = FixedEscByte(D, escapes, m);
    uint8_t* codes = out + l.codes + start / 2;
    if (esc == kFixedRawExponents) {
      for (uint32_t i = 0; i < m; ++i) c[i] = e[i] & 15;
    }
    for (uint32_t i = 0; i < m / 2; ++i) codes[i] = c[2 * i] | c[2 * i + 1] << 4;
    if (m & 1) codes[m / 2] = c[m - 1];
    // Planes.
    if constexpr (D == kBF16) {
      uint8_t* p1 = out + l.planes + start;
      for (uint32_t i = 0; i < m; ++i) p1[i] = static_cast<uint8_t>(((v[i] >> 8) & 0x80u) | (v[i] & 0x7fu));
    } else if constexpr (D == kF32) {
      uint8_t* p1 = out + l.planes + start;
      uint8_t* p2 = p1 + n;
      uint8_t* p3 = p2 + n;
      for (uint32_t i = 0; i < m; ++i) {
        p1[i] = static_cast<uint8_t>(v[i]);
        p2[i] = static_cast<uint8_t>(v[i] >> 8);
        p3[i] = static_cast<uint8_t>(((v[i] >> 24) & 0x80u) | ((v[i] >> 16) & 0x7fu));
      }
    } else {
      uint8_t* p1 = out + l.planes + start;
      for (uint32_t i = 0; i < m; ++i) p1[i] = static_cast<uint8_t>(v[i]);
      uint8_t* p3 = out + l.packed3 + start / 8 * 3;
      for (uint32_t g = 0; g < CeilDiv(m, 8); ++g) {
        uint32_t word = 0;
        for (uint32_t k = 0; k < 8 && 8 * g + k < m; ++k) {
          const uint32_t b = v[8 * g + k];
          word |= (((b >> 13) & 4u) | ((b >> 8) & 3u)) << (3 * k);
        }
        const uint32_t bytes = std::min<uint32_t>(3, static_cast<uint32_t>(CeilDiv(3 * (m - 8 * g), 8)));
        for (uint32_t k = 0; k < bytes; ++k) p3[3 * g + k] = static_cast<uint8_t>(word >> (8 * k));
      }
    }
    // Spill.
    if (esc == kFixedRawExponents) {
      if constexpr (info.exp_bits == 8) {
        for (uint32_t i = 0; i < m / 2; ++i) spill[used + i] = (e[2 * i] >> 4) | (e[2 * i + 1] & 0xf0);
        if (m & 1) spill[used + m / 2] = e[m - 1] >> 4;
      } else {
        for (uint32_t g = 0; g < CeilDiv(m, 8); ++g) {
          uint8_t byte = 0;
          for (uint32_t k = 0; k < 8 && 8 * g + k < m; ++k) byte |= ((e[8 * g + k] >> 4) & 1) << k;
          spill[used + g] = byte;
        }
      }
    } else if (esc) {
      uint8_t* s = spill + used;
      for (uint32_t i = 0; i < m; ++i) {
        if (FixedEscapes(e[i], base)) {
          s[0] = static_cast<uint8_t>(i);
          s[1] = e[i];
          s += 2;
        }
      }
    }
    used += FixedBlockSpill(D, esc, m);
    out[l.table + 2 * blk] = static_cast<uint8_t>(base);
    out[l.table + 2 * blk + 1] = static_cast<uint8_t>(esc);
  }
  const uint64_t nbytes = std::max(l.static_bytes, l.spill + used);
  std::memset(out + l.spill + used, 0, nbytes - (l.spill + used));
  return nbytes;
}

template <DTypeId D>
JAXCC_CPU_CLONES bool FixedDecode(const uint8_t* in, uint64_t nbytes, uint64_t n, Bits<D>* y,
                                  Failure* f) {
  constexpr DTypeInfo info = Info(D);
  const FixedLayout l = MakeFixedLayout(D, n);
  if (nbytes < l.static_bytes) {
    f->what = "truncated: " + std::to_string(nbytes) + " bytes, less than the static size " +
              std::to_string(l.static_bytes);
    return false;
  }
  const uint8_t* spill = in + l.spill;
  uint64_t used = 0;
  for (uint64_t blk = 0; blk < l.blocks; ++blk) {
    const uint64_t start = blk * kFixedBlock;
    const uint32_t m = static_cast<uint32_t>(std::min<uint64_t>(kFixedBlock, n - start));
    const uint32_t base = in[l.table + 2 * blk];
    const uint32_t esc = in[l.table + 2 * blk + 1];
    const uint64_t need = FixedBlockSpill(D, esc, m);
    if (base >= (1u << info.exp_bits) || base < 15 ||
        (esc != kFixedRawExponents && 2 * esc > FixedRawSpill(D, m)) ||
        l.spill + used + need > nbytes) {
      f->what = "bad block header in block " + std::to_string(blk);
      return false;
    }
    const uint8_t* codes = in + l.codes + start / 2;
    alignas(64) uint8_t e[kFixedBlock];
    if (esc == kFixedRawExponents) {
      const uint8_t* s = spill + used;
      if constexpr (info.exp_bits == 8) {
        for (uint32_t i = 0; i < m; ++i) {
          const uint32_t sh = 4 * (i & 1);
          e[i] = static_cast<uint8_t>(((codes[i / 2] >> sh) & 15) | (((s[i / 2] >> sh) & 15) << 4));
        }
      } else {
        for (uint32_t i = 0; i < m; ++i) {
          e[i] = static_cast<uint8_t>(((codes[i / 2] >> (4 * (i & 1))) & 15) |
                                      (((s[i / 8] >> (i & 7)) & 1) << 4));
        }
      }
    } else {
      const uint8_t off = static_cast<uint8_t>(base - 15);  // FixedExponent, branch-free
      const uint32_t pairs = m == kFixedBlock ? kFixedBlock / 2 : (m + 1) / 2;
      for (uint32_t i = 0; i < pairs; ++i) {
        const uint8_t lo = codes[i] & 15, hi = codes[i] >> 4;
        e[2 * i] = lo ? static_cast<uint8_t>(lo + off) : 0;
        e[2 * i + 1] = hi ? static_cast<uint8_t>(hi + off) : 0;
      }
      const uint8_t* s = spill + used;
      int prev = -1;
      for (uint32_t k = 0; k < esc; ++k) {
        const uint32_t i = s[2 * k], ex = s[2 * k + 1];
        if (static_cast<int>(i) <= prev || i >= m || e[i] != 0 || !FixedEscapes(ex, base) ||
            ex >= (1u << info.exp_bits)) {
          f->what = "bad escape in block " + std::to_string(blk);
          return false;
        }
        e[i] = static_cast<uint8_t>(ex);
        prev = static_cast<int>(i);
      }
    }
    used += need;
    Bits<D>* out = y + start;
    if constexpr (D == kBF16) {
      const uint8_t* p1 = in + l.planes + start;
      for (uint32_t i = 0; i < m; ++i) out[i] = static_cast<uint16_t>(Join<D>(e[i], p1[i]));
    } else if constexpr (D == kF32) {
      const uint8_t* p1 = in + l.planes + start;
      const uint8_t* p2 = p1 + n;
      const uint8_t* p3 = p2 + n;
      for (uint32_t i = 0; i < m; ++i) out[i] = Join<D>(e[i], p1[i], p2[i], p3[i]);
    } else {
      const uint8_t* p1 = in + l.planes + start;
      const uint8_t* p3 = in + l.packed3 + start / 8 * 3;
      for (uint32_t i = 0; i < m; ++i) {
        const uint32_t g = i / 8, k = i % 8;
        const uint32_t at = 3 * g + (3 * k) / 8, sh = (3 * k) % 8;
        uint32_t two = p3[at];
        if (sh > 5) two |= uint32_t{p3[at + 1]} << 8;
        out[i] = static_cast<uint16_t>(Join<D>(e[i], p1[i], (two >> sh) & 7));
      }
    }
  }
  const uint64_t expected = std::max(l.static_bytes, l.spill + used);
  if (nbytes != expected) {
    f->what = "size mismatch: " + std::to_string(nbytes) + " bytes, the blocks need " +
              std::to_string(expected);
    return false;
  }
  return true;
}

// ---------------------------------------------------------------------------
// "entropy": Huffman sub-streams.
// ---------------------------------------------------------------------------

// Worst case of one sub-stream, plus room for 8-byte stores past its end.
constexpr size_t kSubStreamBytes = (kSubStream * kMaxCodeLen + 7) / 8 + 16;

struct BitWriter {
  uint8_t* p;
  uint64_t buf = 0;
  uint32_t nb = 0;
  void Put(uint32_t code, uint32_t len) {
    buf |= uint64_t{code} << nb;
    nb += len;
  }
  void Flush() {  // nb <= 7 + 4 * 11 before; < 8 after
    StoreLE64(p, buf);
    const uint32_t k = nb >> 3;
    p += k;
    buf >>= 8 * k;
    nb &= 7;
  }
  uint8_t* Finish() {
    Flush();
    if (nb) *p++ = static_cast<uint8_t>(buf);
    return p;
  }
};

// Encodes symbols into up to four sub-streams at once, each flushed every
// four symbols; writes the u16 sizes and returns the end of the data.
JAXCC_CPU_CLONES uint8_t* EncodeSubStreams(const uint8_t* sym, uint64_t c, const uint16_t* code,
                                           const uint8_t* len, uint8_t* out, uint8_t* sizes_out) {
  const uint32_t subs = NumSubStreams(c);
  alignas(64) uint8_t tmp[4][kSubStreamBytes];
  uint8_t* o = out;
  for (uint32_t s0 = 0; s0 < subs; s0 += 4) {
    const uint32_t k = std::min<uint32_t>(4, subs - s0);
    BitWriter w[4] = {{tmp[0]}, {tmp[1]}, {tmp[2]}, {tmp[3]}};
    const uint64_t first = uint64_t{s0} * kSubStream;
    if (k == 4 && first + 4 * kSubStream <= c) {
      const uint8_t* q[4];
      for (int j = 0; j < 4; ++j) q[j] = sym + first + j * kSubStream;
      for (size_t i = 0; i < kSubStream; i += 4) {
        for (int t = 0; t < 4; ++t) {
          for (int j = 0; j < 4; ++j) w[j].Put(code[q[j][i + t]], len[q[j][i + t]]);
        }
        for (int j = 0; j < 4; ++j) w[j].Flush();
      }
    } else {
      for (uint32_t j = 0; j < k; ++j) {
        const uint64_t lo = first + uint64_t{j} * kSubStream;
        const uint64_t hi = std::min<uint64_t>(c, lo + kSubStream);
        uint64_t i = lo;
        for (; i + 4 <= hi; i += 4) {
          for (int t = 0; t < 4; ++t) w[j].Put(code[sym[i + t]], len[sym[i + t]]);
          w[j].Flush();
        }
        for (; i < hi; ++i) w[j].Put(code[sym[i]], len[sym[i]]);
      }
    }
    for (uint32_t j = 0; j < k; ++j) {
      const size_t bytes = w[j].Finish() - tmp[j];
      std::memcpy(o, tmp[j], bytes);
      o += bytes;
      sizes_out[2 * (s0 + j)] = static_cast<uint8_t>(bytes);
      sizes_out[2 * (s0 + j) + 1] = static_cast<uint8_t>(bytes >> 8);
    }
  }
  return o;
}

// Writes one plane; returns the end.
uint8_t* WritePlane(uint8_t* o, const uint8_t* sym, uint64_t c, const PlanePlan& plan,
                    const uint8_t* len) {
  *o++ = plan.kind;
  if (plan.kind == kRawPlane) {
    std::memcpy(o, sym, c);
    return o + c;
  }
  if (plan.kind == kConstant) {
    *o++ = plan.lo;
    return o;
  }
  *o++ = plan.lo;
  *o++ = plan.hi;
  for (uint32_t s = plan.lo; s <= plan.hi; s += 2) {
    *o++ = static_cast<uint8_t>(len[s] | (s + 1 <= plan.hi ? len[s + 1] << 4 : 0));
  }
  uint16_t code[256];
  CanonicalCodes(len, code);
  uint8_t* sizes = o;
  o += 2 * NumSubStreams(c);
  return EncodeSubStreams(sym, c, code, len, o, sizes);
}

// Decoding tables: the single-symbol table of codec.h, and a multi-symbol
// one whose entry holds the up to kMultiSymbols symbols that an 11-bit window
// starts with: symbol k in bits [8k, 8k + 8), bits used << 48, count << 56.
constexpr uint32_t kMultiSymbols = 6;

struct DecodeTables {
  alignas(64) uint16_t single[kTableSize];
  alignas(64) uint64_t multi[kTableSize];
};

void BuildMultiTable(DecodeTables* t) {
  for (uint32_t v = 0; v < kTableSize; ++v) {
    const uint32_t e = t->single[v];
    uint64_t syms = e & 0xff;
    uint32_t used = e >> 8, count = 1;
    for (; count < kMultiSymbols; ++count) {
      const uint32_t f = t->single[v >> used];  // the window's high bits are zero-filled
      if (used + (f >> 8) > kMaxCodeLen) break;
      syms |= uint64_t{f & 0xff} << (8 * count);
      used += f >> 8;
    }
    t->multi[v] = syms | uint64_t{used} << 48 | uint64_t{count} << 56;
  }
}

// One sub-stream being decoded: a 64-bit LSB-first bit buffer over the input,
// and the output range it fills.
struct Stream {
  const uint8_t* p;
  uint64_t buf;
  uint32_t nb;
  uint8_t* out;
  uint8_t* end;

  // Tops the buffer up to >= 56 bits: five lookups of <= 11 bits. Reads 8
  // bytes at a time while they lie before `limit`, zeros past it.
  inline void Refill(const uint8_t* limit) {
    if (p + 8 <= limit) {
      buf |= LoadLE64(p) << nb;
      p += (63 - nb) >> 3;
      nb |= 56;
    } else {
      while (nb <= 56) {
        buf |= uint64_t{p < limit ? *p : uint8_t{0}} << nb;
        ++p;
        nb += 8;
      }
    }
  }
  // Up to kMultiSymbols symbols; needs end - out >= 8 (it stores 8 bytes).
  inline void Multi(const uint64_t* multi) {
    const uint64_t e = multi[buf & (kTableSize - 1)];
    std::memcpy(out, &e, 8);
    out += e >> 56;
    const uint32_t bits = (e >> 48) & 15;
    buf >>= bits;
    nb -= bits;
  }
  inline void Single(const uint16_t* single) {
    const uint32_t e = single[buf & (kTableSize - 1)];
    *out++ = static_cast<uint8_t>(e);
    buf >>= e >> 8;
    nb -= e >> 8;
  }
  // Decodes whatever is left of this stream on its own.
  inline void Finish(const DecodeTables& t, const uint8_t* limit) {
    while (end - out >= 8) {
      if (nb < kMaxCodeLen) Refill(limit);
      Multi(t.multi);
    }
    while (out < end) {
      if (nb < kMaxCodeLen) Refill(limit);
      Single(t.single);
    }
  }
};

// Decodes the sub-streams of a Huffman plane of c symbols, four at a time.
JAXCC_CPU_CLONES bool DecodeSubStreams(const uint8_t* data, const uint8_t* sizes,
                                       const uint8_t* limit, const DecodeTables& t, uint64_t c,
                                       uint8_t* out) {
  const uint32_t subs = NumSubStreams(c);
  const uint8_t* p = data;
  for (uint32_t s0 = 0; s0 < subs; s0 += 4) {
    const uint32_t k = std::min<uint32_t>(4, subs - s0);
    Stream r[4];
    const uint8_t* start[4];
    uint64_t size[4];
    for (uint32_t j = 0; j < 4; ++j) {
      const uint32_t sub = s0 + std::min(j, k - 1);  // missing streams repeat the last one
      const uint64_t lo = uint64_t{sub} * kSubStream;
      size[j] = sizes[2 * sub] | uint64_t{sizes[2 * sub + 1]} << 8;
      start[j] = j < k ? p : start[k - 1];
      if (j < k) {
        if (size[j] > uint64_t(limit - p)) return false;
        p += size[j];
      }
      r[j] = {start[j], 0, 0, out + lo, out + std::min<uint64_t>(c, lo + kSubStream)};
    }
    if (k == 4) {
      auto room = [&] {
        return std::min(std::min(r[0].end - r[0].out, r[1].end - r[1].out),
                        std::min(r[2].end - r[2].out, r[3].end - r[3].out));
      };
      while (room() >= 4 * kMultiSymbols + 8) {  // five lookups, each storing 8 bytes
        for (int j = 0; j < 4; ++j) r[j].Refill(limit);
        for (int i = 0; i < 5; ++i) {
          for (int j = 0; j < 4; ++j) r[j].Multi(t.multi);
        }
      }
    }
    for (uint32_t j = 0; j < k; ++j) {
      r[j].Finish(t, limit);
      const uint64_t consumed = 8 * uint64_t(r[j].p - start[j]) - r[j].nb;
      if (CeilDiv(consumed, 8) != size[j]) return false;
    }
  }
  return true;
}

// Reads one plane of c symbols. *sym points at them afterwards: into the
// input for a raw plane, else into `scratch` (c bytes). Returns the end
// of the plane, or nullptr if it is malformed.
const uint8_t* ReadPlane(const uint8_t* p, const uint8_t* end, const uint8_t* limit, uint64_t c,
                         uint8_t* scratch, const uint8_t** sym, DecodeTables* t) {
  if (p >= end) return nullptr;
  const uint8_t kind = *p++;
  if (kind == kRawPlane) {
    if (c > uint64_t(end - p)) return nullptr;
    *sym = p;
    return p + c;
  }
  *sym = scratch;
  if (kind == kConstant) {
    if (p >= end || c == 0) return nullptr;
    std::memset(scratch, *p, c);
    return p + 1;
  }
  if (kind != kHuffman || end - p < 2 || c == 0) return nullptr;
  const uint32_t lo = p[0], hi = p[1];
  p += 2;
  if (lo >= hi || TableBytes(lo, hi) - 2 > uint64_t(end - p)) return nullptr;
  uint8_t len[256] = {};
  for (uint32_t s = lo; s <= hi; ++s) {
    len[s] = (p[(s - lo) / 2] >> (4 * ((s - lo) & 1))) & 15;
  }
  if ((hi - lo) % 2 == 0 && (p[(hi - lo) / 2] >> 4)) return nullptr;  // nonzero pad nibble
  p += TableBytes(lo, hi) - 2;
  if (!BuildDecodeTable(len, lo, hi, t->single)) return nullptr;
  BuildMultiTable(t);
  const uint32_t subs = NumSubStreams(c);
  if (2 * uint64_t{subs} > uint64_t(end - p)) return nullptr;
  const uint8_t* sizes = p;
  p += 2 * subs;
  uint64_t total = 0;
  for (uint32_t j = 0; j < subs; ++j) total += sizes[2 * j] | uint64_t{sizes[2 * j + 1]} << 8;
  if (total > uint64_t(end - p)) return nullptr;
  if (!DecodeSubStreams(p, sizes, limit, *t, c, scratch)) return nullptr;
  return p + total;
}

// Per-block scratch of the entropy coder, one per thread, kept between calls.
struct EntropyScratch {
  std::vector<uint8_t> planes[kMaxPlanes];
  std::vector<uint8_t> nz[kMaxPlanes];
  std::vector<uint8_t> bitmap;
  std::vector<uint32_t> joined;
  DecodeTables tables;
  EntropyScratch() {
    for (int p = 0; p < kMaxPlanes; ++p) {
      planes[p].resize(kEntropyBlock);
      nz[p].resize(kEntropyBlock);
    }
    bitmap.resize(kEntropyBlock / 8);
    joined.resize(kEntropyBlock);
  }
};

EntropyScratch& Scratch() {
  thread_local auto scratch = std::make_unique<EntropyScratch>();
  return *scratch;
}

// Splits m elements into byte planes; returns the number of +0.0 elements.
template <DTypeId D>
JAXCC_CPU_CLONES uint32_t SplitBlock(const Bits<D>* __restrict v, uint32_t m,
                                     uint8_t* const* planes) {
  uint32_t z = 0;
  uint8_t* __restrict p0 = planes[0];
  uint8_t* __restrict p1 = planes[1];
  if constexpr (D == kBF16) {
    for (uint32_t i = 0; i < m; ++i) {
      const uint16_t x = v[i];
      p0[i] = static_cast<uint8_t>(x >> 7);
      p1[i] = static_cast<uint8_t>(((x >> 8) & 0x80u) | (x & 0x7fu));
      z += x == 0;
    }
  } else if constexpr (D == kF16) {
    uint8_t* __restrict p2 = planes[2];
    for (uint32_t i = 0; i < m; ++i) {
      const uint16_t x = v[i];
      p0[i] = static_cast<uint8_t>((x >> 10) & 0x1fu);
      p1[i] = static_cast<uint8_t>(x);
      p2[i] = static_cast<uint8_t>(((x >> 13) & 4u) | ((x >> 8) & 3u));
      z += x == 0;
    }
  } else {
    uint8_t* __restrict p2 = planes[2];
    uint8_t* __restrict p3 = planes[3];
    for (uint32_t i = 0; i < m; ++i) {
      const uint32_t x = v[i];
      p0[i] = static_cast<uint8_t>(x >> 23);
      p1[i] = static_cast<uint8_t>(x);
      p2[i] = static_cast<uint8_t>(x >> 8);
      p3[i] = static_cast<uint8_t>(((x >> 24) & 0x80u) | ((x >> 16) & 0x7fu));
      z += x == 0;
    }
  }
  return z;
}

// Histogram of m bytes, eight partial counts to break store-to-load chains.
void Histogram(const uint8_t* s, uint32_t m, uint32_t* hist) {
  uint32_t h[8][256] = {};
  uint32_t i = 0;
  for (; i + 8 <= m; i += 8) {
    uint64_t w;
    std::memcpy(&w, s + i, 8);
    for (int k = 0; k < 8; ++k) h[k][(w >> (8 * k)) & 0xff]++;
  }
  for (; i < m; ++i) h[0][s[i]]++;
  for (int k = 0; k < 256; ++k) {
    hist[k] = h[0][k] + h[1][k] + h[2][k] + h[3][k] + h[4][k] + h[5][k] + h[6][k] + h[7][k];
  }
}

template <DTypeId D>
uint64_t EntropyEncode(const Bits<D>* x, uint64_t n, uint8_t* out) {
  constexpr int kPlanes = D == kF32 ? 4 : D == kF16 ? 3 : 2;
  constexpr uint32_t kElemBytes = sizeof(Bits<D>);
  const uint64_t blocks = CeilDiv(n, kEntropyBlock);
  EntropyScratch& sc = Scratch();
  uint8_t* planes[kMaxPlanes];
  for (int p = 0; p < kMaxPlanes; ++p) planes[p] = sc.planes[p].data();
  uint8_t* o = out + kHeaderBytes + 4 * blocks;
  for (uint64_t blk = 0; blk < blocks; ++blk) {
    const uint64_t start = blk * kEntropyBlock;
    const uint32_t m = static_cast<uint32_t>(std::min<uint64_t>(kEntropyBlock, n - start));
    const Bits<D>* v = x + start;
    uint32_t hist[kPlanes][256];
    const uint32_t zeros = SplitBlock<D>(v, m, planes);
    const bool sparse_candidate = uint64_t{zeros} * 8 >= m;
    uint8_t len[kPlanes][256];
    PlanePlan dense[kPlanes];
    uint64_t dense_bytes = 1;
    for (int p = 0; p < kPlanes; ++p) {
      if (p > 0 && !sparse_candidate && m >= kSampleMin) {
        uint32_t sample[256] = {};
        for (uint32_t i = 0; i < m; i += kSampleStride) sample[planes[p][i]]++;
        if (!SampleWorthCoding(sample, CeilDiv(m, kSampleStride))) {
          dense[p] = {kRawPlane, 0, 0, 1 + uint64_t{m}};
          dense_bytes += dense[p].bound;
          continue;
        }
      }
      Histogram(planes[p], m, hist[p]);
      dense[p] = PlanPlane(hist[p], m, len[p]);
      dense_bytes += dense[p].bound;
    }
    uint64_t best = 1 + uint64_t{m} * kElemBytes;
    BlockKind kind = kRawBlock;
    if (dense_bytes < best) {
      best = dense_bytes;
      kind = kDense;
    }
    // Sparse: the zeros leave every plane's symbol-0 count.
    uint8_t nz_len[kPlanes][256], bm_len[256];
    PlanePlan nz_plan[kPlanes], bm_plan{};
    const uint32_t nnz = m - zeros;
    const uint32_t bm_bytes = static_cast<uint32_t>(CeilDiv(m, 8));
    if (sparse_candidate) {
      uint8_t* bm = sc.bitmap.data();
      uint32_t bm_hist[256] = {};
      for (uint32_t g = 0; g < bm_bytes; ++g) {
        uint8_t byte = 0;
        for (uint32_t k = 0; k < 8 && 8 * g + k < m; ++k) byte |= uint8_t(v[8 * g + k] != 0) << k;
        bm[g] = byte;
        bm_hist[byte]++;
      }
      bm_plan = PlanPlane(bm_hist, bm_bytes, bm_len);
      uint64_t sparse_bytes = 1 + 4 + bm_plan.bound;
      for (int p = 0; p < kPlanes; ++p) {
        uint32_t h[256];
        std::memcpy(h, hist[p], sizeof(h));
        h[0] -= zeros;
        nz_plan[p] = PlanPlane(h, nnz, nz_len[p]);
        sparse_bytes += nz_plan[p].bound;
      }
      if (sparse_bytes < best) {
        best = sparse_bytes;
        kind = kSparse;
      }
    }
    uint8_t* block_start = o;
    *o++ = kind;
    if (kind == kRawBlock) {
      std::memcpy(o, v, uint64_t{m} * kElemBytes);
      o += uint64_t{m} * kElemBytes;
    } else if (kind == kDense) {
      for (int p = 0; p < kPlanes; ++p) o = WritePlane(o, planes[p], m, dense[p], len[p]);
    } else {
      Store32(o, nnz);
      o += 4;
      o = WritePlane(o, sc.bitmap.data(), bm_bytes, bm_plan, bm_len);
      for (int p = 0; p < kPlanes; ++p) {
        uint8_t* dst = sc.nz[p].data();
        const uint8_t* src = planes[p];
        uint32_t j = 0;
        for (uint32_t i = 0; i < m; ++i) {
          dst[j] = src[i];
          j += v[i] != 0;
        }
        o = WritePlane(o, dst, nnz, nz_plan[p], nz_len[p]);
      }
    }
    Store32(out + kHeaderBytes + 4 * blk, static_cast<uint32_t>(o - block_start));
  }
  return static_cast<uint64_t>(o - out);
}

template <DTypeId D>
JAXCC_CPU_CLONES void JoinBlock(const uint8_t* const* planes, uint32_t m,
                                Bits<D>* __restrict out) {
  const uint8_t* __restrict p0 = planes[0];
  const uint8_t* __restrict p1 = planes[1];
  if constexpr (D == kBF16) {
    for (uint32_t i = 0; i < m; ++i) out[i] = static_cast<uint16_t>(Join<D>(p0[i], p1[i]));
  } else if constexpr (D == kF16) {
    const uint8_t* __restrict p2 = planes[2];
    for (uint32_t i = 0; i < m; ++i) {
      out[i] = static_cast<uint16_t>(Join<D>(p0[i] & 31u, p1[i], p2[i] & 7u));
    }
  } else {
    const uint8_t* __restrict p2 = planes[2];
    const uint8_t* __restrict p3 = planes[3];
    for (uint32_t i = 0; i < m; ++i) out[i] = Join<D>(p0[i], p1[i], p2[i], p3[i]);
  }
}

template <DTypeId D>
bool EntropyDecode(const uint8_t* in, uint64_t nbytes, uint64_t n, Bits<D>* y, Failure* f) {
  constexpr int kPlanes = D == kF32 ? 4 : D == kF16 ? 3 : 2;
  constexpr uint32_t kElemBytes = sizeof(Bits<D>);
  const uint64_t blocks = CeilDiv(n, kEntropyBlock);
  if (kHeaderBytes + 4 * blocks > nbytes) {
    f->what = "truncated: the block table does not fit";
    return false;
  }
  const uint8_t* limit = in + nbytes;
  const uint8_t* p = in + kHeaderBytes + 4 * blocks;
  EntropyScratch& sc = Scratch();
  Bits<D>* joined = reinterpret_cast<Bits<D>*>(sc.joined.data());
  DecodeTables* tables = &sc.tables;
  const uint8_t* sym[kMaxPlanes];
  for (uint64_t blk = 0; blk < blocks; ++blk) {
    const uint64_t start = blk * kEntropyBlock;
    const uint32_t m = static_cast<uint32_t>(std::min<uint64_t>(kEntropyBlock, n - start));
    const uint64_t size = Load32(in + kHeaderBytes + 4 * blk);
    auto where = [blk] { return " in block " + std::to_string(blk); };
    if (size == 0 || size > uint64_t(limit - p)) {
      f->what = "truncated: block " + std::to_string(blk) + " runs past the end";
      return false;
    }
    const uint8_t* end = p + size;
    const uint8_t kind = *p++;
    Bits<D>* out = y + start;
    if (kind == kRawBlock) {
      if (uint64_t(end - p) != uint64_t{m} * kElemBytes) {
        f->what = "bad raw block size" + where();
        return false;
      }
      std::memcpy(out, p, uint64_t{m} * kElemBytes);
      p = end;
      continue;
    }
    if (kind == kDense) {
      for (int k = 0; k < kPlanes && p; ++k) {
        p = ReadPlane(p, end, limit, m, sc.planes[k].data(), &sym[k], tables);
      }
      if (p != end) {
        f->what = "corrupted plane" + where();
        return false;
      }
      JoinBlock<D>(sym, m, out);
      continue;
    }
    if (kind != kSparse || end - p < 4) {
      f->what = "bad block kind" + where();
      return false;
    }
    const uint32_t nnz = Load32(p);
    p += 4;
    const uint32_t bm_bytes = static_cast<uint32_t>(CeilDiv(m, 8));
    const uint8_t* bm = nullptr;
    if (nnz > m) p = nullptr;
    if (p) p = ReadPlane(p, end, limit, bm_bytes, sc.bitmap.data(), &bm, tables);
    for (int k = 0; k < kPlanes && p; ++k) {
      p = ReadPlane(p, end, limit, nnz, sc.nz[k].data(), &sym[k], tables);
    }
    if (p != end) {
      f->what = "corrupted plane" + where();
      return false;
    }
    uint64_t ones = 0;
    for (uint32_t g = 0; g < bm_bytes; ++g) ones += __builtin_popcount(bm[g]);
    if (ones != nnz || (m % 8 && (bm[bm_bytes - 1] >> (m % 8)))) {
      f->what = "bad zero bitmap" + where();
      return false;
    }
    JoinBlock<D>(sym, nnz, joined);
    uint32_t j = 0;
    for (uint32_t i = 0; i < m; ++i) {
      const uint32_t bit = (bm[i >> 3] >> (i & 7)) & 1u;
      out[i] = bit ? joined[j] : Bits<D>{0};
      j += bit;
    }
  }
  if (p != limit) {
    f->what = "size mismatch: the blocks end before nbytes";
    return false;
  }
  return true;
}

// ---------------------------------------------------------------------------
// Handlers.
// ---------------------------------------------------------------------------

template <CodecId C>
ffi::Error EncodeImpl(ffi::AnyBuffer x, ffi::Result<ffi::Buffer<ffi::U8>> payload,
                      ffi::Result<ffi::BufferR0<ffi::S32>> nbytes) {
  DTypeId d;
  ffi::Error err = CheckEncodeArgs(C, x, payload->element_count(), &d);
  if (!err.success()) return err;
  const uint64_t size =
      EncodeOnHost(C, d, x.untyped_data(), x.element_count(), payload->typed_data());
  *nbytes->typed_data() = static_cast<int32_t>(size);
  return ffi::Error::Success();
}

template <CodecId C>
ffi::Error DecodeImpl(ffi::Buffer<ffi::U8> payload, ffi::BufferR0<ffi::S32> nbytes,
                      ffi::Result<ffi::AnyBuffer> y) {
  const std::string name = Name(C, false);
  DTypeId d;
  ffi::Error err = CheckDType(name, y->element_type(), &d);
  if (!err.success()) return err;
  const int32_t claimed = *nbytes.typed_data();
  const std::string failure =
      claimed < 0 ? "size mismatch: nbytes is negative"
                  : DecodeOnHost(C, d, payload.typed_data(), payload.element_count(),
                                 static_cast<uint64_t>(claimed), y->element_count(),
                                 y->untyped_data());
  if (failure.empty()) return ffi::Error::Success();
  return ffi::Error::InvalidArgument(name + ": cannot decode: " + failure);
}

}  // namespace

uint64_t EncodeOnHost(CodecId c, DTypeId d, const void* x, uint64_t n, uint8_t* out) {
  uint64_t size = 0;
  if (c == kFixed) {
    switch (d) {
      case kBF16: size = FixedEncode<kBF16>(static_cast<const uint16_t*>(x), n, out); break;
      case kF16: size = FixedEncode<kF16>(static_cast<const uint16_t*>(x), n, out); break;
      case kF32: size = FixedEncode<kF32>(static_cast<const uint32_t*>(x), n, out); break;
    }
  } else {
    switch (d) {
      case kBF16: size = EntropyEncode<kBF16>(static_cast<const uint16_t*>(x), n, out); break;
      case kF16: size = EntropyEncode<kF16>(static_cast<const uint16_t*>(x), n, out); break;
      case kF32: size = EntropyEncode<kF32>(static_cast<const uint32_t*>(x), n, out); break;
    }
  }
  FinishHeader(out, c, d, c == kFixed ? kFixedBlockLog2 : kEntropyBlockLog2, n, size);
  return size;
}

std::string DecodeOnHost(CodecId c, DTypeId d, const uint8_t* in, uint64_t buffer_bytes,
                         uint64_t nbytes, uint64_t n, void* y) {
  Failure f;
  if (!CheckEncoding(in, buffer_bytes, nbytes, c, d,
                     c == kFixed ? kFixedBlockLog2 : kEntropyBlockLog2, n, &f)) {
    return f.what;
  }
  bool ok = false;
  if (c == kFixed) {
    switch (d) {
      case kBF16: ok = FixedDecode<kBF16>(in, nbytes, n, static_cast<uint16_t*>(y), &f); break;
      case kF16: ok = FixedDecode<kF16>(in, nbytes, n, static_cast<uint16_t*>(y), &f); break;
      case kF32: ok = FixedDecode<kF32>(in, nbytes, n, static_cast<uint32_t*>(y), &f); break;
    }
  } else {
    switch (d) {
      case kBF16: ok = EntropyDecode<kBF16>(in, nbytes, n, static_cast<uint16_t*>(y), &f); break;
      case kF16: ok = EntropyDecode<kF16>(in, nbytes, n, static_cast<uint16_t*>(y), &f); break;
      case kF32: ok = EntropyDecode<kF32>(in, nbytes, n, static_cast<uint32_t*>(y), &f); break;
    }
  }
  return ok ? "" : f.what;
}

}  // namespace codec
}  // namespace jaxcc

#define JAXCC_CODEC_HANDLERS(Name, Codec)                                                       \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxccCodecEncode##Name, jaxcc::codec::EncodeImpl<Codec>,        \
                                ffi::Ffi::Bind()                                                \
                                    .Arg<ffi::AnyBuffer>()                /* x */              \
                                    .Ret<ffi::Buffer<ffi::U8>>()          /* payload */        \
                                    .Ret<ffi::BufferR0<ffi::S32>>());     /* nbytes */         \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxccCodecDecode##Name, jaxcc::codec::DecodeImpl<Codec>,        \
                                ffi::Ffi::Bind()                                                \
                                    .Arg<ffi::Buffer<ffi::U8>>()          /* payload */        \
                                    .Arg<ffi::BufferR0<ffi::S32>>()       /* nbytes */         \
                                    .Ret<ffi::AnyBuffer>())               /* y */

JAXCC_CODEC_HANDLERS(Fixed, jaxcc::codec::kFixed);
JAXCC_CODEC_HANDLERS(Entropy, jaxcc::codec::kEntropy);
