// The jaxcc codecs on the CPU: jaxcc_codec_{encode,decode}_{fixed,entropy}.
// The formats are in xla_ffi/include/jaxcc/codec.h.
//
// One thread per call; every loop works on one block at a time (256
// elements for "fixed", 65536 for "entropy") in L1/L2-resident scratch.
// Huffman sub-streams are coded two and decoded four at a time, interleaved,
// so their dependency chains overlap; decoding takes up to six symbols per
// table lookup from a 64-bit bit buffer refilled branch-free, and joins each
// group of four sub-streams with the other planes while it is in L1.
//
// Memory traffic sets much of the speed on large tensors, so each byte is
// read from memory once: the checksum is summed block by block along with
// the coding (just before a block is decoded, just after it is encoded), and
// outputs of kStreamingBytes or more are written with streaming stores.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define JAXCC_CPU_AVX2 1
#endif

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

// Adds words [lo, hi) of data (all whole, none of them the checksum field)
// to c: a += w_i, b += (2i + 1) w_i (mod 2^32). Eight words at a time with
// vector adds only: over vectors V_0..V_{J-1}, S = sum V_t and T = sum of the
// running S before each add = sum (J - 1 - t) V_t, so sum t V_t = (J - 1) S
// - T, and word 8t + l of the range has index lo + 8t + l. The words start
// at p.
typedef uint32_t U32x8 __attribute__((vector_size(32)));

JAXCC_CPU_CLONES void AddWordsAt(const uint8_t* p, uint64_t lo, uint64_t hi, Checksum* c) {
  uint32_t a = 0, b = 0;
  const uint64_t vecs = (hi - lo) / 8;
  if (vecs) {
    U32x8 s0 = {}, s1 = {}, t0 = {}, t1 = {};
    uint64_t j = 0;
    // Two independent pairs: (s0, t0) over the even vectors, (s1, t1) over
    // the odd ones, each with its own t-weights (recombined below).
    for (; j + 2 <= vecs; j += 2) {
      U32x8 v0, v1;
      std::memcpy(&v0, p + 32 * j, 32);
      std::memcpy(&v1, p + 32 * j + 32, 32);
      t0 += s0;
      s0 += v0;
      t1 += s1;
      s1 += v1;
    }
    // Pair q = j / 2 steps: even vector t = 2u, odd t = 2u + 1 (u < q):
    // sum_u u V_{2u} = (q - 1) s0 - t0, likewise for s1, t1.
    const uint32_t q = static_cast<uint32_t>(j / 2);
    U32x8 tw = (q - 1) * s0 - t0;  // sum u V_{2u}
    U32x8 tw1 = (q - 1) * s1 - t1;  // sum u V_{2u+1}
    // sum t V_t = sum 2u V_{2u} + sum (2u + 1) V_{2u+1}
    U32x8 sum_tv = 2 * tw + 2 * tw1 + s1;
    U32x8 s = s0 + s1;
    if (j < vecs) {  // one vector left: t = j
      U32x8 v;
      std::memcpy(&v, p + 32 * j, 32);
      sum_tv += static_cast<uint32_t>(j) * v;
      s += v;
    }
    // sum i w_i = lo sum(S) + 8 sum_l sum_tv[l] + sum_l l S[l].
    uint32_t sa = 0, stv = 0, sl = 0;
    for (int l = 0; l < 8; ++l) {
      sa += s[l];
      stv += sum_tv[l];
      sl += static_cast<uint32_t>(l) * s[l];
    }
    const uint32_t sum_iw = static_cast<uint32_t>(lo) * sa + 8 * stv + sl;
    a += sa;
    b += 2 * sum_iw + sa;
  }
  for (uint64_t i = lo + 8 * vecs; i < hi; ++i) {
    uint32_t w;
    std::memcpy(&w, p + 4 * (i - lo), 4);
    a += w;
    b += (2u * static_cast<uint32_t>(i) + 1u) * w;
  }
  c->a += a;
  c->b += b;
}

// AddWordsAt for the words [lo, hi) of the encoding at data.
inline void AddWords(const uint8_t* data, uint64_t lo, uint64_t hi, Checksum* c) {
  AddWordsAt(data + 4 * lo, lo, hi, c);
}

// Adds the bytes p[0, len), at byte offset `at` of an encoding (none in the
// checksum field), to c. A byte adds what a word holding it alone adds, so
// the words cut by the ends are summed byte by byte.
void AddBytes(const uint8_t* p, uint64_t at, uint64_t len, Checksum* c) {
  auto add_byte = [&](uint64_t k) {
    const uint64_t off = at + k;
    const uint32_t w = uint32_t{p[k]} << (8 * (off % 4));
    c->a += w;
    c->b += (2u * static_cast<uint32_t>(off / 4) + 1u) * w;
  };
  uint64_t k = 0;
  for (; k < len && (at + k) % 4; ++k) add_byte(k);
  const uint64_t words = (len - k) / 4;
  if (words) AddWordsAt(p + k, (at + k) / 4, (at + k) / 4 + words, c);
  for (k += 4 * words; k < len; ++k) add_byte(k);
}

