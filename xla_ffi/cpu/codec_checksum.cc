// The checksum and header of every encoding: see codec_checksum.h.
#include "codec_checksum.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "codec_cpu.h"
#include "jaxcc/codec.h"

namespace jaxcc {
namespace codec {

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
                  uint64_t nbytes, const Checksum* body, uint64_t body_word) {
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

}  // namespace codec
}  // namespace jaxcc
