// The jaxcc codecs on the CPU: the handlers of
// jaxcc_codec_{encode,decode}_{fixed,entropy} and EncodeOnHost / DecodeOnHost
// (codec_host.h). The formats are in xla_ffi/include/jaxcc/codec.h; the
// kernels in codec_fixed.cc and codec_entropy.cc, over codec_checksum.h,
// codec_planes.h and codec_huffman.h.
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
#include <cstdint>
#include <string>

#include "codec_checksum.h"
#include "codec_cpu.h"
#include "codec_host.h"
#include "jaxcc/codec.h"
#include "jaxcc/codec_ffi.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jaxcc {
namespace codec {
namespace {

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
  return c == kFixed ? EncodeFixed(d, x, n, out) : EncodeEntropy(d, x, n, out);
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
  const bool ok = c == kFixed ? DecodeFixed(d, in, nbytes, n, y, h, &f)
                              : DecodeEntropy(d, in, nbytes, n, y, h, &f);
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
