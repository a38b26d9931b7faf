// The CPU codec kernels of jaxcc_codec_{encode,decode}_*, for other CPU code:
// the Tcp transport compresses the pieces of a schedule with them.
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

}  // namespace codec
}  // namespace jaxcc

#endif  // JAXCC_CPU_CODEC_HOST_H_
