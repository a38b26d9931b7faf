// The jaxcc codecs on the GPU: the handlers of
// jaxcc_codec_{encode,decode}_{fixed,entropy}, byte for byte the CPU formats
// of xla_ffi/include/jaxcc/codec.h (the same header code decides every block;
// tests/gpu/check_codec.py compares them). The kernels are in codec_fixed.cu
// and codec_entropy.cu, the checksum in codec_checksum.cu.
//
// Encoding never synchronises with the host. Decoding copies the 32-byte
// header to the host to check it, and the status and checksum back at the
// end, so that a corrupted encoding fails the call with a message.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "codec_cuda.h"
#include "jaxcc/codec.h"
#include "jaxcc/codec_ffi.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jaxcc {
namespace codec {
namespace {

template <CodecId C>
ffi::Error EncodeImpl(cudaStream_t stream, ffi::ScratchAllocator scratch, ffi::AnyBuffer x,
                      ffi::Result<ffi::Buffer<ffi::U8>> payload,
                      ffi::Result<ffi::BufferR0<ffi::S32>> nbytes) {
  const std::string name = Name(C, true);
  DTypeId d;
  ffi::Error err = CheckEncodeArgs(C, x, payload->element_count(), &d);
  if (!err.success()) return err;
  const uint64_t n = x.element_count();
  uint8_t* out = payload->typed_data();
  int32_t* size = nbytes->typed_data();
  const void* src = x.untyped_data();
  if constexpr (C == kFixed) {
    switch (d) {
      case kBF16: return EncodeFixedOn<kBF16>(name, stream, scratch, src, n, out, size);
      case kF16: return EncodeFixedOn<kF16>(name, stream, scratch, src, n, out, size);
      default: return EncodeFixedOn<kF32>(name, stream, scratch, src, n, out, size);
    }
  } else {
    switch (d) {
      case kBF16: return EncodeEntropyOn<kBF16>(name, stream, scratch, src, n, out, size);
      case kF16: return EncodeEntropyOn<kF16>(name, stream, scratch, src, n, out, size);
      default: return EncodeEntropyOn<kF32>(name, stream, scratch, src, n, out, size);
    }
  }
}

// Checks a header copied to the host; "" if it matches.
std::string CheckHeader(const uint8_t* head, uint64_t buffer_bytes, int64_t nbytes_arg,
                        CodecId codec, DTypeId dtype, uint64_t n) {
  Header h;
  if (!ReadHeader(head, &h)) return "bad header: not a jaxcc encoding (wrong magic bytes)";
  const int block_log2 = codec == kFixed ? kFixedBlockLog2 : kEntropyBlockLog2;
  if (h.codec != codec) {
    return "bad header: codec id " + std::to_string(h.codec) + ", expected " +
           std::to_string(codec) + " (decoded with the wrong codec?)";
  }
  if (h.dtype != dtype || h.block_log2 != block_log2) {
    return "bad header: dtype id " + std::to_string(h.dtype) + " / block 2^" +
           std::to_string(h.block_log2) + ", expected dtype id " + std::to_string(dtype);
  }
  if (h.count != n) {
    return "bad header: " + std::to_string(h.count) + " elements, expected " + std::to_string(n);
  }
  if (nbytes_arg < 0 || h.nbytes != static_cast<uint64_t>(nbytes_arg)) {
    return "size mismatch: the header says " + std::to_string(h.nbytes) + " bytes, nbytes says " +
           std::to_string(nbytes_arg);
  }
  if (h.nbytes > buffer_bytes || h.nbytes < kHeaderBytes) {
    return "truncated: the header says " + std::to_string(h.nbytes) +
           " bytes but the buffer holds " + std::to_string(buffer_bytes);
  }
  return "";
}

template <CodecId C>
ffi::Error DecodeImpl(cudaStream_t stream, ffi::ScratchAllocator scratch,
                      ffi::Buffer<ffi::U8> payload, ffi::BufferR0<ffi::S32> nbytes_arg,
                      ffi::Result<ffi::AnyBuffer> y) {
  const std::string name = Name(C, false);
  DTypeId d;
  ffi::Error err = CheckDType(name, y->element_type(), &d);
  if (!err.success()) return err;
  const uint64_t n = y->element_count();
  const uint64_t buffer_bytes = payload.element_count();
  const uint8_t* in = payload.typed_data();
  if (buffer_bytes < kHeaderBytes) {
    return ffi::Error::InvalidArgument(name + ": cannot decode: truncated: the buffer holds " +
                                       std::to_string(buffer_bytes) +
                                       " bytes, less than the 32-byte header");
  }
  // The header and nbytes, to the host.
  uint8_t head[kHeaderBytes];
  int32_t claimed = 0;
  JAXCC_CUDA(name, cudaMemcpyAsync(head, in, kHeaderBytes, cudaMemcpyDeviceToHost, stream));
  JAXCC_CUDA(name, cudaMemcpyAsync(&claimed, nbytes_arg.typed_data(), sizeof(int32_t),
                                   cudaMemcpyDeviceToHost, stream));
  JAXCC_CUDA(name, cudaStreamSynchronize(stream));
  const std::string bad = CheckHeader(head, buffer_bytes, claimed, C, d, n);
  if (!bad.empty()) return ffi::Error::InvalidArgument(name + ": cannot decode: " + bad);
  const uint64_t nbytes = static_cast<uint64_t>(claimed);
  // Device words: status, spill total (fixed), checksum sums, nbytes.
  std::optional<uint8_t*> buf = Allocate(scratch, 512);
  if (!buf) return NoScratch(name, 512);
  Carver carve{*buf};
  uint32_t* words = carve.Take<uint32_t>(4);
  uint64_t* dev_nbytes = carve.Take<uint64_t>(1);
  JAXCC_CUDA(name, cudaMemsetAsync(words, 0, 4 * sizeof(uint32_t), stream));
  JAXCC_CUDA(name, cudaMemcpyAsync(dev_nbytes, &nbytes, sizeof(uint64_t), cudaMemcpyHostToDevice,
                                   stream));
  err = SumChecksum(name, stream, in, dev_nbytes, nbytes, words + 2);
  if (err.failure()) return err;
  void* dst = y->untyped_data();
  if constexpr (C == kFixed) {
    switch (d) {
      case kBF16: err = DecodeFixedOn<kBF16>(name, stream, scratch, in, nbytes, n, dst, words); break;
      case kF16: err = DecodeFixedOn<kF16>(name, stream, scratch, in, nbytes, n, dst, words); break;
      default: err = DecodeFixedOn<kF32>(name, stream, scratch, in, nbytes, n, dst, words); break;
    }
  } else {
    switch (d) {
      case kBF16: err = DecodeEntropyOn<kBF16>(name, stream, scratch, in, nbytes, n, dst, words); break;
      case kF16: err = DecodeEntropyOn<kF16>(name, stream, scratch, in, nbytes, n, dst, words); break;
      default: err = DecodeEntropyOn<kF32>(name, stream, scratch, in, nbytes, n, dst, words); break;
    }
  }
  if (err.failure()) return err;
  uint32_t host[4];
  JAXCC_CUDA(name, cudaMemcpyAsync(host, words, sizeof(host), cudaMemcpyDeviceToHost, stream));
  JAXCC_CUDA(name, cudaStreamSynchronize(stream));
  Header h;
  ReadHeader(head, &h);
  if (host[2] != h.sum_a || host[3] != h.sum_b) {
    return ffi::Error::InvalidArgument(name + ": cannot decode: checksum mismatch: the data is corrupted");
  }
  if (host[0] != kOk) {
    return ffi::Error::InvalidArgument(name + ": cannot decode: " + StatusText(host[0]));
  }
  if constexpr (C == kFixed) {
    const FixedLayout l = MakeFixedLayout(d, n);
    const uint64_t expected = std::max(l.static_bytes, l.spill + host[1]);
    if (nbytes != expected) {
      return ffi::Error::InvalidArgument(name + ": cannot decode: size mismatch: " +
                                         std::to_string(nbytes) + " bytes, the blocks need " +
                                         std::to_string(expected));
    }
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace codec
}  // namespace jaxcc

#define JAXCC_CODEC_CUDA_HANDLERS(Name, Codec)                                                   \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxccCodecEncode##Name##Cuda, jaxcc::codec::EncodeImpl<Codec>,   \
                                ffi::Ffi::Bind()                                                 \
                                    .Ctx<ffi::PlatformStream<cudaStream_t>>()  /* stream */      \
                                    .Ctx<ffi::ScratchAllocator>()              /* scratch */     \
                                    .Arg<ffi::AnyBuffer>()                     /* x */           \
                                    .Ret<ffi::Buffer<ffi::U8>>()               /* payload */     \
                                    .Ret<ffi::BufferR0<ffi::S32>>());          /* nbytes */      \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxccCodecDecode##Name##Cuda, jaxcc::codec::DecodeImpl<Codec>,   \
                                ffi::Ffi::Bind()                                                 \
                                    .Ctx<ffi::PlatformStream<cudaStream_t>>()  /* stream */      \
                                    .Ctx<ffi::ScratchAllocator>()              /* scratch */     \
                                    .Arg<ffi::Buffer<ffi::U8>>()               /* payload */     \
                                    .Arg<ffi::BufferR0<ffi::S32>>()            /* nbytes */      \
                                    .Ret<ffi::AnyBuffer>())                    /* y */

JAXCC_CODEC_CUDA_HANDLERS(Fixed, jaxcc::codec::kFixed);
JAXCC_CODEC_CUDA_HANDLERS(Entropy, jaxcc::codec::kEntropy);
