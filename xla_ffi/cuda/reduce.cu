// jaxcc_reduce on the GPU: the contract of xla_ffi/include/jaxcc/reduce.h
// (sum, max or min: the `op` attribute).
//
// One grid-stride kernel. Input pointers travel by value in the kernel
// parameters (up to kMaxKernelInputs per launch); each thread owns a 16-byte
// chunk of elements and, when every buffer is 16-byte aligned, loads it with
// one vector load per input. For k > kMaxKernelInputs the sum is carried
// across launches in an accumulator-typed scratch buffer, so 16-bit floats are
// still rounded once.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "jaxcc/dtypes.h"
#include "jaxcc/reduce.h"
#include "reduce_cuda.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jaxcc {
namespace {

constexpr int kMaxKernelInputs = 64;  // 512 bytes of kernel parameters
constexpr int kThreads = 256;
constexpr int kMaxBlocks = 4096;  // the grid-stride loop covers the rest

template <typename T>
struct InputPointers {
  const T* ptr[kMaxKernelInputs];
};

// kVec consecutive elements, loaded and stored as one unit.
template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Chunk {
  T v[kVec];
};

// Reduces inputs [0, k) of `in` with kOp, continuing from acc_in if kAccIn,
// into out (rounded, if kFinal) or acc_out. acc_in and acc_out may be the same
// buffer.
template <ReduceOp kOp, typename T, int kVec, bool kAccIn, bool kFinal>
__global__ void __launch_bounds__(kThreads)
    ReduceKernel(const __grid_constant__ InputPointers<T> in, int k,
                 const Accumulator<T>* acc_in, Accumulator<T>* acc_out, T* __restrict__ out,
                 size_t n) {
  using A = Accumulator<T>;
  using V = Chunk<T, kVec>;
  const size_t num_chunks = (n + kVec - 1) / kVec;
  const size_t full_chunks = n / kVec;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t c = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < num_chunks;
       c += stride) {
    const size_t i0 = c * kVec;
    if (c < full_chunks) {
      A acc[kVec];
      const V x0 = reinterpret_cast<const V*>(in.ptr[0])[c];
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        acc[e] = kAccIn ? AccumulatorCombine<kOp>(acc_in[i0 + e], ToAccumulator(x0.v[e]))
                        : FoldFirst<kOp>(ToAccumulator(x0.v[e]));
      }
#pragma unroll 4
      for (int j = 1; j < k; ++j) {
        const V xj = reinterpret_cast<const V*>(in.ptr[j])[c];
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          acc[e] = AccumulatorCombine<kOp>(acc[e], ToAccumulator(xj.v[e]));
        }
      }
      if constexpr (kFinal) {
        V o;
#pragma unroll
        for (int e = 0; e < kVec; ++e) o.v[e] = FromAccumulator<T>(acc[e]);
        reinterpret_cast<V*>(out)[c] = o;
      } else {
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc_out[i0 + e] = acc[e];
      }
    } else {  // the partial last chunk
      for (size_t i = i0; i < n; ++i) {
        A acc = kAccIn ? AccumulatorCombine<kOp>(acc_in[i], ToAccumulator(in.ptr[0][i]))
                       : FoldFirst<kOp>(ToAccumulator(in.ptr[0][i]));
        for (int j = 1; j < k; ++j) {
          acc = AccumulatorCombine<kOp>(acc, ToAccumulator(in.ptr[j][i]));
        }
        if constexpr (kFinal) {
          out[i] = FromAccumulator<T>(acc);
        } else {
          acc_out[i] = acc;
        }
      }
    }
  }
}