// The checksum of an encoding, summed a range at a time in any order: Upto
// sums the whole words before a byte offset, Finish the rest (the last word
// zero-padded).
struct RunningChecksum {
  const uint8_t* data;
  uint64_t nbytes;
  uint64_t done;  // words summed: [first, done)
  Checksum c;

  RunningChecksum(const uint8_t* d, uint64_t size, uint64_t first_word)
      : data(d), nbytes(size), done(first_word) {}
  void Upto(uint64_t offset) {
    const uint64_t words = std::min(offset, nbytes) / 4;
    if (words > done) {
      AddWords(data, done, words, &c);
      done = words;
    }
  }
  Checksum Finish() {
    Upto(nbytes);
    for (uint64_t i = done; i < CeilDiv(nbytes, 4); ++i) ChecksumAdd(&c, ChecksumWord(data, nbytes, i), i);
    done = CeilDiv(nbytes, 4);
    return c;
  }
};

// Adds the words before `first_word` (header included, its checksum field
// left out) to c.
void AddHead(const uint8_t* data, uint64_t first_word, Checksum* c) {
  const uint64_t field = kChecksumOffset / 4;
  AddWords(data, 0, std::min(first_word, field), c);
  if (first_word > field + 2) AddWords(data, field + 2, first_word, c);
}

Checksum ComputeChecksum(const uint8_t* data, uint64_t nbytes) {
  const uint64_t head = std::min<uint64_t>(nbytes / 4, kChecksumOffset / 4 + 2);
  RunningChecksum r(data, nbytes, head);
  Checksum c = r.Finish();
  AddHead(data, head, &c);
  return c;
}

// Writes the header and the checksum. body, if given, is the checksum of
// words [body_word, end) of the encoding.
void FinishHeader(uint8_t* out, CodecId codec, DTypeId dtype, int block_log2, uint64_t n,
                  uint64_t nbytes, const Checksum* body = nullptr, uint64_t body_word = 0) {
  Header h;
  h.codec = codec;
  h.dtype = dtype;
  h.block_log2 = static_cast<uint8_t>(block_log2);
  h.count = n;
  h.nbytes = nbytes;
  WriteHeader(out, h);
  Checksum c;
  if (body) {
    c = *body;
    AddHead(out, body_word, &c);
  } else {
    c = ComputeChecksum(out, nbytes);
  }
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

constexpr char kChecksumMismatch[] = "checksum mismatch: the data is corrupted";

// Checks the header, the size and (if verify_checksum) the checksum of an
// encoding; *header gets the header.
bool CheckEncoding(const uint8_t* data, uint64_t buffer_bytes, uint64_t nbytes_arg, CodecId codec,
                   DTypeId dtype, int block_log2, uint64_t n, Failure* f, Header* header,
                   bool verify_checksum) {
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
  *header = h;
  if (!verify_checksum) return true;
  const Checksum c = ComputeChecksum(data, h.nbytes);
  if (c.a != h.sum_a || c.b != h.sum_b) {
    f->what = kChecksumMismatch;
    return false;
  }
  return true;
}

// ---------------------------------------------------------------------------
// Joining planes into elements.
// ---------------------------------------------------------------------------

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

#if defined(__SSE2__)
constexpr bool kHaveStreamingStores = true;

// bf16 words from 16 exponents and 16 sign+mantissa bytes: with w = e << 8 |
// sm, the word is (w >> 1 & 0x7f80) | (w & 0x7f) | (w & 0x80) << 8.
inline void JoinBF16x16(__m128i e, __m128i sm, __m128i* lo, __m128i* hi) {
  const __m128i k7f80 = _mm_set1_epi16(0x7f80), k7f = _mm_set1_epi16(0x7f),
                k80 = _mm_set1_epi16(0x80);
  auto join = [&](__m128i w) {
    return _mm_or_si128(_mm_or_si128(_mm_and_si128(_mm_srli_epi16(w, 1), k7f80),
                                     _mm_and_si128(w, k7f)),
                        _mm_slli_epi16(_mm_and_si128(w, k80), 8));
  };
  *lo = join(_mm_unpacklo_epi8(sm, e));
  *hi = join(_mm_unpackhi_epi8(sm, e));
}

// JoinBlock of elements [from, to) into out + from: the unaligned head and
// the short tail of the streaming joins.
template <DTypeId D>
inline void JoinRange(const uint8_t* const* planes, uint32_t from, uint32_t to, Bits<D>* out) {
  if (from >= to) return;
  const uint8_t* at[kMaxPlanes];
  for (int k = 0; k < Info(D).planes; ++k) at[k] = planes[k] + from;
  JoinBlock<D>(at, to - from, out + from);
}

// How many of m elements come before out's first `align`-byte boundary.
template <DTypeId D>
inline uint32_t ElementsBefore(const Bits<D>* out, uint32_t m, uintptr_t align) {
  const uintptr_t bytes = (align - reinterpret_cast<uintptr_t>(out) % align) % align;
  return std::min<uint32_t>(m, static_cast<uint32_t>(bytes / sizeof(Bits<D>)));
}

// JoinBlock for outputs too large for the caches: the words go to memory with
// streaming stores (no read for ownership). bf16 and f32; the caller issues
// the fence.
template <DTypeId D>
JAXCC_CPU_CLONES void JoinBlockStreamSSE2(const uint8_t* const* planes, uint32_t m,
                                          Bits<D>* __restrict out) {
  const uint8_t* __restrict p0 = planes[0];
  const uint8_t* __restrict p1 = planes[1];
  uint32_t i = 0;
  if (reinterpret_cast<uintptr_t>(out) % sizeof(Bits<D>) == 0) {
    i = ElementsBefore<D>(out, m, 16);
    JoinRange<D>(planes, 0, i, out);
    if constexpr (D == kBF16) {
      for (; i + 16 <= m; i += 16) {
        __m128i lo, hi;
        JoinBF16x16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p0 + i)),
                    _mm_loadu_si128(reinterpret_cast<const __m128i*>(p1 + i)), &lo, &hi);
        _mm_stream_si128(reinterpret_cast<__m128i*>(out + i), lo);
        _mm_stream_si128(reinterpret_cast<__m128i*>(out + i + 8), hi);
      }
    } else if constexpr (D == kF32) {
      const uint8_t* __restrict p2 = planes[2];
      const uint8_t* __restrict p3 = planes[3];
      for (; i + 16 <= m; i += 16) {
        __m128i hlo, hhi;  // the high halves: sign|exponent|m[22:16]
        JoinBF16x16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p0 + i)),
                    _mm_loadu_si128(reinterpret_cast<const __m128i*>(p3 + i)), &hlo, &hhi);
        const __m128i b1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p1 + i));
        const __m128i b2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p2 + i));
        const __m128i llo = _mm_unpacklo_epi8(b1, b2), lhi = _mm_unpackhi_epi8(b1, b2);
        __m128i* o = reinterpret_cast<__m128i*>(out + i);
        _mm_stream_si128(o, _mm_unpacklo_epi16(llo, hlo));
        _mm_stream_si128(o + 1, _mm_unpackhi_epi16(llo, hlo));
        _mm_stream_si128(o + 2, _mm_unpacklo_epi16(lhi, hhi));
        _mm_stream_si128(o + 3, _mm_unpackhi_epi16(lhi, hhi));
      }
    }
  }
  JoinRange<D>(planes, i, m, out);
}

