// The CPU codec kernels of jaxcc_codec_{encode,decode}_*, for other CPU code
// (the Tcp transport's pieces travel in them: piece_codec.h), and those of the
// split layout of a piece sent in two parts. Every format is in
// jaxcc/codec.h.
#ifndef JAXCC_CPU_CODEC_HOST_H_
#define JAXCC_CPU_CODEC_HOST_H_

#include <cstdint>
#include <string>

#include "jaxcc/codec.h"

namespace jaxcc {
namespace codec {

// Encodes the n elements at x into out, which holds MaxBytes(c, d, n) bytes
// (jaxcc/codec_ffi.h); returns the encoding's size, header included.
uint64_t EncodeOnHost(CodecId c, DTypeId d, const void* x, uint64_t n, uint8_t* out);

// Decodes the `nbytes`-byte encoding at `in` (a buffer of `buffer_bytes`) into
// the n elements at y after checking its header, size and checksum. Returns
// what is wrong with the bytes, empty on success.
std::string DecodeOnHost(CodecId c, DTypeId d, const uint8_t* in, uint64_t buffer_bytes,
                         uint64_t nbytes, uint64_t n, void* y);

// The split layout (jaxcc/codec.h) of a piece of n bf16 or f32 elements, for a
// send that must start before its exponents are coded (the Tcp transport's
// split send); codec_split.cc.
uint64_t SplitHeadBytes(DTypeId d, uint64_t n);  // part A
uint64_t SplitTailMaxBytes(uint64_t n);          // the most part B takes
// Writes part A of the n elements at x and their exponent plane (n bytes).
void SplitEncodeHead(DTypeId d, const void* x, uint64_t n, uint8_t* head, uint8_t* exponents);
// Writes part B from the exponent plane; returns its size.
uint64_t SplitEncodeTail(const uint8_t* exponents, uint64_t n, uint8_t* tail);
// Whether the `bytes` at `in` start a split piece.
bool IsSplit(const uint8_t* in, uint64_t bytes);
// Decodes elements [first, first + count) of the split piece of n elements at
// `in` (parts A and B back to back, `bytes` in all) into y. Ranges are whole
// blocks, decoded in order from first = 0, which checks the layout and both
// checksums. Returns what is wrong with the bytes, empty on success.
std::string SplitDecode(DTypeId d, const uint8_t* in, uint64_t bytes, uint64_t n, uint64_t first,
                        uint64_t count, void* y);

}  // namespace codec
}  // namespace jaxcc

#endif  // JAXCC_CPU_CODEC_HOST_H_
