// The checksum and header of every encoding (jaxcc/codec.h) on the GPU: a
// grid-stride sum of the words, and the header written by one thread.
#include <cub/cub.cuh>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "codec_cuda.h"
#include "jaxcc/codec.h"
#include "xla/ffi/api/ffi.h"

namespace jaxcc {
namespace codec {
namespace {

// sums[0..1] += checksum of data[0, *nbytes) (words 6 and 7 left out).
__global__ void ChecksumKernel(const uint8_t* data, const uint64_t* nbytes, uint32_t* sums) {
  const uint64_t n = *nbytes;
  const uint64_t words = CeilDiv(n, 4);
  Checksum c;
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < words;
       i += uint64_t{gridDim.x} * blockDim.x) {
    ChecksumAdd(&c, ChecksumWord(data, n, i), i);
  }
  using Reduce = cub::BlockReduce<uint32_t, kThreads>;
  __shared__ typename Reduce::TempStorage ta, tb;
  const uint32_t a = Reduce(ta).Sum(c.a);
  const uint32_t b = Reduce(tb).Sum(c.b);
  if (threadIdx.x == 0) {
    atomicAdd(&sums[0], a);
    atomicAdd(&sums[1], b);
  }
}

__global__ void HeaderKernel(uint8_t* out, uint8_t codec, uint8_t dtype, uint8_t block_log2,
                             uint64_t n, const uint64_t* nbytes, const uint32_t* sums,
                             int32_t* nbytes_out) {
  Header h;
  h.codec = codec;
  h.dtype = dtype;
  h.block_log2 = block_log2;
  h.count = n;
  h.nbytes = *nbytes;
  h.sum_a = sums[0];
  h.sum_b = sums[1];
  WriteHeader(out, h);
  *nbytes_out = static_cast<int32_t>(h.nbytes);
}

int ChecksumBlocks(uint64_t bytes) {
  return static_cast<int>(
      Min<uint64_t>(std::max<uint64_t>(CeilDiv(bytes, 4 * kThreads * 8), 1), 4096));
}

}  // namespace

ffi::Error ExclusiveScan(const std::string& name, cudaStream_t stream,
                         ffi::ScratchAllocator& scratch, const uint32_t* in, uint32_t* out,
                         uint64_t count) {
  size_t temp = 0;
  JAXCC_CUDA(name, cub::DeviceScan::ExclusiveSum(nullptr, temp, in, out, count + 1, stream));
  std::optional<uint8_t*> buf = Allocate(scratch, temp);
  if (!buf) return ffi::Error(ffi::ErrorCode::kResourceExhausted, name + ": no scratch for a scan");
  JAXCC_CUDA(name, cub::DeviceScan::ExclusiveSum(*buf, temp, in, out, count + 1, stream));
  return ffi::Error::Success();
}

ffi::Error SumChecksum(const std::string& name, cudaStream_t stream, const uint8_t* data,
                       const uint64_t* nbytes, uint64_t max_bytes, uint32_t* sums) {
  ChecksumKernel<<<ChecksumBlocks(max_bytes), kThreads, 0, stream>>>(data, nbytes, sums);
  JAXCC_LAUNCHED(name);
  return ffi::Error::Success();
}

ffi::Error Finish(const std::string& name, cudaStream_t stream, uint8_t* out, CodecId codec,
                  DTypeId dtype, uint64_t n, uint64_t max_bytes, const uint64_t* nbytes,
                  uint32_t* sums, int32_t* nbytes_out) {
  const int block_log2 = codec == kFixed ? kFixedBlockLog2 : kEntropyBlockLog2;
  JAXCC_CUDA(name, cudaMemsetAsync(sums, 0, 2 * sizeof(uint32_t), stream));
  HeaderKernel<<<1, 1, 0, stream>>>(out, codec, dtype, block_log2, n, nbytes, sums, nbytes_out);
  JAXCC_LAUNCHED(name);
  ffi::Error err = SumChecksum(name, stream, out, nbytes, max_bytes, sums);
  if (err.failure()) return err;
  HeaderKernel<<<1, 1, 0, stream>>>(out, codec, dtype, block_log2, n, nbytes, sums, nbytes_out);
  JAXCC_LAUNCHED(name);
  return ffi::Error::Success();
}

}  // namespace codec
}  // namespace jaxcc
