// The CPU reduction kernel of jaxcc_reduce, for other CPU handlers (the
// schedule interpreter sums received pieces with it, so both executors add in
// the same order with the same code).
#ifndef JAXCC_CPU_REDUCE_HOST_H_
#define JAXCC_CPU_REDUCE_HOST_H_

#include <cstddef>

#include "xla/ffi/api/ffi.h"

namespace jaxcc {

// out = ((inputs[0] + inputs[1]) + ...) + inputs[k-1], n elements of `dtype`,
// as jaxcc_reduce computes it; `out` may be one of the inputs.
xla::ffi::Error ReduceOnHost(xla::ffi::DataType dtype, const void* const* inputs, size_t k,
                             void* out, size_t n);

}  // namespace jaxcc

#endif  // JAXCC_CPU_REDUCE_HOST_H_
