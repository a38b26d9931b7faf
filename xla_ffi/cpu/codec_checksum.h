// The checksum and header of every encoding (jaxcc/codec.h), on the CPU:
// summed eight words at a time, a range at a time in any order, so that the
// coders sum each block along with coding it.
#ifndef JAXCC_CPU_CODEC_CHECKSUM_H_
#define JAXCC_CPU_CODEC_CHECKSUM_H_

#include <algorithm>
#include <cstdint>

#include "codec_cpu.h"
#include "jaxcc/codec.h"

namespace jaxcc {
namespace codec {

// Adds words [lo, hi) of data (all whole, none of them the checksum field)
// to c: a += w_i, b += (2i + 1) w_i (mod 2^32). Eight words at a time with
// vector adds only: over vectors V_0..V_{J-1}, S = sum V_t and T = sum of the
// running S before each add = sum (J - 1 - t) V_t, so sum t V_t = (J - 1) S
// - T, and word 8t + l of the range has index lo + 8t + l. The words start
// at p.
void AddWordsAt(const uint8_t* p, uint64_t lo, uint64_t hi, Checksum* c);

// Eight u32 lanes, for the vector sums.
typedef uint32_t U32x8 __attribute__((vector_size(32)));

// AddWordsAt for the words [lo, hi) of the encoding at data.
inline void AddWords(const uint8_t* data, uint64_t lo, uint64_t hi, Checksum* c) {
  AddWordsAt(data + 4 * lo, lo, hi, c);
}

// Adds the bytes p[0, len), at byte offset `at` of an encoding (none in the
// checksum field), to c. A byte adds what a word holding it alone adds, so
// the words cut by the ends are summed byte by byte.
void AddBytes(const uint8_t* p, uint64_t at, uint64_t len, Checksum* c);

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
    for (uint64_t i = done; i < CeilDiv(nbytes, 4); ++i) {
      ChecksumAdd(&c, ChecksumWord(data, nbytes, i), i);
    }
    done = CeilDiv(nbytes, 4);
    return c;
  }
};

// Adds the words before `first_word` (header included, its checksum field
// left out) to c.
void AddHead(const uint8_t* data, uint64_t first_word, Checksum* c);

// The checksum of the nbytes bytes of an encoding at data.
Checksum ComputeChecksum(const uint8_t* data, uint64_t nbytes);

// Writes the header and the checksum. body, if given, is the checksum of
// words [body_word, end) of the encoding.
void FinishHeader(uint8_t* out, CodecId codec, DTypeId dtype, int block_log2, uint64_t n,
                  uint64_t nbytes, const Checksum* body = nullptr, uint64_t body_word = 0);

// "bfloat16", "float16" or "float32".
const char* DTypeName(DTypeId d);

inline constexpr char kChecksumMismatch[] = "checksum mismatch: the data is corrupted";

// Checks the header, the size and (if verify_checksum) the checksum of an
// encoding; *header gets the header.
bool CheckEncoding(const uint8_t* data, uint64_t buffer_bytes, uint64_t nbytes_arg, CodecId codec,
                   DTypeId dtype, int block_log2, uint64_t n, Failure* f, Header* header,
                   bool verify_checksum);

}  // namespace codec
}  // namespace jaxcc

#endif  // JAXCC_CPU_CODEC_CHECKSUM_H_
