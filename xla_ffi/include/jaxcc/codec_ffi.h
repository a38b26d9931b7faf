// Handler-side checks shared by the CPU and CUDA codec handlers: target names,
// the dtype switch, and the validation of encode/decode arguments.
#ifndef JAXCC_CODEC_FFI_H_
#define JAXCC_CODEC_FFI_H_

#include <cstdint>
#include <string>

#include "jaxcc/codec.h"
#include "jaxcc/reduce.h"
#include "xla/ffi/api/ffi.h"

namespace jaxcc {
namespace codec {

inline std::string Name(CodecId c, bool encode) {
  return std::string(encode ? "jaxcc_codec_encode_" : "jaxcc_codec_decode_") +
         (c == kFixed ? "fixed" : "entropy");
}

inline uint64_t MaxBytes(CodecId c, DTypeId d, uint64_t n) {
  return c == kFixed ? MakeFixedLayout(d, n).max_bytes : EntropyMaxBytes(d, n);
}

// The codec dtype of `t`, or InvalidArgument naming it.
inline xla::ffi::Error CheckDType(const std::string& name, xla::ffi::DataType t, DTypeId* d) {
  namespace ffi = xla::ffi;
  switch (t) {
    case ffi::BF16: *d = kBF16; return ffi::Error::Success();
    case ffi::F16: *d = kF16; return ffi::Error::Success();
    case ffi::F32: *d = kF32; return ffi::Error::Success();
    default:
      return ffi::Error::InvalidArgument(name + ": unsupported dtype " + DataTypeName(t) +
                                         " (supported: bfloat16, float16, float32)");
  }
}

// The dtype of x and a payload of `payload_bytes` that holds any encoding of it.
inline xla::ffi::Error CheckEncodeArgs(CodecId c, const xla::ffi::AnyBuffer& x,
                                       uint64_t payload_bytes, DTypeId* d) {
  const std::string name = Name(c, true);
  xla::ffi::Error err = CheckDType(name, x.element_type(), d);
  if (!err.success()) return err;
  const uint64_t cap = MaxBytes(c, *d, x.element_count());
  if (payload_bytes < cap || cap > 0x7fffffffu) {
    return xla::ffi::Error::InvalidArgument(
        name + ": the payload holds " + std::to_string(payload_bytes) +
        " bytes, the encoding needs up to " + std::to_string(cap) + " (at most 2^31 - 1)");
  }
  return xla::ffi::Error::Success();
}

}  // namespace codec
}  // namespace jaxcc

#endif  // JAXCC_CODEC_FFI_H_
