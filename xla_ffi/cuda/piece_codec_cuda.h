// Segmented pieces (jaxcc/piece_layout.h) on the GPU, for the Nccl
// transport's coded steps (collective.cu): encode, decode and the fused
// reduce hop, everything enqueued on one stream; the kernels are in
// codec_fixed.cu and codec_entropy.cu, the segment headers in piece_codec.cu.
#ifndef JAXCC_CUDA_PIECE_CODEC_CUDA_H_
#define JAXCC_CUDA_PIECE_CODEC_CUDA_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "jaxcc/codec.h"
#include "jaxcc/piece_layout.h"
#include "xla/ffi/api/ffi.h"

namespace jaxcc {
namespace piece {

// own = own (with `sum`) + the k received pieces `inputs` (host records)
// decoded, in that order, by jaxcc_reduce's contract (accumulator type, one
// rounding; k = 1 without `sum` is a copy of the decoded bits); then, with
// `out` (MaxPieceBytes(n) bytes), own encoded there, its segment sizes into
// `sizes` and their starts and total into `offsets` (device arrays). `work`
// holds HopWorkLayout(c, d, n, k, sum, out != nullptr).bytes. k = 0 encodes
// own. Decoding failures go to each input's status word. `records`: host
// memory for k HopInput that the device copies from; pinned memory must stay
// untouched until the stream has run the hop, pageable memory makes the copy
// wait for the stream (so never pageable while the stream may wait on a peer).
//   "fixed": each piece's segment checks and spill offsets, then ONE kernel
//     that decodes every piece's block, sums and writes own, and plans the
//     block's encoding; the encoding's offsets, bytes and headers follow.
//   "entropy": the pieces decoded one after another, one jaxcc_reduce
//     launch, then the encoder.
xla::ffi::Error HopOnStream(const std::string& name, cudaStream_t stream,
                            xla::ffi::ScratchAllocator& scratch, codec::CodecId c,
                            codec::DTypeId d, const HopInput* inputs, HopInput* records,
                            uint32_t k, bool sum, void* own, uint64_t n, uint8_t* work,
                            uint8_t* out, uint32_t* sizes, uint64_t* offsets);

// What a status word says (codec_cuda.h: Status).
std::string StatusMessage(uint32_t status);

}  // namespace piece
}  // namespace jaxcc

#endif  // JAXCC_CUDA_PIECE_CODEC_CUDA_H_