ffi::Error CudaError(cudaError_t err, const char* what) {
  return ffi::Error::Internal(std::string("jaxcc_reduce: ") + what + ": " +
                              cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

template <ReduceOp kOp, typename T, int kVec, bool kAccIn, bool kFinal>
ffi::Error Launch(cudaStream_t stream, const InputPointers<T>& in, int k,
                  Accumulator<T>* acc, T* out, size_t n) {
  const size_t num_chunks = (n + kVec - 1) / kVec;
  const int blocks = static_cast<int>(
      std::min<size_t>((num_chunks + kThreads - 1) / kThreads, kMaxBlocks));
  ReduceKernel<kOp, T, kVec, kAccIn, kFinal>
      <<<blocks, kThreads, 0, stream>>>(in, k, acc, acc, out, n);
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? ffi::Error::Success() : CudaError(err, "kernel launch failed");
}

// One pass over inputs [first, first + count).
template <ReduceOp kOp, typename T, int kVec>
ffi::Error LaunchPass(cudaStream_t stream, const std::vector<const void*>& inputs, size_t first,
                      int count, bool acc_in, bool final, Accumulator<T>* acc, T* out, size_t n) {
  InputPointers<T> in{};
  for (int j = 0; j < count; ++j) in.ptr[j] = static_cast<const T*>(inputs[first + j]);
  if (!acc_in) {
    return final ? Launch<kOp, T, kVec, false, true>(stream, in, count, acc, out, n)
                 : Launch<kOp, T, kVec, false, false>(stream, in, count, acc, out, n);
  }
  return final ? Launch<kOp, T, kVec, true, true>(stream, in, count, acc, out, n)
               : Launch<kOp, T, kVec, true, false>(stream, in, count, acc, out, n);
}

template <ReduceOp kOp, typename T>
ffi::Error ReduceOnStream(cudaStream_t stream, ffi::ScratchAllocator& scratch,
                          const std::vector<const void*>& inputs, T* out, size_t n) {
  using A = Accumulator<T>;
  constexpr int kVec = 16 / sizeof(T);
  const size_t k = inputs.size();
  bool aligned = reinterpret_cast<uintptr_t>(out) % 16 == 0;
  for (const void* p : inputs) aligned = aligned && reinterpret_cast<uintptr_t>(p) % 16 == 0;

  A* acc = nullptr;
  if (k > static_cast<size_t>(kMaxKernelInputs)) {
    std::optional<void*> buf = scratch.Allocate(n * sizeof(A), 256);
    if (!buf.has_value() || *buf == nullptr) {
      return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                        "jaxcc_reduce: cannot allocate " + std::to_string(n * sizeof(A)) +
                            " bytes of scratch for " + std::to_string(k) + " inputs");
    }
    acc = static_cast<A*>(*buf);
  }
  for (size_t first = 0; first < k; first += kMaxKernelInputs) {
    const int count = static_cast<int>(std::min<size_t>(kMaxKernelInputs, k - first));
    const bool acc_in = first > 0;
    const bool final = first + count == k;
    ffi::Error err =
        aligned
            ? LaunchPass<kOp, T, kVec>(stream, inputs, first, count, acc_in, final, acc, out, n)
            : LaunchPass<kOp, T, 1>(stream, inputs, first, count, acc_in, final, acc, out, n);
    if (err.failure()) return err;
  }
  return ffi::Error::Success();
}

ffi::Error ReduceImpl(cudaStream_t stream, ffi::ScratchAllocator scratch, ffi::RemainingArgs args,
                      ffi::Result<ffi::AnyBuffer> out, int64_t op) {
  ffi::ErrorOr<ReduceArgs> parsed = ParseReduceArgs(args, *out);
  if (!parsed.has_value()) return parsed.error();
  return ReduceOnCudaStream(stream, scratch, out->element_type(), parsed->inputs,
                            out->untyped_data(), parsed->element_count, static_cast<ReduceOp>(op));
}

}  // namespace
}  // namespace jaxcc

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxccReduceCuda, jaxcc::ReduceImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // stream
                                  .Ctx<ffi::ScratchAllocator>()              // scratch
                                  .RemainingArgs()                           // inputs: k >= 1
                                  .Ret<ffi::AnyBuffer>()                     // out
                                  .Attr<int64_t>("op"));  // 0: sum, 1: max, 2: min

namespace jaxcc {

// Exposed for the CUDA jaxcc_collective (reduce_cuda.h): the same kernels,
// k >= 1 inputs (k == 1 is a copy), on `stream`.
ffi::Error ReduceOnCudaStream(cudaStream_t stream, ffi::ScratchAllocator& scratch,
                              ffi::DataType dtype, const std::vector<const void*>& inputs,
                              void* out, size_t n, ReduceOp op) {
  return DispatchReduceType(dtype, [&](auto tag) {
    using T = typename decltype(tag)::Type;
    return DispatchReduceOp(static_cast<int64_t>(op), "jaxcc_reduce", [&](auto kind) {
      T* dst = static_cast<T*>(out);
      if (n == 0 || inputs.empty()) return ffi::Error::Success();
      if (inputs.size() == 1) {
        if (inputs[0] == out) return ffi::Error::Success();
        const cudaError_t err = cudaMemcpyAsync(dst, inputs[0], n * sizeof(T),
                                                cudaMemcpyDeviceToDevice, stream);
        return err == cudaSuccess ? ffi::Error::Success()
                                  : CudaError(err, "cudaMemcpyAsync failed");
      }
      return ReduceOnStream<decltype(kind)::value, T>(stream, scratch, inputs, dst, n);
    });
  });
}

}  // namespace jaxcc
