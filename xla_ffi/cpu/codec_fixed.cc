// The "fixed" codec on the CPU (format: jaxcc/codec.h). One 256-element block
// at a time in L1-resident scratch; the codes and planes go out a 64-byte
// line at a time, summed into the checksum on the way, with streaming stores
// for large outputs.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "codec_checksum.h"
#include "codec_cpu.h"
#include "codec_planes.h"
#include "jaxcc/codec.h"

namespace jaxcc {
namespace codec {
namespace {

// Splits the kFixedBlock elements at v: exponents to e, sign+mantissa planes
// to p[0], p[1], ... (f16: the low bytes to p[0], the 3-bit plane packed to
// p[1]). Returns the largest exponent.
template <DTypeId D>
uint32_t FixedSplitScalar(const Bits<D>* __restrict v, uint8_t* __restrict e,
                          uint8_t* const* p) {
  uint8_t mx = 0;
  for (uint32_t i = 0; i < kFixedBlock; ++i) {
    e[i] = Exponent<D>(v[i]);
    mx = std::max(mx, e[i]);
  }
  uint8_t* __restrict p1 = p[0];
  if constexpr (D == kBF16) {
    for (uint32_t i = 0; i < kFixedBlock; ++i) {
      p1[i] = static_cast<uint8_t>(((v[i] >> 8) & 0x80u) | (v[i] & 0x7fu));
    }
  } else if constexpr (D == kF32) {
    uint8_t* __restrict p2 = p[1];
    uint8_t* __restrict p3 = p[2];
    for (uint32_t i = 0; i < kFixedBlock; ++i) {
      p1[i] = static_cast<uint8_t>(v[i]);
      p2[i] = static_cast<uint8_t>(v[i] >> 8);
      p3[i] = static_cast<uint8_t>(((v[i] >> 24) & 0x80u) | ((v[i] >> 16) & 0x7fu));
    }
  } else {
    for (uint32_t i = 0; i < kFixedBlock; ++i) p1[i] = static_cast<uint8_t>(v[i]);
    uint8_t* __restrict p3 = p[1];
    for (uint32_t g = 0; g < kFixedBlock / 8; ++g) {
      uint32_t word = 0;
      for (uint32_t k = 0; k < 8; ++k) {
        const uint32_t b = v[8 * g + k];
        word |= (((b >> 13) & 4u) | ((b >> 8) & 3u)) << (3 * k);
      }
      for (uint32_t k = 0; k < 3; ++k) p3[3 * g + k] = static_cast<uint8_t>(word >> (8 * k));
    }
  }
  return mx;
}

// Packs the codes of the kFixedBlock exponents e of a block with base `base`
// into kFixedBlock / 2 bytes; returns the number of escapes and sets bit i % 32
// of mask[i / 32] for each escaping element i.
inline uint32_t FixedCodesScalar(const uint8_t* e, uint32_t base, uint8_t* codes,
                                 uint32_t* mask) {
  uint32_t escapes = 0;
  for (uint32_t w = 0; w < kFixedBlock / 32; ++w) {
    uint32_t bits = 0;
    for (uint32_t k = 0; k < 32; ++k) bits |= uint32_t{FixedEscapes(e[32 * w + k], base)} << k;
    mask[w] = bits;
    escapes += static_cast<uint32_t>(__builtin_popcount(bits));
  }
  for (uint32_t i = 0; i < kFixedBlock / 2; ++i) {
    codes[i] = static_cast<uint8_t>(FixedCode(e[2 * i], base) | FixedCode(e[2 * i + 1], base) << 4);
  }
  return escapes;
}

#if defined(JAXCC_CPU_AVX2)
// FixedSplitScalar with 32-byte vectors, 32 elements per step. f16 writes 2
// bytes past the end of its 3-bit plane.
template <DTypeId D>
__attribute__((target("avx2"))) uint32_t FixedSplitAVX2(const Bits<D>* v, uint8_t* e,
                                                        uint8_t* const* p) {
  const __m256i k7f = _mm256_set1_epi8(0x7f), k80 = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256i mx = _mm256_setzero_si256();
  for (uint32_t i = 0; i < kFixedBlock; i += 32) {
    __m256i lo, hi;  // bytes 0 and 1 of the elements (f32: bytes 2 and 3)
    if constexpr (D == kF32) {
      // Bytes grouped by position in each 128-bit lane, then a 4x4 transpose
      // of their dwords and a permutation back to element order.
      const __m256i shuf = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                            0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
      const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
      __m256i w[4];
      for (int k = 0; k < 4; ++k) {
        w[k] = _mm256_shuffle_epi8(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + i + 8 * k)), shuf);
      }
      const __m256i ab0 = _mm256_unpacklo_epi32(w[0], w[1]);
      const __m256i ab1 = _mm256_unpackhi_epi32(w[0], w[1]);
      const __m256i cd0 = _mm256_unpacklo_epi32(w[2], w[3]);
      const __m256i cd1 = _mm256_unpackhi_epi32(w[2], w[3]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p[0] + i),
                          _mm256_permutevar8x32_epi32(_mm256_unpacklo_epi64(ab0, cd0), perm));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p[1] + i),
                          _mm256_permutevar8x32_epi32(_mm256_unpackhi_epi64(ab0, cd0), perm));
      lo = _mm256_permutevar8x32_epi32(_mm256_unpacklo_epi64(ab1, cd1), perm);
      hi = _mm256_permutevar8x32_epi32(_mm256_unpackhi_epi64(ab1, cd1), perm);
    } else {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + i));
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + i + 16));
      const __m256i kff = _mm256_set1_epi16(0xff);
      lo = _mm256_permute4x64_epi64(
          _mm256_packus_epi16(_mm256_and_si256(a, kff), _mm256_and_si256(b, kff)), 0xd8);
      hi = _mm256_permute4x64_epi64(
          _mm256_packus_epi16(_mm256_srli_epi16(a, 8), _mm256_srli_epi16(b, 8)), 0xd8);
    }
    __m256i ex;
    if constexpr (D == kF16) {
      ex = _mm256_and_si256(_mm256_srli_epi16(hi, 2), _mm256_set1_epi8(31));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p[0] + i), lo);
      // The 3-bit values t = sign << 2 | m[9:8], 8 to 24 bits: t0 | t1 << 3
      // in words, then words paired in dwords and dwords in qwords.
      __m256i t = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(hi, 5), _mm256_set1_epi8(4)),
                                  _mm256_and_si256(hi, _mm256_set1_epi8(3)));
      t = _mm256_maddubs_epi16(t, _mm256_set1_epi16(0x0801));
      t = _mm256_madd_epi16(t, _mm256_set1_epi32(0x00400001));
      t = _mm256_or_si256(t, _mm256_srli_epi64(t, 20));
      t = _mm256_shuffle_epi8(t, _mm256_setr_epi8(0, 1, 2, 8, 9, 10, -1, -1, -1, -1, -1, -1, -1,
                                                  -1, -1, -1, 0, 1, 2, 8, 9, 10, -1, -1, -1, -1,
                                                  -1, -1, -1, -1, -1, -1));
      uint8_t* q = p[1] + i / 8 * 3;
      _mm_storel_epi64(reinterpret_cast<__m128i*>(q), _mm256_castsi256_si128(t));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(q + 6), _mm256_extracti128_si256(t, 1));
    } else {
      // e = (hi << 1 | lo >> 7) & 255; sign | m[6:0] = (hi & 0x80) | (lo & 0x7f).
      ex = _mm256_or_si256(_mm256_add_epi8(hi, hi),
                           _mm256_and_si256(_mm256_srli_epi16(lo, 7), _mm256_set1_epi8(1)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p[D == kF32 ? 2 : 0] + i),
                          _mm256_or_si256(_mm256_and_si256(hi, k80), _mm256_and_si256(lo, k7f)));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(e + i), ex);
    mx = _mm256_max_epu8(mx, ex);
  }
  __m128i m = _mm_max_epu8(_mm256_castsi256_si128(mx), _mm256_extracti128_si256(mx, 1));
  m = _mm_max_epu8(m, _mm_srli_si128(m, 8));
  m = _mm_max_epu8(m, _mm_srli_si128(m, 4));
  m = _mm_max_epu8(m, _mm_srli_si128(m, 2));
  m = _mm_max_epu8(m, _mm_srli_si128(m, 1));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(m)) & 255u;
}

