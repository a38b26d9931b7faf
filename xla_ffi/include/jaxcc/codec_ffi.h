// Handler-side checks shared by the CPU and CUDA codec handlers: the codec and
// dtype ids by name, target names, the dtype switch, and the validation of
// encode/decode arguments.
#ifndef JAXCC_CODEC_FFI_H_
#define JAXCC_CODEC_FFI_H_

#include <cstdint>
#include <string>

#include "jaxcc/codec.h"
#include "jaxcc/dtypes.h"
#include "xla/ffi/api/ffi.h"

namespace jaxcc {
namespace codec {

// The codecs and the element types they take, by the names of the Python side
// (jaxcc/codec/reference.py: CODEC_IDS, DTYPE_IDS; jaxcc/_src/ffi.py compares
// them when it loads the module).
struct CodecEntry {
  const char* name;
  CodecId id;
};
constexpr CodecEntry kCodecs[] = {{"fixed", kFixed}, {"entropy", kEntropy}};
struct CodecType {
  xla::ffi::DataType type;
  DTypeId id;
};
constexpr CodecType kCodecTypes[] = {
    {xla::ffi::BF16, kBF16}, {xla::ffi::F16, kF16}, {xla::ffi::F32, kF32}};

inline std::string Name(CodecId c, bool encode) {
  return std::string(encode ? "jaxcc_codec_encode_" : "jaxcc_codec_decode_") +
         (c == kFixed ? "fixed" : "entropy");
}

inline uint64_t MaxBytes(CodecId c, DTypeId d, uint64_t n) {
  return c == kFixed ? MakeFixedLayout(d, n).max_bytes : EntropyMaxBytes(d, n);
}

// The codec dtype of `t`, or InvalidArgument naming it.
inline xla::ffi::Error CheckDType(const std::string& name, xla::ffi::DataType t, DTypeId* d) {
  std::string supported;
  for (const CodecType& c : kCodecTypes) {
    if (c.type == t) {
      *d = c.id;
      return xla::ffi::Error::Success();
    }
    supported += (supported.empty() ? "" : ", ") + DataTypeName(c.type);
  }
  return xla::ffi::Error::InvalidArgument(name + ": unsupported dtype " + DataTypeName(t) +
                                          " (supported: " + supported + ")");
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
