// Segmented pieces on the GPU (piece_codec_cuda.h): the segments' offsets,
// headers and checks, HopOnStream, and the handlers jaxcc_piece_encode and
// jaxcc_piece_hop that run one encode or hop alone (tests/gpu/check_piece.py
// compares them with the CPU's piece codec).
#include <cub/cub.cuh>
#include <cuda_runtime.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "codec_cuda.h"
#include "jaxcc/codec.h"
#include "jaxcc/codec_ffi.h"
#include "jaxcc/piece_layout.h"
#include "piece_codec_cuda.h"
#include "reduce_cuda.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jaxcc {
namespace codec {
namespace {

// offsets[0..count]: the exclusive sums of sizes, the total last (one block).
__global__ void __launch_bounds__(kThreads)
    ScanSegmentsKernel(const uint32_t* sizes, uint64_t count, uint64_t* offsets) {
  using Scan = cub::BlockScan<uint64_t, kThreads>;
  __shared__ typename Scan::TempStorage temp;
  uint64_t carry = 0;
  for (uint64_t first = 0; first < count; first += kThreads) {
    const uint64_t s = first + threadIdx.x;
    uint64_t at, total;
    Scan(temp).ExclusiveSum(s < count ? uint64_t{sizes[s]} : 0, at, total);
    if (s < count) offsets[s] = carry + at;
    carry += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) offsets[count] = carry;
}

// The checksum of the `nbytes` at seg (the block's threads sum the words).
__device__ inline Checksum SegmentChecksum(const uint8_t* seg, uint64_t nbytes) {
  Checksum c;
  for (uint64_t i = threadIdx.x; i < CeilDiv(nbytes, 4); i += kThreads) {
    ChecksumAdd(&c, ChecksumWord(seg, nbytes, i), i);
  }
  using Reduce = cub::BlockReduce<uint32_t, kThreads>;
  __shared__ typename Reduce::TempStorage ta, tb;
  const uint32_t a = Reduce(ta).Sum(c.a);
  const uint32_t b = Reduce(tb).Sum(c.b);
  return {a, b};  // valid in thread 0
}

// Writes segment s's header at out + offsets[s] (one block per segment).
__global__ void __launch_bounds__(kThreads)
    FinishSegmentsKernel(uint8_t* out, const uint64_t* offsets, uint8_t codec, uint8_t dtype,
                         uint8_t block_log2, uint64_t n) {
  const uint64_t s = blockIdx.x;
  uint8_t* seg = out + offsets[s];
  Header h;
  h.codec = codec;
  h.dtype = dtype;
  h.block_log2 = block_log2;
  h.count = piece::SegmentLength(n, s);
  h.nbytes = offsets[s + 1] - offsets[s];
  if (threadIdx.x == 0) WriteHeader(seg, h);
  __syncthreads();
  const Checksum c = SegmentChecksum(seg, h.nbytes);
  if (threadIdx.x == 0) {
    Store32(seg + kChecksumOffset, c.a);
    Store32(seg + kChecksumOffset + 4, c.b);
  }
}

// Checks segment s of a received piece: its header names this codec, dtype,
// block size and length and the announced size, and its checksum matches.
__global__ void __launch_bounds__(kThreads)
    CheckSegmentsKernel(piece::HopInput in, uint8_t codec, uint8_t dtype, uint8_t block_log2,
                        uint64_t n) {
  const uint64_t s = blockIdx.x;
  const uint8_t* seg = in.data + in.offsets[s];
  const uint64_t nbytes = in.offsets[s + 1] - in.offsets[s];
  Header h;
  const bool ok = nbytes >= kHeaderBytes && ReadHeader(seg, &h) && h.codec == codec &&
                  h.dtype == dtype && h.block_log2 == block_log2 &&
                  h.count == piece::SegmentLength(n, s) && h.nbytes == nbytes;
  if (!ok) {
    if (threadIdx.x == 0) Fail(in.status, kBadHeader);
    return;
  }
  const Checksum c = SegmentChecksum(seg, nbytes);
  if (threadIdx.x == 0 && (c.a != h.sum_a || c.b != h.sum_b)) Fail(in.status, kBadChecksum);
}

uint8_t BlockLog2(CodecId c) { return c == kFixed ? kFixedBlockLog2 : kEntropyBlockLog2; }

}  // namespace

ffi::Error ScanSegments(const std::string& name, cudaStream_t stream, const uint32_t* sizes,
                        uint64_t segments, uint64_t* offsets) {
  ScanSegmentsKernel<<<1, kThreads, 0, stream>>>(sizes, segments, offsets);
  JAXCC_LAUNCHED(name);
  return ffi::Error::Success();
}

ffi::Error FinishSegments(const std::string& name, cudaStream_t stream, uint8_t* out,
                          const uint64_t* offsets, CodecId c, DTypeId d, uint64_t n) {
  if (piece::Segments(n) == 0) return ffi::Error::Success();
  FinishSegmentsKernel<<<piece::Segments(n), kThreads, 0, stream>>>(out, offsets, c, d,
                                                                    BlockLog2(c), n);
  JAXCC_LAUNCHED(name);
  return ffi::Error::Success();
}

ffi::Error CheckSegments(const std::string& name, cudaStream_t stream, const piece::HopInput& in,
                         CodecId c, DTypeId d, uint64_t n) {
  if (piece::Segments(n) == 0) return ffi::Error::Success();
  CheckSegmentsKernel<<<piece::Segments(n), kThreads, 0, stream>>>(in, c, d, BlockLog2(c), n);
  JAXCC_LAUNCHED(name);
  return ffi::Error::Success();
}

namespace {

ffi::DataType FfiType(DTypeId d) {
  for (const CodecType& t : kCodecTypes) {
    if (t.id == d) return t.type;
  }
  return ffi::F32;
}

template <DTypeId D>
ffi::Error Hop(const std::string& name, cudaStream_t stream, ffi::ScratchAllocator& scratch,
               CodecId c, const piece::HopInput* inputs, piece::HopInput* records, uint32_t k,
               bool sum, void* own, uint64_t n, uint8_t* work, uint8_t* out, uint32_t* sizes,
               uint64_t* offsets) {
  const piece::HopWork w = piece::HopWorkLayout(c, D, n, k, sum, out != nullptr);
  for (uint32_t i = 0; i < k; ++i) {
    ffi::Error err = CheckSegments(name, stream, inputs[i], c, D, n);
    if (err.failure()) return err;
  }
  if (c == kFixed) {
    return FixedPieceHopOn<D>(name, stream, inputs, records, k, sum, own, n, work, w, out, sizes,
                              offsets);
  }
  const size_t itemsize = Info(D).elem_bytes;
  std::vector<const void*> terms{own};
  for (uint32_t i = 0; i < k; ++i) {
    void* into = sum ? work + w.decoded + i * n * itemsize : own;
    ffi::Error err = EntropyPieceDecodeOn<D>(name, stream, inputs[i], n, work, w, into);
    if (err.failure()) return err;
    terms.push_back(into);
  }
  if (sum && k > 0) {
    ffi::Error err = ReduceOnCudaStream(stream, scratch, FfiType(D), terms, own, n);
    if (err.failure()) return err;
  }
  if (out == nullptr) return ffi::Error::Success();
  return EntropyPieceEncodeOn<D>(name, stream, own, n, work, w, out, sizes, offsets);
}

}  // namespace
}  // namespace codec

