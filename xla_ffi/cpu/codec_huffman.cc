// Planes of byte symbols (codec_huffman.h). Huffman sub-streams are coded two
// and decoded four at a time, interleaved, so their dependency chains
// overlap; decoding takes up to six symbols per table lookup from a 64-bit
// bit buffer refilled branch-free.
#include "codec_huffman.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>

#include "codec_cpu.h"
#include "jaxcc/codec.h"

namespace jaxcc {
namespace codec {
namespace {

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

// Codes four whole sub-streams into tmp, two at a time (four writers would
// not fit in the registers), and leaves their writers in w. A unit is one
// symbol (kUnitSymbols = 1) or a pair of them (2); a stream is flushed every
// four symbols. Per unit: a load, a shift and an or for the code and an add
// from memory for the length.
template <uint32_t kUnitSymbols, typename Unit>
__attribute__((always_inline)) inline void CodeFourSubStreams(
    const Unit* units, const uint64_t* code, const uint32_t* len,
    uint8_t (*tmp)[kSubStreamBytes], BitWriter* w) {
  constexpr uint32_t kPerStream = kSubStream / kUnitSymbols, kPerFlush = 4 / kUnitSymbols;
  auto put = [code, len](const Unit* u, uint64_t& b, uint32_t& nb) {
    for (uint32_t t = 0; t < kPerFlush; ++t) {
      b |= code[u[t]] << nb;
      nb += len[u[t]];
    }
  };
  auto flush = [](uint8_t*& o, uint64_t& b, uint32_t& nb) {
    StoreLE64(o, b);
    o += nb >> 3;
    b >>= nb & ~7u;
    nb &= 7;
  };
  for (uint32_t j = 0; j < 4; j += 2) {
    const Unit* q = units + j * kPerStream;
    uint8_t* p0 = tmp[j];
    uint8_t* p1 = tmp[j + 1];
    uint64_t b0 = 0, b1 = 0;
    uint32_t n0 = 0, n1 = 0;
    for (uint32_t i = 0; i < kPerStream; i += kPerFlush) {
      put(q + i, b0, n0);
      put(q + kPerStream + i, b1, n1);
      flush(p0, b0, n0);
      flush(p1, b1, n1);
    }
    w[j] = {p0, b0, n0};
    w[j + 1] = {p1, b1, n1};
  }
}

// Encodes symbols into sub-streams, each flushed every four symbols; writes
// the u16 sizes and returns the end of the data. When the symbols span fewer
// than 32 values (exponent planes), whole groups of four sub-streams are
// coded a pair of symbols per lookup, the pair indexed by both mod 32.
JAXCC_CPU_CLONES uint8_t* EncodeSubStreams(const uint8_t* sym, uint64_t c, const uint16_t* code,
                                           const uint8_t* len, uint8_t* out, uint8_t* sizes_out) {
  const uint32_t subs = NumSubStreams(c);
  alignas(64) uint8_t tmp[4][kSubStreamBytes];
  uint64_t cw[256];
  uint32_t lw[256];
  uint32_t lo = 255, hi = 0;
  for (uint32_t s = 0; s < 256; ++s) {
    cw[s] = code[s];
    lw[s] = len[s];
    if (len[s]) {
      lo = std::min(lo, s);
      hi = s;
    }
  }
  const bool pairs = hi - lo < 32;
  uint64_t pair_code[1024];
  uint32_t pair_len[1024];
  for (uint32_t a = lo; pairs && a <= hi; ++a) {
    for (uint32_t b = lo; b <= hi; ++b) {
      const uint32_t ix = (a & 31) | (b & 31) << 5;
      pair_code[ix] = cw[a] | cw[b] << len[a];
      pair_len[ix] = lw[a] + lw[b];
    }
  }
  uint8_t* o = out;
  for (uint32_t s0 = 0; s0 < subs; s0 += 4) {
    const uint32_t k = std::min<uint32_t>(4, subs - s0);
    BitWriter w[4] = {{tmp[0]}, {tmp[1]}, {tmp[2]}, {tmp[3]}};
    const uint64_t first = uint64_t{s0} * kSubStream;
    if (k == 4 && first + 4 * kSubStream <= c && pairs) {
      uint16_t ix[2 * kSubStream];
      const uint8_t* q = sym + first;
      for (uint32_t i = 0; i < 2 * kSubStream; ++i) {
        ix[i] = static_cast<uint16_t>((q[2 * i] & 31) | (q[2 * i + 1] & 31) << 5);
      }
      CodeFourSubStreams<2>(ix, pair_code, pair_len, tmp, w);
    } else if (k == 4 && first + 4 * kSubStream <= c) {
      CodeFourSubStreams<1>(sym + first, cw, lw, tmp, w);
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

// Builds the tables from the lengths of symbols lo..hi; false unless they
// form a complete code of lengths <= kMaxCodeLen. A level-k entry whose
// window starts with symbol s (code c of length l) is s followed by the
// level k - l entry of the rest: each level is, per symbol, a strided copy
// of a lower one. The windows of a level that start with no whole code are
// the k-bit prefixes of the longer codes (the code is prefix-free): those
// are zeroed one by one.
JAXCC_CPU_CLONES bool BuildTables(const uint8_t* len, uint32_t lo, uint32_t hi,
                                  DecodeTables* t) {
  uint32_t kraft = 0, minlen = kMaxCodeLen;
  uint32_t nsym = 0;
  uint8_t syms[256];
  for (uint32_t s = lo; s <= hi; ++s) {
    if (len[s] > kMaxCodeLen) return false;
    if (len[s]) {
      kraft += kTableSize >> len[s];
      minlen = std::min<uint32_t>(minlen, len[s]);
      syms[nsym++] = static_cast<uint8_t>(s);
    }
  }
  if (kraft != kTableSize) return false;
  std::memcpy(t->len, len, 256);
  uint16_t code[256];
  CanonicalCodes(len, code);
  uint64_t* m = t->multi;
  m[1] = 0;
  for (uint32_t k = 1; k <= kMaxCodeLen; ++k) {
    uint64_t* dst = m + (1u << k);
    for (uint32_t j = 0; j < nsym; ++j) {
      const uint32_t s = syms[j], l = len[s];
      if (l > k) dst[code[s] & ((1u << k) - 1)] = 0;
    }
    for (uint32_t j = 0; j < nsym; ++j) {
      const uint32_t s = syms[j], l = len[s];
      if (l > k) continue;
      const uint32_t c = code[s], rest = 1u << (k - l);
      const uint64_t* src = m + rest;
      const uint64_t add = uint64_t{l} | uint64_t{s} << 8 | uint64_t{1} << 56;
      constexpr uint64_t kSyms = 0x00ffffffffff0000ull, kKeep = 0xff000000000000ffull;
      if (k - l < kMultiSymbols * minlen) {  // the rest holds < kMultiSymbols symbols
        for (uint32_t w = 0; w < rest; ++w) {
          const uint64_t e = src[w];
          dst[c | w << l] = ((e << 8) & kSyms) + (e & kKeep) + add;
        }
      } else {
        for (uint32_t w = 0; w < rest; ++w) {
          uint64_t e = src[w];
          if ((e >> 56) == kMultiSymbols) {  // keep kMultiSymbols - 1 of the rest
            const uint32_t last = static_cast<uint32_t>(e >> (8 * kMultiSymbols)) & 0xff;
            e = ((e & 0xff) - len[last]) | (e & 0x0000ffffffffff00ull) |
                uint64_t{kMultiSymbols - 1} << 56;
          }
          dst[c | w << l] = ((e << 8) & kSyms) + (e & kKeep) + add;
        }
      }
    }
  }
  return true;
}

// One sub-stream being decoded: a 64-bit LSB-first bit buffer over the input
// and the symbols still to produce.
struct Stream {
  const uint8_t* p;
  uint64_t buf;
  uint32_t nb;
  uint32_t rem;
  uint8_t* out;

  // Tops the buffer up to >= 56 bits: five lookups of <= 11 bits. Reads 8
  // bytes at a time while they lie before `limit`, zeros past it.
  __attribute__((always_inline)) inline void Refill(const uint8_t* limit) {
    if (p + 8 <= limit) {
      RefillFast();
    } else {
      while (nb <= 56) {
        buf |= uint64_t{p < limit ? *p : uint8_t{0}} << nb;
        ++p;
        nb += 8;
      }
    }
  }
  __attribute__((always_inline)) inline void RefillFast() {
    buf |= LoadLE64(p) << nb;
    p += (63 - nb) >> 3;
    nb |= 56;
  }
  // Up to rem symbols and the bits of exactly those; stores nothing past
  // the rem symbols.
  __attribute__((always_inline)) inline void Exact(const DecodeTables& t, const uint8_t* limit) {
    if (nb < kMaxCodeLen) Refill(limit);
    const uint32_t v = static_cast<uint32_t>(buf & (kTableSize - 1));
    const uint64_t e = t.Multi()[v];
    uint32_t c = static_cast<uint32_t>(e >> 56);
    uint32_t bits = static_cast<uint32_t>(e) & 15;
    if (rem >= 8) {
      StoreLE64(out, e >> 8);
    } else {
      if (c > rem) {
        c = rem;
        bits = t.Bits(e, c);
      }
      for (uint32_t i = 0; i < c; ++i) out[i] = static_cast<uint8_t>(e >> (8 * i + 8));
    }
    out += c;
    rem -= c;
    buf >>= bits;
    nb -= bits;
  }
};

// A sub-stream in the fast loop: the bit buffer holds its valid bits and a
// 1 just above them (so their count is 63 - clz).
struct FastStream {
  const uint8_t* p;
  uint64_t buf;
  uint8_t* out;

  // Tops the buffer up to >= 56 bits; needs 8 readable bytes at p.
  __attribute__((always_inline)) inline void Refill() {
    const uint32_t lz = static_cast<uint32_t>(__builtin_clzll(buf));
    const uint32_t nv = 63 - lz, top = nv | 56;
    const uint64_t b = (buf & ((uint64_t{1} << nv) - 1)) | LoadLE64(p) << nv;
    buf = (b & ((uint64_t{1} << top) - 1)) | uint64_t{1} << top;
    p += lz >> 3;
  }
  __attribute__((always_inline)) inline void Multi(const uint64_t* multi) {
    const uint64_t e = multi[buf & (kTableSize - 1)];
    StoreLE64(out, e >> 8);
    out += e >> 56;
    buf >>= (e & 63);
  }
  // Back to a Stream (the count of valid bits instead of the marker).
  inline void To(Stream* s) const {
    const uint32_t nv = 63 - static_cast<uint32_t>(__builtin_clzll(buf));
    s->p = p;
    s->buf = buf & ((uint64_t{1} << nv) - 1);
    s->nb = nv;
    s->out = out;
  }
};

}  // namespace

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

// Decodes up to four sub-streams, k of them, into out (stream j at
// out + j * kSubStream, counts[j] symbols, from start[j], size[j] bytes);
// writes nothing past their symbols. False if a sub-stream does not end
// exactly at its size.
JAXCC_CPU_CLONES bool DecodeGroup(const uint8_t* const* start, const uint64_t* size,
                                  const uint32_t* counts, uint32_t k, const uint8_t* limit,
                                  const DecodeTables& t, uint8_t* out) {
  // Missing streams repeat the last one (the same bytes to the same places).
  const uint32_t i1 = std::min(1u, k - 1), i2 = std::min(2u, k - 1), i3 = k - 1;
  Stream s0{start[0], 0, 0, counts[0], out};
  Stream s1{start[i1], 0, 0, counts[i1], out + i1 * kSubStream};
  Stream s2{start[i2], 0, 0, counts[i2], out + i2 * kSubStream};
  Stream s3{start[i3], 0, 0, counts[i3], out + i3 * kSubStream};
  // While a stream has symbols left it has made < kSubStream lookups of
  // <= 11 bits, so it reads nothing at or past start + kSubStreamBytes.
  if (kSubStreamBytes <= uint64_t(limit - start[i3])) {
    const uint64_t* multi = t.Multi();
    // A round is five lookups per stream, each of up to kMultiSymbols
    // symbols; the last stores 8 bytes from the 25th symbol on.
    constexpr uint32_t kRound = 4 * kMultiSymbols + 8;
    // Here the bit buffers carry a marker bit above their valid bits instead
    // of a count, so that four streams fit in the registers.
    FastStream f0{s0.p, 1, s0.out}, f1{s1.p, 1, s1.out}, f2{s2.p, 1, s2.out}, f3{s3.p, 1, s3.out};
    for (;;) {
      uint32_t rounds = std::min(std::min(s0.rem, s1.rem), std::min(s2.rem, s3.rem)) / kRound;
      if (!rounds) break;
      uint8_t* b0 = f0.out;
      uint8_t* b1 = f1.out;
      uint8_t* b2 = f2.out;
      uint8_t* b3 = f3.out;
      do {
        f0.Refill();
        f1.Refill();
        f2.Refill();
        f3.Refill();
        for (int i = 0; i < 5; ++i) {
          f0.Multi(multi);
          f1.Multi(multi);
          f2.Multi(multi);
          f3.Multi(multi);
        }
      } while (--rounds);
      s0.rem -= static_cast<uint32_t>(f0.out - b0);
      s1.rem -= static_cast<uint32_t>(f1.out - b1);
      s2.rem -= static_cast<uint32_t>(f2.out - b2);
      s3.rem -= static_cast<uint32_t>(f3.out - b3);
    }
    f0.To(&s0);
    f1.To(&s1);
    f2.To(&s2);
    f3.To(&s3);
  }
  while (s0.rem | s1.rem | s2.rem | s3.rem) {
    if (s0.rem) s0.Exact(t, limit);
    if (s1.rem) s1.Exact(t, limit);
    if (s2.rem) s2.Exact(t, limit);
    if (s3.rem) s3.Exact(t, limit);
  }
  const Stream* s[4] = {&s0, &s1, &s2, &s3};
  for (uint32_t j = 0; j < k; ++j) {
    const uint64_t consumed = 8 * uint64_t(s[j]->p - start[j]) - s[j]->nb;
    if (CeilDiv(consumed, 8) != size[j]) return false;
  }
  return true;
}

// Parses one plane of c symbols (building the decoding tables of a Huffman
// plane); returns its end, or nullptr if it is malformed.
const uint8_t* ParsePlane(const uint8_t* p, const uint8_t* end, uint64_t c, PlaneView* v,
                          DecodeTables* t) {
  if (p >= end) return nullptr;
  const uint8_t kind = *p++;
  v->kind = kind;
  if (kind == kRawPlane) {
    if (c > uint64_t(end - p)) return nullptr;
    v->data = p;
    return p + c;
  }
  if (kind == kConstant) {
    if (p >= end || c == 0) return nullptr;
    v->symbol = *p;
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
  if (!BuildTables(len, lo, hi, t)) return nullptr;
  const uint32_t subs = NumSubStreams(c);
  if (2 * uint64_t{subs} > uint64_t(end - p)) return nullptr;
  v->sizes = p;
  p += 2 * subs;
  uint64_t total = 0;
  for (uint32_t j = 0; j < subs; ++j) total += v->sizes[2 * j] | uint64_t{v->sizes[2 * j + 1]} << 8;
  if (total > uint64_t(end - p)) return nullptr;
  v->data = p;
  return p + total;
}

// Reads one plane of c symbols. *sym points at them afterwards: into the
// input for a raw plane, else into `scratch` (c bytes). Returns the end
// of the plane, or nullptr if it is malformed.
const uint8_t* ReadPlane(const uint8_t* p, const uint8_t* end, const uint8_t* limit, uint64_t c,
                         uint8_t* scratch, const uint8_t** sym, DecodeTables* t) {
  PlaneView v;
  p = ParsePlane(p, end, c, &v, t);
  if (!p) return nullptr;
  if (v.kind == kRawPlane) {
    *sym = v.data;
    return p;
  }
  *sym = scratch;
  if (v.kind == kConstant) {
    std::memset(scratch, v.symbol, c);
    return p;
  }
  const bool ok = DecodeSubStreams(
      v.data, v.sizes, limit, *t, c, [scratch](uint64_t first) { return scratch + first; },
      [](uint64_t, uint32_t) {});
  return ok ? p : nullptr;
}

EntropyScratch& Scratch() {
  thread_local auto scratch = std::make_unique<EntropyScratch>();
  return *scratch;
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

}  // namespace codec
}  // namespace jaxcc