// FixedCodesScalar with 32-byte vectors: code = e - (base - 15), saturated
// at 0 (escapes and zeros).
__attribute__((target("avx2,popcnt"))) uint32_t FixedCodesAVX2(const uint8_t* e, uint32_t base,
                                                               uint8_t* codes, uint32_t* mask) {
  const __m256i off = _mm256_set1_epi8(static_cast<char>(base - 15)), zero = _mm256_setzero_si256();
  const __m256i nibbles = _mm256_set1_epi16(0x1001);  // c0 + 16 c1
  uint32_t escapes = 0;
  for (uint32_t i = 0; i < kFixedBlock; i += 64) {
    __m256i c[2];
    for (int k = 0; k < 2; ++k) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(e + i + 32 * k));
      c[k] = _mm256_subs_epu8(x, off);
      const uint32_t bits = static_cast<uint32_t>(_mm256_movemask_epi8(
          _mm256_andnot_si256(_mm256_cmpeq_epi8(x, zero), _mm256_cmpeq_epi8(c[k], zero))));
      mask[i / 32 + k] = bits;
      escapes += static_cast<uint32_t>(__builtin_popcount(bits));
    }
    const __m256i packed = _mm256_packus_epi16(_mm256_maddubs_epi16(c[0], nibbles),
                                               _mm256_maddubs_epi16(c[1], nibbles));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + i / 2),
                        _mm256_permute4x64_epi64(packed, 0xd8));
  }
  return escapes;
}
#endif