namespace piece {

ffi::Error HopOnStream(const std::string& name, cudaStream_t stream,
                       ffi::ScratchAllocator& scratch, codec::CodecId c, codec::DTypeId d,
                       const HopInput* inputs, HopInput* records, uint32_t k, bool sum,
                       void* own, uint64_t n, uint8_t* work, uint8_t* out, uint32_t* sizes,
                       uint64_t* offsets) {
  switch (d) {
    case codec::kBF16:
      return codec::Hop<codec::kBF16>(name, stream, scratch, c, inputs, records, k, sum, own, n,
                                      work, out, sizes, offsets);
    case codec::kF16:
      return codec::Hop<codec::kF16>(name, stream, scratch, c, inputs, records, k, sum, own, n,
                                     work, out, sizes, offsets);
    default:
      return codec::Hop<codec::kF32>(name, stream, scratch, c, inputs, records, k, sum, own, n,
                                     work, out, sizes, offsets);
  }
}

std::string StatusMessage(uint32_t status) { return codec::StatusText(status); }

}  // namespace piece

// --- the handlers ----------------------------------------------------------------

namespace codec {
namespace {

// The codec and dtype of a handler's attributes and operand, or an error.
ffi::Error PieceArgs(const std::string& name, int64_t codec, ffi::DataType type, CodecId* c,
                     DTypeId* d) {
  if (codec != kFixed && codec != kEntropy) {
    return ffi::Error::InvalidArgument(name + ": unknown codec id " + std::to_string(codec));
  }
  *c = static_cast<CodecId>(codec);
  return CheckDType(name, type, d);
}

ffi::Error PieceEncodeImpl(cudaStream_t stream, ffi::ScratchAllocator scratch, ffi::AnyBuffer x,
                           ffi::Result<ffi::Buffer<ffi::U8>> payload,
                           ffi::Result<ffi::Buffer<ffi::U32>> sizes, int64_t codec) {
  const std::string name = "jaxcc_piece_encode";
  CodecId c;
  DTypeId d;
  ffi::Error err = PieceArgs(name, codec, x.element_type(), &c, &d);
  if (err.failure()) return err;
  const uint64_t n = x.element_count();
  if (payload->element_count() < piece::MaxPieceBytes(c, d, n) ||
      sizes->element_count() < piece::Segments(n)) {
    return ffi::Error::InvalidArgument(name + ": the payload or sizes buffer is too small");
  }
  const piece::HopWork w = piece::HopWorkLayout(c, d, n, 0, false, true);
  piece::Areas areas{w.bytes};
  const uint64_t offsets_at = areas.Take(8 * (piece::Segments(n) + 1));
  std::optional<uint8_t*> work = Allocate(scratch, areas.bytes);
  if (!work) return NoScratch(name, areas.bytes);
  auto* offsets = reinterpret_cast<uint64_t*>(*work + offsets_at);
  return piece::HopOnStream(name, stream, scratch, c, d, nullptr, nullptr, 0, false,
                            x.untyped_data(), n, *work, payload->typed_data(),
                            sizes->typed_data(), offsets);
}

// own + pieces (k rows of the payload buffer, each announced by its row of
// segment sizes), or with sum = 0 the one piece decoded; with encode the
// result encoded. Synchronises with the host twice: to read the announced
// sizes and to read the decoding status.
ffi::Error PieceHopImpl(cudaStream_t stream, ffi::ScratchAllocator scratch, ffi::AnyBuffer own,
                        ffi::Buffer<ffi::U8> pieces, ffi::Buffer<ffi::U32> announced,
                        ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::Buffer<ffi::U8>> payload,
                        ffi::Result<ffi::Buffer<ffi::U32>> sizes, int64_t codec, int64_t sum,
                        int64_t encode) {
  const std::string name = "jaxcc_piece_hop";
  CodecId c;
  DTypeId d;
  ffi::Error err = PieceArgs(name, codec, own.element_type(), &c, &d);
  if (err.failure()) return err;
  const uint64_t n = own.element_count();
  const uint64_t segments = piece::Segments(n);
  const auto dims = pieces.dimensions();
  if (dims.size() != 2 || announced.dimensions().size() != 2 ||
      announced.dimensions()[0] != dims[0] ||
      static_cast<uint64_t>(announced.dimensions()[1]) != segments) {
    return ffi::Error::InvalidArgument(name + ": pieces must be (k, bytes) and sizes (k, " +
                                       std::to_string(segments) + ")");
  }
  const uint32_t k = static_cast<uint32_t>(dims[0]);
  const uint64_t cap = static_cast<uint64_t>(dims[1]);
  if ((sum == 0 && k != 1) || payload->element_count() < piece::MaxPieceBytes(c, d, n) ||
      sizes->element_count() < segments) {
    return ffi::Error::InvalidArgument(name + ": a decode takes one piece, and the payload and "
                                       "sizes must hold an encoding");
  }
  std::vector<uint32_t> host_sizes(k * segments);
  JAXCC_CUDA(name, cudaMemcpyAsync(host_sizes.data(), announced.typed_data(),
                                   host_sizes.size() * 4, cudaMemcpyDeviceToHost, stream));
  JAXCC_CUDA(name, cudaStreamSynchronize(stream));
  std::vector<uint64_t> host_offsets(k * (segments + 1));
  for (uint32_t i = 0; i < k; ++i) {
    uint64_t* at = host_offsets.data() + i * (segments + 1);
    const std::string bad = piece::SegmentOffsets(c, d, n, host_sizes.data() + i * segments, cap,
                                                  at, at + segments);
    if (!bad.empty()) {
      return ffi::Error::InvalidArgument(name + ": piece " + std::to_string(i) + ": " + bad);
    }
  }
  const piece::HopWork w = piece::HopWorkLayout(c, d, n, k, sum != 0, encode != 0);
  piece::Areas areas{w.bytes};
  const uint64_t offsets_at = areas.Take(8 * host_offsets.size());
  const uint64_t status_at = areas.Take(4 * k);
  const uint64_t out_offsets_at = areas.Take(8 * (segments + 1));
  std::optional<uint8_t*> work = Allocate(scratch, areas.bytes);
  if (!work) return NoScratch(name, areas.bytes);
  auto* dev_offsets = reinterpret_cast<uint64_t*>(*work + offsets_at);
  auto* status = reinterpret_cast<uint32_t*>(*work + status_at);
  JAXCC_CUDA(name, cudaMemcpyAsync(dev_offsets, host_offsets.data(), host_offsets.size() * 8,
                                   cudaMemcpyHostToDevice, stream));
  JAXCC_CUDA(name, cudaMemsetAsync(status, 0, 4 * k, stream));
  std::vector<piece::HopInput> inputs(k);
  for (uint32_t i = 0; i < k; ++i) {
    inputs[i] = {pieces.typed_data() + i * cap, dev_offsets + i * (segments + 1), nullptr,
                 status + i};
  }
  const size_t bytes_of_own = n * Info(d).elem_bytes;
  if (sum != 0 && bytes_of_own > 0) {
    JAXCC_CUDA(name, cudaMemcpyAsync(y->untyped_data(), own.untyped_data(), bytes_of_own,
                                     cudaMemcpyDeviceToDevice, stream));
  }
  std::vector<piece::HopInput> records(k);  // pageable: each copy waits (nothing else runs)
  err = piece::HopOnStream(name, stream, scratch, c, d, inputs.data(), records.data(), k,
                           sum != 0, y->untyped_data(), n, *work,
                           encode ? payload->typed_data() : nullptr,
                           sizes->typed_data(),
                           reinterpret_cast<uint64_t*>(*work + out_offsets_at));
  if (err.failure()) return err;
  std::vector<uint32_t> failed(k);
  JAXCC_CUDA(name, cudaMemcpyAsync(failed.data(), status, 4 * k, cudaMemcpyDeviceToHost, stream));
  JAXCC_CUDA(name, cudaStreamSynchronize(stream));
  for (uint32_t i = 0; i < k; ++i) {
    if (failed[i] != kOk) {
      return ffi::Error::InvalidArgument(name + ": piece " + std::to_string(i) +
                                         " does not decode: " + StatusText(failed[i]));
    }
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace codec
}  // namespace jaxcc

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxccPieceEncodeCuda, jaxcc::codec::PieceEncodeImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::ScratchAllocator>()
                                  .Arg<ffi::AnyBuffer>()             // x: the piece's elements
                                  .Ret<ffi::Buffer<ffi::U8>>()       // payload
                                  .Ret<ffi::Buffer<ffi::U32>>()      // sizes: one per segment
                                  .Attr<int64_t>("codec"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxccPieceHopCuda, jaxcc::codec::PieceHopImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::ScratchAllocator>()
                                  .Arg<ffi::AnyBuffer>()             // own
                                  .Arg<ffi::Buffer<ffi::U8>>()       // pieces: (k, bytes)
                                  .Arg<ffi::Buffer<ffi::U32>>()      // their segment sizes
                                  .Ret<ffi::AnyBuffer>()             // y: the sum (or decode)
                                  .Ret<ffi::Buffer<ffi::U8>>()       // payload: y encoded
                                  .Ret<ffi::Buffer<ffi::U32>>()      // its segment sizes
                                  .Attr<int64_t>("codec")
                                  .Attr<int64_t>("sum")
                                  .Attr<int64_t>("encode"));
