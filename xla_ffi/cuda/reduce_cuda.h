// jaxcc_reduce's CUDA kernels (reduce.cu) for other CUDA handlers.
#ifndef JAXCC_CUDA_REDUCE_CUDA_H_
#define JAXCC_CUDA_REDUCE_CUDA_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "jaxcc/reduce.h"
#include "xla/ffi/api/ffi.h"

namespace jaxcc {

// out = the sum (or max / min fold, `op`) of `inputs` (each n elements of
// `dtype`) in order, by the contract of jaxcc/reduce.h, enqueued on `stream`;
// out may be inputs[0]. Scratch is needed only for more than 64 inputs.
xla::ffi::Error ReduceOnCudaStream(cudaStream_t stream, xla::ffi::ScratchAllocator& scratch,
                                   xla::ffi::DataType dtype,
                                   const std::vector<const void*>& inputs, void* out, size_t n,
                                   ReduceOp op = ReduceOp::kSum);

}  // namespace jaxcc

#endif  // JAXCC_CUDA_REDUCE_CUDA_H_