template <DTypeId D>
inline uint32_t FixedSplit(const Bits<D>* v, uint8_t* e, uint8_t* const* p) {
#if defined(JAXCC_CPU_AVX2)
  if (kHaveAVX2) return FixedSplitAVX2<D>(v, e, p);
#endif
  return FixedSplitScalar<D>(v, e, p);
}

inline uint32_t FixedCodes(const uint8_t* e, uint32_t base, uint8_t* codes, uint32_t* mask) {
#if defined(JAXCC_CPU_AVX2)
  if (kHaveAVX2) return FixedCodesAVX2(e, base, codes, mask);
#endif
  return FixedCodesScalar(e, base, codes, mask);
}

// One region of an encoding written through an L1 buffer that holds its
// bytes at their offsets mod 64: whole 64-byte lines (of out) go out as they
// are done, with streaming stores if `stream`, and are summed on the way as
// in AddWordsAt; the line still being filled moves back to the front of the
// buffer. The region's first and last lines go out byte by byte.
struct LineWriter {
  static constexpr uint64_t kRecycle = 4096;  // buffer bytes in use that bring the move
  uint8_t* out;
  bool stream;  // out is 64-byte aligned and large
  uint64_t line;  // the offset of buf[0] in the encoding, a multiple of 64
  uint64_t done;  // the bytes before this offset are out
  uint64_t first_word = 0, vecs = 0;  // of the whole lines, summed in s and t
  U32x8 s = {}, t = {};
  Checksum edges;  // of the first and last lines
  alignas(64) uint8_t buf[kRecycle + 64 + 512];

  LineWriter(uint8_t* o, uint64_t at, bool st) : out(o), stream(st), line(at / 64 * 64), done(at) {}
  uint8_t* At(uint64_t offset) { return buf + (offset - line); }

  // Writes out the bytes before `offset`: all of them if `last`, else its
  // whole lines.
  void Flush(uint64_t offset, bool last) {
    const uint64_t upto = last ? offset : offset / 64 * 64;
    if (upto <= done) return;
    uint64_t at = done;
    if (at % 64 == 0 && at + 64 <= upto) {
      if (!vecs) first_word = at / 4;
      vecs += (upto - at) / 64 * 2;
      // Locals, as the stores below may alias the members.
      U32x8 ls = s, lt = t;
      for (; at + 64 <= upto; at += 64) {
        const uint8_t* src = At(at);
        U32x8 v0, v1;
        std::memcpy(&v0, src, 32);
        std::memcpy(&v1, src + 32, 32);
        lt += ls;
        ls += v0;
        lt += ls;
        ls += v1;
#if defined(__SSE2__)
        if (stream) {
          for (int j = 0; j < 4; ++j) {
            _mm_stream_si128(reinterpret_cast<__m128i*>(out + at) + j,
                             _mm_load_si128(reinterpret_cast<const __m128i*>(src) + j));
          }
          continue;
        }
#endif
        std::memcpy(out + at, src, 64);
      }
      s = ls;
      t = lt;
    }
    if (at < upto) {
      AddBytes(At(at), at, upto - at, &edges);
      std::memcpy(out + at, At(at), upto - at);
    }
    done = upto;
    if (done - line >= kRecycle) {
      const uint64_t front = done / 64 * 64;
      std::memcpy(buf, At(front), 64);
      line = front;
    }
  }