#if defined(JAXCC_CPU_AVX2)
// The high and low bytes of 32 bf16 words (or of the high halves of f32
// words) from 32 exponents and 32 sign+mantissa bytes (see JoinBF16x16).
__attribute__((target("avx2"), always_inline)) inline void JoinBF16Bytes32(__m256i e, __m256i sm,
                                                                         __m256i* lo,
                                                                         __m256i* hi) {
  const __m256i k7f = _mm256_set1_epi8(0x7f), k80 = _mm256_set1_epi8(static_cast<char>(0x80));
  *hi = _mm256_or_si256(_mm256_and_si256(sm, k80),
                        _mm256_and_si256(_mm256_srli_epi16(e, 1), k7f));
  *lo = _mm256_or_si256(_mm256_and_si256(sm, k7f),
                        _mm256_and_si256(_mm256_slli_epi16(e, 7), k80));
}

__attribute__((target("avx2"), always_inline)) inline __m256i Load32B(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// JoinBlockStream with 32-byte vectors: 32 elements per step.
template <DTypeId D>
__attribute__((target("avx2"))) void JoinBlockStreamAVX2(const uint8_t* const* planes, uint32_t m,
                                                         Bits<D>* __restrict out) {
  const uint8_t* __restrict p0 = planes[0];
  const uint8_t* __restrict p1 = planes[1];
  uint32_t i = 0;
  if (reinterpret_cast<uintptr_t>(out) % sizeof(Bits<D>) == 0) {
    i = ElementsBefore<D>(out, m, 32);
    JoinRange<D>(planes, 0, i, out);
    if constexpr (D == kBF16) {
      for (; i + 32 <= m; i += 32) {
        __m256i lo, hi;
        JoinBF16Bytes32(Load32B(p0 + i), Load32B(p1 + i), &lo, &hi);
        const __m256i a = _mm256_unpacklo_epi8(lo, hi), b = _mm256_unpackhi_epi8(lo, hi);
        __m256i* o = reinterpret_cast<__m256i*>(out + i);
        _mm256_stream_si256(o, _mm256_permute2x128_si256(a, b, 0x20));
        _mm256_stream_si256(o + 1, _mm256_permute2x128_si256(a, b, 0x31));
      }
    } else if constexpr (D == kF32) {
      const uint8_t* __restrict p2 = planes[2];
      const uint8_t* __restrict p3 = planes[3];
      for (; i + 32 <= m; i += 32) {
        __m256i lo, hi;  // bytes 2 and 3
        JoinBF16Bytes32(Load32B(p0 + i), Load32B(p3 + i), &lo, &hi);
        const __m256i b0 = Load32B(p1 + i), b1 = Load32B(p2 + i);
        const __m256i la = _mm256_unpacklo_epi8(b0, b1), lb = _mm256_unpackhi_epi8(b0, b1);
        const __m256i ha = _mm256_unpacklo_epi8(lo, hi), hb = _mm256_unpackhi_epi8(lo, hi);
        const __m256i x0 = _mm256_unpacklo_epi16(la, ha), x1 = _mm256_unpackhi_epi16(la, ha);
        const __m256i x2 = _mm256_unpacklo_epi16(lb, hb), x3 = _mm256_unpackhi_epi16(lb, hb);
        __m256i* o = reinterpret_cast<__m256i*>(out + i);
        _mm256_stream_si256(o, _mm256_permute2x128_si256(x0, x1, 0x20));
        _mm256_stream_si256(o + 1, _mm256_permute2x128_si256(x2, x3, 0x20));
        _mm256_stream_si256(o + 2, _mm256_permute2x128_si256(x0, x1, 0x31));
        _mm256_stream_si256(o + 3, _mm256_permute2x128_si256(x2, x3, 0x31));
      }
    }
  }
  JoinRange<D>(planes, i, m, out);
}

bool CpuHasAVX2() {
  __builtin_cpu_init();  // this may run before libgcc's own constructor
  return __builtin_cpu_supports("avx2");
}
const bool kHaveAVX2 = CpuHasAVX2();
#endif

template <DTypeId D>
inline void JoinBlockStream(const uint8_t* const* planes, uint32_t m, Bits<D>* out) {
#if defined(JAXCC_CPU_AVX2)
  // Only from a 32-byte boundary: regular stores (of a head) next to
  // streaming stores in one cache line cost far more than the join.
  if (kHaveAVX2 && reinterpret_cast<uintptr_t>(out) % 32 == 0) {
    return JoinBlockStreamAVX2<D>(planes, m, out);
  }
#endif
  JoinBlockStreamSSE2<D>(planes, m, out);
}
inline void StreamingFence() { _mm_sfence(); }
#else
constexpr bool kHaveStreamingStores = false;
template <DTypeId D>
void JoinBlockStream(const uint8_t* const* planes, uint32_t m, Bits<D>* out) {
  JoinBlock<D>(planes, m, out);
}
inline void StreamingFence() {}
#endif

// Outputs of at least this many bytes are written with streaming stores.
constexpr uint64_t kStreamingBytes = uint64_t{8} << 20;

// ---------------------------------------------------------------------------
// "fixed".
// ---------------------------------------------------------------------------

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

// Decoding tables. An entry of the multi-symbol table holds the up to
// kMultiSymbols symbols that an 11-bit window starts with: the bits they use
// in bits [0, 8) (at the bottom, so that shifting the bit buffer by the
// entry needs no masking), symbol k in bits [8k + 8, 8k + 16), their count
// in bits [56, 64). len holds the code lengths, to end a sub-stream exactly.
constexpr uint32_t kMultiSymbols = 6;

struct DecodeTables {
  // Level k (0..11) at [1 << k, 2 << k): the symbols that a k-bit window
  // (higher bits zero) starts with, each whole within the k bits. Level 11
  // is the table.
  alignas(64) uint64_t multi[2 * kTableSize];
  uint8_t len[256];
  const uint64_t* Multi() const { return multi + kTableSize; }
  // The bits of the first c symbols of entry e.
  uint32_t Bits(uint64_t e, uint32_t c) const {
    uint32_t bits = 0;
    for (uint32_t i = 0; i < c; ++i) bits += len[(e >> (8 * i + 8)) & 0xff];
    return bits;
  }
};

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

// Symbols per group of four sub-streams.
constexpr uint32_t kGroup = 4 * kSubStream;

// Decodes the sub-streams of a Huffman plane of c symbols four at a time;
// group g goes to out(g * kGroup) (room for min(kGroup, c - g * kGroup)
// symbols), then emit(g * kGroup, that count) runs.
template <typename Out, typename Emit>
inline bool DecodeSubStreams(const uint8_t* data, const uint8_t* sizes, const uint8_t* limit,
                             const DecodeTables& t, uint64_t c, Out&& out, Emit&& emit) {
  const uint32_t subs = NumSubStreams(c);
  const uint8_t* p = data;
  for (uint32_t s0 = 0; s0 < subs; s0 += 4) {
    const uint32_t k = std::min<uint32_t>(4, subs - s0);
    const uint64_t first = uint64_t{s0} * kSubStream;
    const uint8_t* start[4];
    uint64_t size[4];
    uint32_t counts[4];
    for (uint32_t j = 0; j < k; ++j) {
      const uint32_t sub = s0 + j;
      size[j] = sizes[2 * sub] | uint64_t{sizes[2 * sub + 1]} << 8;
      if (size[j] > uint64_t(limit - p)) return false;
      start[j] = p;
      p += size[j];
      counts[j] = static_cast<uint32_t>(std::min<uint64_t>(c - first - j * kSubStream, kSubStream));
    }
    if (!DecodeGroup(start, size, counts, k, limit, t, out(first))) return false;
    emit(first, static_cast<uint32_t>(std::min<uint64_t>(c - first, kGroup)));
  }
  return true;
}

// A parsed plane of c symbols: raw (data), constant (symbol) or Huffman
// (sub-stream sizes and data; the tables built).
struct PlaneView {
  uint8_t kind;
  uint8_t symbol;
  const uint8_t* data;
  const uint8_t* sizes;
};

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

// Per-block scratch of the entropy coder, one per thread, kept between calls.
struct EntropyScratch {
  std::vector<uint8_t> planes[kMaxPlanes];
  std::vector<uint8_t> nz[kMaxPlanes];
  std::vector<uint8_t> bitmap;
  std::vector<uint32_t> joined;
  DecodeTables tables;
  alignas(64) uint8_t group[kGroup];
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

// Splits m elements into byte planes: the exponent plane if kExponents, the
// sign+mantissa planes if kSignMantissa (planes[0] and planes[1..] are only
// touched when written); returns the number of +0.0 elements.
template <DTypeId D, bool kExponents = true, bool kSignMantissa = true>
JAXCC_CPU_CLONES uint32_t SplitBlock(const Bits<D>* __restrict v, uint32_t m,
                                     uint8_t* const* planes) {
  uint32_t z = 0;
  uint8_t* __restrict p0 = planes[0];
  uint8_t* __restrict p1 = planes[1];
  if constexpr (D == kBF16) {
    for (uint32_t i = 0; i < m; ++i) {
      const uint16_t x = v[i];
      if constexpr (kExponents) p0[i] = static_cast<uint8_t>(x >> 7);
      if constexpr (kSignMantissa) p1[i] = static_cast<uint8_t>(((x >> 8) & 0x80u) | (x & 0x7fu));
      z += x == 0;
    }
  } else if constexpr (D == kF16) {
    uint8_t* __restrict p2 = planes[2];
    for (uint32_t i = 0; i < m; ++i) {
      const uint16_t x = v[i];
      if constexpr (kExponents) p0[i] = static_cast<uint8_t>((x >> 10) & 0x1fu);
      if constexpr (kSignMantissa) {
        p1[i] = static_cast<uint8_t>(x);
        p2[i] = static_cast<uint8_t>(((x >> 13) & 4u) | ((x >> 8) & 3u));
      }
      z += x == 0;
    }
  } else {
    uint8_t* __restrict p2 = planes[2];
    uint8_t* __restrict p3 = planes[3];
    for (uint32_t i = 0; i < m; ++i) {
      const uint32_t x = v[i];
      if constexpr (kExponents) p0[i] = static_cast<uint8_t>(x >> 23);
      if constexpr (kSignMantissa) {
        p1[i] = static_cast<uint8_t>(x);
        p2[i] = static_cast<uint8_t>(x >> 8);
        p3[i] = static_cast<uint8_t>(((x >> 24) & 0x80u) | ((x >> 16) & 0x7fu));
      }
      z += x == 0;
    }
  }
  return z;
}

// SampleWorthCoding with a quick exit: no prefix code takes fewer bits than
// the sample's entropy, so when that alone saves less than 1/32 (the usual
// case of mantissa bytes) the Huffman code is never built. The margin covers
// the rounding of the sum.
bool SampleWorth(const uint32_t* sample_freq, uint64_t sample_count) {
  const double count = static_cast<double>(sample_count);
  double entropy_bits = 0;
  for (int s = 0; s < 256; ++s) {
    if (sample_freq[s]) entropy_bits += sample_freq[s] * std::log2(count / sample_freq[s]);
  }
  const uint64_t raw_bits = 8 * sample_count;
  if (entropy_bits * (1 - 1e-9) >= static_cast<double>(raw_bits - (raw_bits >> 5))) return false;
  return SampleWorthCoding(sample_freq, sample_count);
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

// The first word of the blocks of an entropy encoding.
inline uint64_t EntropyBodyWord(uint64_t n) {
  return (kHeaderBytes + 4 * CeilDiv(n, kEntropyBlock)) / 4;
}

// Returns the size; *body gets the checksum of the words from
// EntropyBodyWord(n) on.
template <DTypeId D>
uint64_t EntropyEncode(const Bits<D>* x, uint64_t n, uint8_t* out, Checksum* body) {
  constexpr int kPlanes = D == kF32 ? 4 : D == kF16 ? 3 : 2;
  constexpr uint32_t kElemBytes = sizeof(Bits<D>);
  const uint64_t blocks = CeilDiv(n, kEntropyBlock);
  EntropyScratch& sc = Scratch();
  uint8_t* planes[kMaxPlanes];
  for (int p = 0; p < kMaxPlanes; ++p) planes[p] = sc.planes[p].data();
  uint8_t* o = out + kHeaderBytes + 4 * blocks;
  RunningChecksum sum(out, ~uint64_t{0}, EntropyBodyWord(n));
  for (uint64_t blk = 0; blk < blocks; ++blk) {
    const uint64_t start = blk * kEntropyBlock;
    const uint32_t m = static_cast<uint32_t>(std::min<uint64_t>(kEntropyBlock, n - start));
    const Bits<D>* v = x + start;
    uint32_t hist[kPlanes][256];
    const uint32_t zeros = SplitBlock<D, true, false>(v, m, planes);
    const bool sparse_candidate = uint64_t{zeros} * 8 >= m;
    uint8_t len[kPlanes][256];
    PlanePlan dense[kPlanes];
    uint64_t dense_bytes = 1;
    // Sign+mantissa planes judged raw on the sample are written straight
    // from the input when all of them are (direct); else they are split
    // into scratch here.
    bool sampled_raw[kPlanes] = {};
    bool direct = !sparse_candidate && m >= kSampleMin;
    if (direct) {
      uint32_t sample[kPlanes - 1][256] = {};
      for (uint32_t i = 0; i < m; i += kSampleStride) {
        uint8_t b[kMaxPlanes];
        Split<D>(v[i], b);
        for (int p = 1; p < kPlanes; ++p) sample[p - 1][b[p]]++;
      }
      for (int p = 1; p < kPlanes; ++p) {
        sampled_raw[p] = !SampleWorth(sample[p - 1], CeilDiv(m, kSampleStride));
        direct &= sampled_raw[p];
      }
    }
    if (!direct) SplitBlock<D, false, true>(v, m, planes);
    for (int p = 0; p < kPlanes; ++p) {
      if (sampled_raw[p]) {
        dense[p] = {kRawPlane, 0, 0, 1 + uint64_t{m}};
        dense_bytes += dense[p].bound;
        continue;
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
    } else if (kind == kDense && direct) {
      o = WritePlane(o, planes[0], m, dense[0], len[0]);
      uint8_t* raw[kMaxPlanes] = {};
      for (int p = 1; p < kPlanes; ++p) {
        *o++ = kRawPlane;
        raw[p] = o;
        o += m;
      }
      SplitBlock<D, false, true>(v, m, raw);
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
    sum.Upto(o - out);  // while the block is in the cache
  }
  sum.nbytes = static_cast<uint64_t>(o - out);
  *body = sum.Finish();
  return sum.nbytes;
}


template <DTypeId D>
bool EntropyDecodeBlocks(const uint8_t* in, uint64_t nbytes, uint64_t n, Bits<D>* y, Failure* f,
                         RunningChecksum* sum) {
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
  const bool streaming = kHaveStreamingStores && D != kF16 && n * kElemBytes >= kStreamingBytes;
  auto join = [streaming](const uint8_t* const* planes, uint32_t count, Bits<D>* dst) {
    if (streaming) {
      JoinBlockStream<D>(planes, count, dst);
    } else {
      JoinBlock<D>(planes, count, dst);
    }
  };
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
    sum->Upto(end - in);  // the block's bytes, into the cache before decoding them
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
      // A Huffman exponent plane followed by raw or constant planes (the
      // usual case) is decoded four sub-streams at a time and joined with
      // them while the exponents are in L1.
      PlaneView exp;
      const uint8_t* q = ParsePlane(p, end, m, &exp, tables);
      bool fused = q && exp.kind == kHuffman;
      for (int k = 1; k < kPlanes && fused; ++k) {
        if (q >= end || *q == kHuffman) {
          fused = false;
        } else {
          q = ReadPlane(q, end, limit, m, sc.planes[k].data(), &sym[k], tables);
          fused = q != nullptr;
        }
      }
      if (fused) {
        const bool ok = q == end && DecodeSubStreams(
            exp.data, exp.sizes, limit, *tables, m, [&](uint64_t) { return sc.group; },
            [&](uint64_t first, uint32_t count) {
              const uint8_t* planes[kMaxPlanes] = {sc.group};
              for (int k = 1; k < kPlanes; ++k) planes[k] = sym[k] + first;
              join(planes, count, out + first);
            });
        if (!ok) {
          f->what = "corrupted plane" + where();
          return false;
        }
        p = end;
        continue;
      }
      for (int k = 0; k < kPlanes && p; ++k) {
        p = ReadPlane(p, end, limit, m, sc.planes[k].data(), &sym[k], tables);
      }
      if (p != end) {
        f->what = "corrupted plane" + where();
        return false;
      }
      join(sym, m, out);
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

template <DTypeId D>
// Decodes and checks the checksum on the way (block by block, each just
// before it is decoded): a checksum mismatch is the error whenever there is
// one, as if it had been checked first; the decoder never reads or writes
// out of bounds on any input.
bool EntropyDecode(const uint8_t* in, uint64_t nbytes, uint64_t n, Bits<D>* y, Failure* f,
                   const Header& h) {
  const uint64_t head = kChecksumOffset / 4 + 2;
  RunningChecksum sum(in, nbytes, head);
  const bool ok = EntropyDecodeBlocks<D>(in, nbytes, n, y, f, &sum);
  StreamingFence();
  Checksum c = sum.Finish();
  AddHead(in, head, &c);
  if (c.a != h.sum_a || c.b != h.sum_b) {
    f->what = kChecksumMismatch;
    return false;
  }
  return ok;
}

// ---------------------------------------------------------------------------
// The split layout (codec_host.h).
// ---------------------------------------------------------------------------

constexpr uint32_t kSplitMagic = 0x3153434Au;  // "JCS1"
constexpr size_t kSplitTrailer = 8;             // part B's checksum

// Bytes of part A before its zero padding: the header and the sm planes.
uint64_t SplitPlaneEnd(DTypeId d, uint64_t n) {
  return kHeaderBytes + uint64_t(Info(d).planes - 1) * n;
}

template <DTypeId D>
void SplitPlanesOf(const Bits<D>* x, uint64_t n, uint8_t* sm, uint8_t* exponents) {
  for (uint64_t start = 0; start < n; start += kEntropyBlock) {
    const uint32_t m = static_cast<uint32_t>(std::min<uint64_t>(kEntropyBlock, n - start));
    uint8_t* planes[kMaxPlanes] = {exponents + start, sm + start, sm + n + start,
                                   sm + 2 * n + start};
    SplitBlock<D>(x + start, m, planes);
  }
}

// Decodes blocks [first, first + count) of part B (whose block table and
// blocks are at `table`, ending at `limit`) joined with the sm planes into y.
template <DTypeId D>
bool SplitDecodeBlocks(const uint8_t* sm, const uint8_t* table, const uint8_t* limit, uint64_t n,
                       uint64_t first, uint64_t count, Bits<D>* y, Failure* f) {
  constexpr int kPlanes = D == kF32 ? 4 : 2;
  const uint64_t blocks = CeilDiv(n, kEntropyBlock);
  const uint8_t* p = table + 4 * blocks;
  for (uint64_t blk = 0; blk < first; ++blk) p += Load32(table + 4 * blk);
  EntropyScratch& sc = Scratch();
  for (uint64_t blk = first; blk < first + count; ++blk) {
    const uint64_t start = blk * kEntropyBlock;
    const uint32_t m = static_cast<uint32_t>(std::min<uint64_t>(kEntropyBlock, n - start));
    const uint8_t* end = p + Load32(table + 4 * blk);
    const uint8_t* sym[kMaxPlanes];
    for (int k = 1; k < kPlanes; ++k) sym[k] = sm + uint64_t(k - 1) * n + start;
    Bits<D>* out = y + (start - first * kEntropyBlock);
    PlaneView exp;
    const uint8_t* q = ParsePlane(p, end, m, &exp, &sc.tables);
    bool ok = q == end;
    if (ok && exp.kind == kHuffman) {
      ok = DecodeSubStreams(
          exp.data, exp.sizes, limit, sc.tables, m, [&](uint64_t) { return sc.group; },
          [&](uint64_t at, uint32_t c) {
            const uint8_t* planes[kMaxPlanes] = {sc.group};
            for (int k = 1; k < kPlanes; ++k) planes[k] = sym[k] + at;
            JoinBlock<D>(planes, c, out + at);
          });
    } else if (ok) {
      ok = ReadPlane(p, end, limit, m, sc.planes[0].data(), &sym[0], &sc.tables) == end;
      if (ok) JoinBlock<D>(sym, m, out);
    }
    if (!ok) {
      f->what = "corrupted exponent plane in block " + std::to_string(blk);
      return false;
    }
    p = end;
  }
  return true;
}

// Where part B's table starts and its blocks end, after checking the layout
// and both checksums.
bool SplitCheckLayout(DTypeId d, const uint8_t* in, uint64_t bytes, uint64_t n,
                      const uint8_t** table, const uint8_t** limit, Failure* f) {
  Header h;
  const uint64_t head = SplitHeadBytes(d, n);
  const uint64_t blocks = CeilDiv(n, kEntropyBlock);
  if (bytes < head + 4 * blocks + kSplitTrailer) {
    f->what = "truncated: " + std::to_string(bytes) + " bytes, a split piece of " +
              std::to_string(n) + " elements needs at least " +
              std::to_string(head + 4 * blocks + kSplitTrailer);
    return false;
  }
  ReadHeader(in, &h);
  if (Load32(in) != kSplitMagic || h.codec != kEntropy || h.dtype != d ||
      h.block_log2 != kEntropyBlockLog2 || h.count != n || h.nbytes != head) {
    f->what = "bad header: not a split piece of " + std::to_string(n) + " " + DTypeName(d) +
              " elements";
    return false;
  }
  const Checksum a = ComputeChecksum(in, head);
  const uint64_t body = bytes - head - kSplitTrailer;
  RunningChecksum b(in + head, body, 0);
  const Checksum cb = b.Finish();
  const uint8_t* trailer = in + head + body;
  if (a.a != h.sum_a || a.b != h.sum_b || cb.a != Load32(trailer) || cb.b != Load32(trailer + 4)) {
    f->what = kChecksumMismatch;
    return false;
  }
  uint64_t total = 4 * blocks;
  for (uint64_t blk = 0; blk < blocks; ++blk) total += Load32(in + head + 4 * blk);
  if (total != body) {
    f->what = "size mismatch: the exponent blocks need " + std::to_string(total) +
              " bytes, the piece has " + std::to_string(body);
    return false;
  }
  *table = in + head;
  *limit = trailer;
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
  Checksum body;
  if (c == kFixed) {
    switch (d) {
      case kBF16: size = FixedEncode<kBF16>(static_cast<const uint16_t*>(x), n, out, &body); break;
      case kF16: size = FixedEncode<kF16>(static_cast<const uint16_t*>(x), n, out, &body); break;
      case kF32: size = FixedEncode<kF32>(static_cast<const uint32_t*>(x), n, out, &body); break;
    }
    FinishHeader(out, c, d, kFixedBlockLog2, n, size, &body, kHeaderBytes / 4);
  } else {
    switch (d) {
      case kBF16: size = EntropyEncode<kBF16>(static_cast<const uint16_t*>(x), n, out, &body); break;
      case kF16: size = EntropyEncode<kF16>(static_cast<const uint16_t*>(x), n, out, &body); break;
      case kF32: size = EntropyEncode<kF32>(static_cast<const uint32_t*>(x), n, out, &body); break;
    }
    FinishHeader(out, c, d, kEntropyBlockLog2, n, size, &body, EntropyBodyWord(n));
  }
  return size;
}

std::string DecodeOnHost(CodecId c, DTypeId d, const uint8_t* in, uint64_t buffer_bytes,
                         uint64_t nbytes, uint64_t n, void* y) {
  Failure f;
  Header h;
  if (!CheckEncoding(in, buffer_bytes, nbytes, c, d,
                     c == kFixed ? kFixedBlockLog2 : kEntropyBlockLog2, n, &f, &h,
                     /*verify_checksum=*/false)) {
    return f.what;
  }
  bool ok = false;
  if (c == kFixed) {
    switch (d) {
      case kBF16: ok = FixedDecode<kBF16>(in, nbytes, n, static_cast<uint16_t*>(y), &f, h); break;
      case kF16: ok = FixedDecode<kF16>(in, nbytes, n, static_cast<uint16_t*>(y), &f, h); break;
      case kF32: ok = FixedDecode<kF32>(in, nbytes, n, static_cast<uint32_t*>(y), &f, h); break;
    }
  } else {
    switch (d) {
      case kBF16: ok = EntropyDecode<kBF16>(in, nbytes, n, static_cast<uint16_t*>(y), &f, h); break;
      case kF16: ok = EntropyDecode<kF16>(in, nbytes, n, static_cast<uint16_t*>(y), &f, h); break;
      case kF32: ok = EntropyDecode<kF32>(in, nbytes, n, static_cast<uint32_t*>(y), &f, h); break;
    }
  }
  return ok ? "" : f.what;
}

uint64_t SplitHeadBytes(DTypeId d, uint64_t n) { return CeilDiv(SplitPlaneEnd(d, n), 4) * 4; }

uint64_t SplitTailMaxBytes(uint64_t n) {
  return 5 * CeilDiv(n, kEntropyBlock) + n + kSplitTrailer;  // a raw plane per block at worst
}

void SplitEncodeHead(DTypeId d, const void* x, uint64_t n, uint8_t* head, uint8_t* exponents) {
  uint8_t* sm = head + kHeaderBytes;
  if (d == kBF16) {
    SplitPlanesOf<kBF16>(static_cast<const uint16_t*>(x), n, sm, exponents);
  } else {
    SplitPlanesOf<kF32>(static_cast<const uint32_t*>(x), n, sm, exponents);
  }
  const uint64_t end = SplitPlaneEnd(d, n), bytes = SplitHeadBytes(d, n);
  std::memset(head + end, 0, bytes - end);
  Header h;
  h.codec = kEntropy;
  h.dtype = d;
  h.block_log2 = kEntropyBlockLog2;
  h.count = n;
  h.nbytes = bytes;
  WriteHeader(head, h);
  Store32(head, kSplitMagic);
  const Checksum c = ComputeChecksum(head, bytes);
  Store32(head + kChecksumOffset, c.a);
  Store32(head + kChecksumOffset + 4, c.b);
}

uint64_t SplitEncodeTail(const uint8_t* exponents, uint64_t n, uint8_t* tail) {
  const uint64_t blocks = CeilDiv(n, kEntropyBlock);
  uint8_t* o = tail + 4 * blocks;
  for (uint64_t blk = 0; blk < blocks; ++blk) {
    const uint64_t start = blk * kEntropyBlock;
    const uint32_t m = static_cast<uint32_t>(std::min<uint64_t>(kEntropyBlock, n - start));
    uint32_t hist[256];
    uint8_t len[256];
    Histogram(exponents + start, m, hist);
    uint8_t* const begin = o;
    o = WritePlane(o, exponents + start, m, PlanPlane(hist, m, len), len);
    Store32(tail + 4 * blk, static_cast<uint32_t>(o - begin));
  }
  const uint64_t body = static_cast<uint64_t>(o - tail);
  RunningChecksum sum(tail, body, 0);
  const Checksum c = sum.Finish();
  Store32(o, c.a);
  Store32(o + 4, c.b);
  return body + kSplitTrailer;
}

bool IsSplit(const uint8_t* in, uint64_t bytes) {
  return bytes >= 4 && Load32(in) == kSplitMagic;
}

std::string SplitDecode(DTypeId d, const uint8_t* in, uint64_t bytes, uint64_t n, uint64_t first,
                        uint64_t count, void* y) {
  Failure f;
  const uint8_t *table, *limit;
  if (d == kF16) return "float16 pieces are never split";
  if (first % kEntropyBlock || first + count > n || (count % kEntropyBlock && first + count < n)) {
    return "elements [" + std::to_string(first) + ", " + std::to_string(first + count) +
           ") are not whole blocks of the piece";
  }
  if (first == 0 && !SplitCheckLayout(d, in, bytes, n, &table, &limit, &f)) return f.what;
  if (first != 0) {  // checked with the first range
    table = in + SplitHeadBytes(d, n);
    limit = in + bytes - kSplitTrailer;
  }
  const uint8_t* sm = in + kHeaderBytes;
  const uint64_t b0 = first / kEntropyBlock, nb = CeilDiv(count, kEntropyBlock);
  const bool ok =
      d == kBF16
          ? SplitDecodeBlocks<kBF16>(sm, table, limit, n, b0, nb, static_cast<uint16_t*>(y), &f)
          : SplitDecodeBlocks<kF32>(sm, table, limit, n, b0, nb, static_cast<uint32_t*>(y), &f);
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
