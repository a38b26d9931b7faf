// Elements to and from byte planes (jaxcc/codec.h: exponent, sign+mantissa),
// a block at a time, on the CPU: SplitBlock, and JoinBlock with its
// streaming-store variants for outputs too large for the caches.
#ifndef JAXCC_CPU_CODEC_PLANES_H_
#define JAXCC_CPU_CODEC_PLANES_H_

#include <algorithm>
#include <cstdint>

#include "codec_cpu.h"
#include "jaxcc/codec.h"

namespace jaxcc {
namespace codec {

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

inline bool CpuHasAVX2() {
  __builtin_cpu_init();  // this may run before libgcc's own constructor
  return __builtin_cpu_supports("avx2");
}
inline const bool kHaveAVX2 = CpuHasAVX2();
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

}  // namespace codec
}  // namespace jaxcc

#endif  // JAXCC_CPU_CODEC_PLANES_H_