  // Adds the checksum of the bytes written out to c.
  void Finish(Checksum* c) {
    // sum over vectors V_j of j V_j = (vecs - 1) s - t; word l of V_j has
    // index first_word + 8 j + l.
    const U32x8 sum_tv = static_cast<uint32_t>(vecs - 1) * s - t;
    uint32_t sa = 0, stv = 0, sl = 0;
    for (int l = 0; l < 8; ++l) {
      sa += s[l];
      stv += sum_tv[l];
      sl += static_cast<uint32_t>(l) * s[l];
    }
    c->a += sa + edges.a;
    c->b += 2 * (static_cast<uint32_t>(first_word) * sa + 8 * stv + sl) + sa + edges.b;
  }
};

// Elements ahead of the block being encoded whose input is prefetched.
constexpr uint64_t kFixedPrefetch = 4 * kFixedBlock;

// Encodes x into out, all but the header; returns the size and adds the
// checksum of the bytes after the header to *body. The codes and planes of
// each block go to L1 buffers, and out from there a line at a time.
template <DTypeId D>
JAXCC_CPU_CLONES uint64_t FixedEncode(const Bits<D>* x, uint64_t n, uint8_t* out,
                                      Checksum* body) {
  constexpr DTypeInfo info = Info(D);
  // Regions: the codes, then the planes (f16: the 3-bit one last).
  constexpr int kRegions = D == kF32 ? 4 : D == kF16 ? 3 : 2;
  const FixedLayout l = MakeFixedLayout(D, n);
  const bool stream = kHaveStreamingStores && reinterpret_cast<uintptr_t>(out) % 64 == 0 &&
                      n * sizeof(Bits<D>) >= kStreamingBytes;
  // Where the bytes of elements [0, e) of each region end.
  auto region_end = [&](int r, uint64_t e) {
    if (r == 0) return l.codes + CeilDiv(e, 2);
    if (D == kF16 && r == 2) return l.packed3 + CeilDiv(3 * e, 8);
    return l.planes + (r - 1) * n + e;
  };
  std::unique_ptr<LineWriter> w[kRegions];
  for (int r = 0; r < kRegions; ++r) {
    w[r] = std::make_unique<LineWriter>(out, region_end(r, 0), stream);
  }
  uint8_t* spill = out + l.spill;
  uint64_t used = 0;
  for (uint64_t start = 0; start < n; start += kFixedBlock) {
    const uint32_t m = static_cast<uint32_t>(std::min<uint64_t>(kFixedBlock, n - start));
    const Bits<D>* v = x + start;
    if (start + kFixedPrefetch < n) {  // memory latency, not bandwidth, bounds the loads
      const char* ahead = reinterpret_cast<const char*>(v + kFixedPrefetch);
      for (uint32_t k = 0; k < sizeof(Bits<D>) * kFixedBlock; k += 64) {
        __builtin_prefetch(ahead + k);
      }
    }
    alignas(64) Bits<D> padded[kFixedBlock];
    if (m < kFixedBlock) {  // the last block: zeros have code 0 and no plane bits
      std::memset(padded, 0, sizeof(padded));
      std::memcpy(padded, v, m * sizeof(Bits<D>));
      v = padded;
    }
    uint8_t* codes = w[0]->At(region_end(0, start));
    uint8_t* planes[kRegions - 1];
    for (int r = 1; r < kRegions; ++r) planes[r - 1] = w[r]->At(region_end(r, start));
    alignas(64) uint8_t e[kFixedBlock];
    uint32_t mask[kFixedBlock / 32];
    const uint32_t base = FixedBase(FixedSplit<D>(v, e, planes));
    const uint32_t esc = FixedEscByte(D, FixedCodes(e, base, codes, mask), m);
    uint8_t* s = spill + used;
    if (esc == kFixedRawExponents) {
      for (uint32_t i = 0; i < kFixedBlock / 2; ++i) {
        codes[i] = static_cast<uint8_t>((e[2 * i] & 15) | e[2 * i + 1] << 4);
      }
      if constexpr (info.exp_bits == 8) {
        for (uint32_t i = 0; i < m / 2; ++i) s[i] = (e[2 * i] >> 4) | (e[2 * i + 1] & 0xf0);
        if (m & 1) s[m / 2] = e[m - 1] >> 4;
      } else {
        for (uint32_t g = 0; g < CeilDiv(m, 8); ++g) {
          uint8_t byte = 0;
          for (uint32_t k = 0; k < 8 && 8 * g + k < m; ++k) byte |= ((e[8 * g + k] >> 4) & 1) << k;
          s[g] = byte;
        }
      }
    } else {
      uint8_t* q = s;
      for (uint32_t k = 0; k < kFixedBlock / 32; ++k) {
        for (uint32_t bits = mask[k]; bits; bits &= bits - 1) {
          const uint32_t i = 32 * k + static_cast<uint32_t>(__builtin_ctz(bits));
          q[0] = static_cast<uint8_t>(i);
          q[1] = e[i];
          q += 2;
        }
      }
    }
    const uint64_t need = FixedBlockSpill(D, esc, m);
    AddBytes(s, l.spill + used, need, body);
    used += need;
    const uint64_t table = l.table + 2 * (start / kFixedBlock);
    out[table] = static_cast<uint8_t>(base);
    out[table + 1] = static_cast<uint8_t>(esc);
    AddBytes(out + table, table, 2, body);
    for (int r = 0; r < kRegions; ++r) w[r]->Flush(region_end(r, start + m), start + m == n);
  }
  if (stream) StreamingFence();
  for (int r = 0; r < kRegions; ++r) w[r]->Finish(body);
  // The rest of the spill pool: zeros, which add nothing to the checksum.
  const uint64_t nbytes = std::max(l.static_bytes, l.spill + used);
  std::memset(out + l.spill + used, 0, nbytes - (l.spill + used));
  return nbytes;
}

