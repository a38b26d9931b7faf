// What the CPU codec files (codec*.cc) share: the element words, the clone
// attribute of the hot loops, decoding failures, and each format's entry
// points, which codec.cc's EncodeOnHost / DecodeOnHost dispatch to.
#ifndef JAXCC_CPU_CODEC_CPU_H_
#define JAXCC_CPU_CODEC_CPU_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define JAXCC_CPU_AVX2 1
#endif

#include "jaxcc/codec.h"

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

namespace jaxcc {
namespace codec {

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

// "fixed" (codec_fixed.cc): encodes the n elements at x into out (MaxBytes
// bytes, jaxcc/codec_ffi.h), header included; returns the size.
uint64_t EncodeFixed(DTypeId d, const void* x, uint64_t n, uint8_t* out);
// Decodes the "fixed" encoding at `in` (nbytes, its header h already checked
// by CheckEncoding) into the n elements at y, checking the checksum on the
// way. False with *f set if the bytes are not a valid encoding.
bool DecodeFixed(DTypeId d, const uint8_t* in, uint64_t nbytes, uint64_t n, void* y,
                 const Header& h, Failure* f);

// "entropy" (codec_entropy.cc): as EncodeFixed and DecodeFixed.
uint64_t EncodeEntropy(DTypeId d, const void* x, uint64_t n, uint8_t* out);
bool DecodeEntropy(DTypeId d, const uint8_t* in, uint64_t nbytes, uint64_t n, void* y,
                   const Header& h, Failure* f);

}  // namespace codec
}  // namespace jaxcc

#endif  // JAXCC_CPU_CODEC_CPU_H_
