// The CPU reduction kernel of jaxcc_reduce, for other CPU handlers (the
// schedule interpreter sums received pieces with it, so both executors add in
// the same order with the same code).
#ifndef JAXCC_CPU_REDUCE_HOST_H_
#define JAXCC_CPU_REDUCE_HOST_H_

#include <cstddef>
#include <cstring>
#include <string>

#include "jaxcc/reduce.h"
#include "jaxcc/transport.h"
#include "xla/ffi/api/ffi.h"

namespace jaxcc {

// out = ((inputs[0] + inputs[1]) + ...) + inputs[k-1], n elements of `dtype`,
// as jaxcc_reduce computes it (or its max / min fold, `op`); `out` may be one
// of the inputs.
xla::ffi::Error ReduceOnHost(xla::ffi::DataType dtype, const void* const* inputs, size_t k,
                             void* out, size_t n, ReduceOp op = ReduceOp::kSum);

// The schedule interpreters' kernels on the host: memmove and ReduceOnHost.
class HostKernels final : public Kernels {
 public:
  explicit HostKernels(xla::ffi::DataType dtype) : dtype_(dtype) {}
  std::string Copy(char* dst, const char* src, size_t bytes) override {
    if (dst != src) std::memmove(dst, src, bytes);
    return "";
  }
  std::string Reduce(const char* const* inputs, size_t k, char* out, size_t n) override {
    xla::ffi::Error err =
        ReduceOnHost(dtype_, reinterpret_cast<const void* const*>(inputs), k, out, n);
    return err.success() ? "" : err.message();
  }

 private:
  xla::ffi::DataType dtype_;
};

}  // namespace jaxcc

#endif  // JAXCC_CPU_REDUCE_HOST_H_