// The checksum of a "fixed" encoding, summed along with the decoding: the
// words are split into regions (head and block table, codes, each plane,
// spill) at the words that hold their first bytes, and each region is summed
// up to where the decoding has got.
template <DTypeId D>
struct FixedSum {
  static constexpr int kRegions = D == kF32 ? 5 : D == kF16 ? 4 : 3;  // + the spill
  const uint8_t* data;
  uint64_t nbytes, n;
  FixedLayout l;
  uint64_t begin[kRegions + 1];  // word partition; begin[kRegions]: the spill
  uint64_t done[kRegions];
  Checksum c;

  FixedSum(const uint8_t* d, uint64_t size, uint64_t count)
      : data(d), nbytes(size), n(count), l(MakeFixedLayout(D, count)) {
    uint64_t at[kRegions + 1] = {kHeaderBytes, l.codes, l.planes};
    if constexpr (D == kF32) {
      at[3] = l.planes + n;
      at[4] = l.planes + 2 * n;
    } else if constexpr (D == kF16) {
      at[3] = l.packed3;
    }
    at[kRegions] = l.spill;
    for (int r = 0; r <= kRegions; ++r) begin[r] = std::min(at[r], nbytes) / 4;
    for (int r = 0; r < kRegions; ++r) done[r] = begin[r];
    done[0] = begin[1];  // the head and the block table, summed in Finish
  }
  void Advance(int r, uint64_t offset) {
    const uint64_t words = std::min(std::min(offset, nbytes) / 4, begin[r + 1]);
    if (words > done[r]) {
      AddWords(data, done[r], words, &c);
      done[r] = words;
    }
  }
  // The regions up to the data of elements [0, e).
  void Upto(uint64_t e) {
    Advance(1, l.codes + CeilDiv(e, 2));
    if constexpr (D == kF32) {
      for (int k = 0; k < 3; ++k) Advance(2 + k, l.planes + k * n + e);
    } else if constexpr (D == kF16) {
      Advance(2, l.planes + e);
      Advance(3, l.packed3 + CeilDiv(3 * e, 8));
    } else {
      Advance(2, l.planes + e);
    }
  }
  Checksum Finish() {
    for (int r = 1; r < kRegions; ++r) Advance(r, nbytes);
    RunningChecksum spill(data, nbytes, begin[kRegions]);
    Checksum s = spill.Finish();
    s.a += c.a;
    s.b += c.b;
    AddHead(data, begin[1], &s);
    return s;
  }
};

