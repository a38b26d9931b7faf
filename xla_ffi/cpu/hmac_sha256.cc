// SHA-256 and HMAC-SHA256: see hmac_sha256.h.
#include "hmac_sha256.h"

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace jaxcc {
namespace {

// The round constants (FIPS 180-4, 4.2.2).
alignas(16) constexpr uint32_t kK[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

// The initial hash value (FIPS 180-4, 5.3.3).
constexpr uint32_t kInitial[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                  0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

inline uint32_t Rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

inline uint32_t LoadBE32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | p[3];
}

inline void StoreBE32(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v >> 24);
  p[1] = static_cast<uint8_t>(v >> 16);
  p[2] = static_cast<uint8_t>(v >> 8);
  p[3] = static_cast<uint8_t>(v);
}

// The compression function over nblocks 64-byte blocks at data, in plain C++.
void CompressPortable(uint32_t state[8], const uint8_t* data, size_t nblocks) {
  for (; nblocks; --nblocks, data += 64) {
    uint32_t w[64];
    for (int t = 0; t < 16; ++t) w[t] = LoadBE32(data + 4 * t);
    for (int t = 16; t < 64; ++t) {
      const uint32_t s0 = Rotr(w[t - 15], 7) ^ Rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
      const uint32_t s1 = Rotr(w[t - 2], 17) ^ Rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
      w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
    uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
#pragma GCC unroll 64
    for (int t = 0; t < 64; ++t) {
      const uint32_t t1 = h + (Rotr(e, 6) ^ Rotr(e, 11) ^ Rotr(e, 25)) + (g ^ (e & (f ^ g))) +
                          kK[t] + w[t];
      const uint32_t t2 = (Rotr(a, 2) ^ Rotr(a, 13) ^ Rotr(a, 22)) + ((a & b) | (c & (a | b)));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    state[0] += a;
    state[1] += b;
    state[2] += c;
    state[3] += d;
    state[4] += e;
    state[5] += f;
    state[6] += g;
    state[7] += h;
  }
}

#if defined(__x86_64__)
// The compression function with the SHA extensions. They keep the state in
// two registers, ABEF and CDGH (A in the top lane), and do two rounds per
// sha256rnds2 with the message words plus constants in the low two lanes.
// Register names list the lanes from the top one down.
__attribute__((target("sha,sse4.1,ssse3"))) void CompressShaNi(uint32_t state[8],
                                                               const uint8_t* data,
                                                               size_t nblocks) {
  // Byte-swaps each 32-bit lane: the message words are big-endian.
  const __m128i swap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
  const __m128i dcba = _mm_loadu_si128(reinterpret_cast<const __m128i*>(state));
  const __m128i hgfe = _mm_loadu_si128(reinterpret_cast<const __m128i*>(state + 4));
  const __m128i cdab = _mm_shuffle_epi32(dcba, 0xb1);
  const __m128i efgh = _mm_shuffle_epi32(hgfe, 0x1b);
  __m128i abef = _mm_alignr_epi8(cdab, efgh, 8);
  __m128i cdgh = _mm_blend_epi16(efgh, cdab, 0xf0);
  for (; nblocks; --nblocks, data += 64) {
    const __m128i abef_start = abef, cdgh_start = cdgh;
    // w[i % 4] holds message words 4i..4i+3 while rounds 4i..4i+3 run.
    __m128i w[4];
    for (int i = 0; i < 4; ++i) {
      w[i] = _mm_shuffle_epi8(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(data + 16 * i)), swap);
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
      if (i >= 4) {
        // W[4i..] from W[4i-16..] (in w[i % 4]), W[4i-15..], W[4i-7..] and W[4i-2..].
        const __m128i prev = w[(i + 3) % 4];
        const __m128i w7 = _mm_alignr_epi8(prev, w[(i + 2) % 4], 4);
        w[i % 4] = _mm_sha256msg2_epu32(
            _mm_add_epi32(_mm_sha256msg1_epu32(w[i % 4], w[(i + 1) % 4]), w7), prev);
      }
      __m128i wk =
          _mm_add_epi32(w[i % 4], _mm_load_si128(reinterpret_cast<const __m128i*>(kK + 4 * i)));
      cdgh = _mm_sha256rnds2_epu32(cdgh, abef, wk);
      wk = _mm_shuffle_epi32(wk, 0x0e);
      abef = _mm_sha256rnds2_epu32(abef, cdgh, wk);
    }
    abef = _mm_add_epi32(abef, abef_start);
    cdgh = _mm_add_epi32(cdgh, cdgh_start);
  }
  const __m128i feba = _mm_shuffle_epi32(abef, 0x1b);
  const __m128i dchg = _mm_shuffle_epi32(cdgh, 0xb1);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(state), _mm_blend_epi16(feba, dchg, 0xf0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(state + 4), _mm_alignr_epi8(dchg, feba, 8));
}
#endif

using CompressFn = void (*)(uint32_t state[8], const uint8_t* data, size_t nblocks);

CompressFn ChooseCompress() {
#if defined(__x86_64__)
  // CPUID leaves 1 and 7 (clang 14 rejects __builtin_cpu_supports("sha")).
  unsigned a, b, c, d;
  if (__get_cpuid_count(1, 0, &a, &b, &c, &d) && (c & bit_SSE4_1) && (c & bit_SSSE3) &&
      __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & bit_SHA)) {
    return CompressShaNi;
  }
#endif
  return CompressPortable;
}

// The compression function this CPU runs fastest, chosen on first use.
void Compress(uint32_t state[8], const uint8_t* data, size_t nblocks) {
  static const CompressFn chosen = ChooseCompress();
  chosen(state, data, nblocks);
}

}  // namespace

Sha256::Sha256() : bytes_(0) { std::memcpy(state_, kInitial, sizeof(state_)); }

void Sha256::Update(const void* data, size_t bytes) {
  if (bytes == 0) return;
  const uint8_t* p = static_cast<const uint8_t*>(data);
  const size_t have = bytes_ % 64;
  bytes_ += bytes;
  if (have) {
    const size_t take = bytes < 64 - have ? bytes : 64 - have;
    std::memcpy(tail_ + have, p, take);
    if (have + take < 64) return;
    Compress(state_, tail_, 1);
    p += take;
    bytes -= take;
  }
  if (bytes >= 64) {
    Compress(state_, p, bytes / 64);
    p += bytes - bytes % 64;
    bytes %= 64;
  }
  if (bytes) std::memcpy(tail_, p, bytes);
}

void Sha256::Final(uint8_t out[32]) {
  // Padding: a 1 bit, zeros up to 56 bytes mod 64, the length in bits (big-endian).
  size_t have = bytes_ % 64;
  tail_[have++] = 0x80;
  if (have > 56) {
    std::memset(tail_ + have, 0, 64 - have);
    Compress(state_, tail_, 1);
    have = 0;
  }
  std::memset(tail_ + have, 0, 56 - have);
  const uint64_t bits = bytes_ * 8;
  StoreBE32(tail_ + 56, static_cast<uint32_t>(bits >> 32));
  StoreBE32(tail_ + 60, static_cast<uint32_t>(bits));
  Compress(state_, tail_, 1);
  for (int i = 0; i < 8; ++i) StoreBE32(out + 4 * i, state_[i]);
}

HmacSha256::HmacSha256(const uint8_t* key, size_t key_bytes) {
  uint8_t block[64] = {};
  if (key_bytes > 64) {
    Sha256 hash;
    hash.Update(key, key_bytes);
    hash.Final(block);
  } else if (key_bytes) {
    std::memcpy(block, key, key_bytes);
  }
  uint8_t pad[64];
  for (int i = 0; i < 64; ++i) pad[i] = block[i] ^ 0x36;
  inner_start_.Update(pad, 64);
  for (int i = 0; i < 64; ++i) pad[i] = block[i] ^ 0x5c;
  outer_start_.Update(pad, 64);
  inner_ = inner_start_;
}

void HmacSha256::Reset() { inner_ = inner_start_; }

void HmacSha256::Update(const void* data, size_t bytes) { inner_.Update(data, bytes); }

void HmacSha256::Final(uint8_t out[32]) {
  uint8_t inner_digest[32];
  inner_.Final(inner_digest);
  Sha256 outer = outer_start_;
  outer.Update(inner_digest, 32);
  outer.Final(out);
}

bool DigestsEqual(const uint8_t* a, const uint8_t* b, size_t n) {
  uint8_t differ = 0;
  for (size_t i = 0; i < n; ++i) differ |= a[i] ^ b[i];
  return differ == 0;
}

}  // namespace jaxcc