// Elements per step of the checksum in FixedDecode.
constexpr uint64_t kFixedSumStep = 64 * kFixedBlock;

template <DTypeId D>
JAXCC_CPU_CLONES bool FixedDecodeBlocks(const uint8_t* in, uint64_t nbytes, uint64_t n,
                                        Bits<D>* y, Failure* f, FixedSum<D>* sum) {
  constexpr DTypeInfo info = Info(D);
  const FixedLayout l = MakeFixedLayout(D, n);
  if (nbytes < l.static_bytes) {
    f->what = "truncated: " + std::to_string(nbytes) + " bytes, less than the static size " +
              std::to_string(l.static_bytes);
    return false;
  }
  const uint8_t* spill = in + l.spill;
  uint64_t used = 0;
  const bool streaming = kHaveStreamingStores && D != kF16 && n * sizeof(Bits<D>) >= kStreamingBytes;
  for (uint64_t blk = 0; blk < l.blocks; ++blk) {
    const uint64_t start = blk * kFixedBlock;
    const uint32_t m = static_cast<uint32_t>(std::min<uint64_t>(kFixedBlock, n - start));
    if (start % kFixedSumStep == 0) sum->Upto(std::min(n, start + kFixedSumStep));
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
    if constexpr (D != kF16) {
      const uint8_t* planes[kMaxPlanes] = {e, in + l.planes + start};
      if constexpr (D == kF32) {
        planes[2] = planes[1] + n;
        planes[3] = planes[2] + n;
      }
      if (streaming) {
        JoinBlockStream<D>(planes, m, out);
      } else {
        JoinBlock<D>(planes, m, out);
      }
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

// Decodes and checks the checksum on the way (see EntropyDecode).
template <DTypeId D>
bool FixedDecode(const uint8_t* in, uint64_t nbytes, uint64_t n, Bits<D>* y, Failure* f,
                 const Header& h) {
  FixedSum<D> sum(in, nbytes, n);
  const bool ok = FixedDecodeBlocks<D>(in, nbytes, n, y, f, &sum);
  StreamingFence();
  const Checksum c = sum.Finish();
  if (c.a != h.sum_a || c.b != h.sum_b) {
    f->what = kChecksumMismatch;
    return false;
  }
  return ok;
}

}  // namespace

uint64_t EncodeFixed(DTypeId d, const void* x, uint64_t n, uint8_t* out) {
  uint64_t size = 0;
  Checksum body;
  switch (d) {
    case kBF16: size = FixedEncode<kBF16>(static_cast<const uint16_t*>(x), n, out, &body); break;
    case kF16: size = FixedEncode<kF16>(static_cast<const uint16_t*>(x), n, out, &body); break;
    case kF32: size = FixedEncode<kF32>(static_cast<const uint32_t*>(x), n, out, &body); break;
  }
  FinishHeader(out, kFixed, d, kFixedBlockLog2, n, size, &body, kHeaderBytes / 4);
  return size;
}

bool DecodeFixed(DTypeId d, const uint8_t* in, uint64_t nbytes, uint64_t n, void* y,
                 const Header& h, Failure* f) {
  switch (d) {
    case kBF16: return FixedDecode<kBF16>(in, nbytes, n, static_cast<uint16_t*>(y), f, h);
    case kF16: return FixedDecode<kF16>(in, nbytes, n, static_cast<uint16_t*>(y), f, h);
    case kF32: return FixedDecode<kF32>(in, nbytes, n, static_cast<uint32_t*>(y), f, h);
  }
  return false;
}

}  // namespace codec
}  // namespace jaxcc
