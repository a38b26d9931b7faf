// The reduction contract shared by the CPU and CUDA handlers of jaxcc_reduce.
//
//   out[i] = round(((in[0][i] + in[1][i]) + in[2][i]) + ... + in[k-1][i])
//
// The k inputs are added in the given order, in the accumulator type (f32 for
// bf16/f16/f32, f64 for f64, the integer type itself for integers), and the
// sum is rounded to the element type once, at the end. Integer sums wrap in
// two's complement, like XLA. k == 1 is a copy (no conversion round trip, so
// even signalling NaNs keep their bits). A NaN sum is the first NaN met in
// that order, quieted. Adds follow the calling thread's FPU mode: XLA:CPU
// flushes subnormal operands and results of arithmetic (not of conversions) on
// the threads that run handlers, and so does this code.
//
// Per element: ToAccumulator, AccumulatorAdd and FromAccumulator, shared by
// the CPU and CUDA kernels. The pure-JAX twin (jaxcc/_src/reduce.py:
// reduce_sum_reference) does the same operations in the same order, so the two
// are bit-identical.
#ifndef JAXCC_REDUCE_H_
#define JAXCC_REDUCE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "jaxcc/dtypes.h"
#include "xla/ffi/api/ffi.h"

namespace jaxcc {

// a + b in the accumulator type A. Integers are added as their unsigned
// counterparts, so overflow wraps instead of being undefined behaviour.
//
// Floats: IEEE 754 leaves open which NaN a sum of two NaNs returns; the
// contract says the first operand, quieted. The host code spells that out
// because compilers (XLA's too) may swap the operands of a commutative add;
// with one NaN operand, or none, the order does not matter. On the GPU every
// NaN sum is the canonical NaN, in the kernel and in XLA alike.
template <typename A>
JAXCC_HD inline A AccumulatorAdd(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
#ifdef __CUDA_ARCH__
    return a + b;
#else
    const A sum = a + b;
    return a != a ? QuietNaN(a) : sum;
#endif
  }
}

// ---------------------------------------------------------------------------
// Handler side (host code, shared by the CPU and CUDA handlers).
// ---------------------------------------------------------------------------

template <typename T>
struct TypeTag {
  using Type = T;
};

// The element types jaxcc_reduce sums, in DispatchReduceType's order (the
// Python side's jaxcc._src.reduce.REDUCIBLE_DTYPES; jaxcc/_src/ffi.py
// compares the two when it loads the module).
constexpr xla::ffi::DataType kReducibleTypes[] = {
    xla::ffi::F32, xla::ffi::BF16, xla::ffi::F16, xla::ffi::F64, xla::ffi::S32,
    xla::ffi::S64, xla::ffi::U32,  xla::ffi::U8,  xla::ffi::S8};

// Calls fn(TypeTag<T>{}) for the element type T of `dtype`, or returns
// InvalidArgument naming the dtype if jaxcc_reduce does not support it.
template <typename Fn>
xla::ffi::Error DispatchReduceType(xla::ffi::DataType dtype, Fn&& fn) {
  namespace ffi = xla::ffi;
  switch (dtype) {
    case ffi::F32: return fn(TypeTag<float>{});
    case ffi::BF16: return fn(TypeTag<BFloat16>{});
    case ffi::F16: return fn(TypeTag<Float16>{});
    case ffi::F64: return fn(TypeTag<double>{});
    case ffi::S32: return fn(TypeTag<int32_t>{});
    case ffi::S64: return fn(TypeTag<int64_t>{});
    case ffi::U32: return fn(TypeTag<uint32_t>{});
    case ffi::U8: return fn(TypeTag<uint8_t>{});
    case ffi::S8: return fn(TypeTag<int8_t>{});
    default: {
      std::string supported;
      for (ffi::DataType t : kReducibleTypes) {
        supported += (supported.empty() ? "" : ", ") + DataTypeName(t);
      }
      return ffi::Error::InvalidArgument("jaxcc_reduce: unsupported dtype " +
                                         DataTypeName(dtype) + " (supported: " + supported + ")");
    }
  }
}

// The validated operands of one jaxcc_reduce call.
struct ReduceArgs {
  std::vector<const void*> inputs;  // k >= 1 device/host pointers
  size_t element_count = 0;
};

// Checks that there is at least one input and that every input has the
// result's dtype and shape.
inline xla::ffi::ErrorOr<ReduceArgs> ParseReduceArgs(const xla::ffi::RemainingArgs& args,
                                                     const xla::ffi::AnyBuffer& out) {
  namespace ffi = xla::ffi;
  if (args.size() == 0) {
    return ffi::Unexpected(ffi::Error::InvalidArgument("jaxcc_reduce: needs at least one input"));
  }
  ReduceArgs parsed;
  parsed.element_count = out.element_count();
  parsed.inputs.reserve(args.size());
  const auto out_dims = out.dimensions();
  for (size_t j = 0; j < args.size(); ++j) {
    ffi::ErrorOr<ffi::AnyBuffer> in = args.get<ffi::AnyBuffer>(j);
    if (!in.has_value()) return ffi::Unexpected(in.error());
    if (in->element_type() != out.element_type()) {
      return ffi::Unexpected(ffi::Error::InvalidArgument(
          "jaxcc_reduce: input " + std::to_string(j) + " has dtype " +
          DataTypeName(in->element_type()) + " but the result has dtype " +
          DataTypeName(out.element_type()) + "; all inputs must have the same dtype"));
    }
    if (!(in->dimensions() == out_dims)) {
      return ffi::Unexpected(ffi::Error::InvalidArgument(
          "jaxcc_reduce: input " + std::to_string(j) +
          " has a different shape from the result; all inputs must have the same shape"));
    }
    parsed.inputs.push_back(in->untyped_data());
  }
  return parsed;
}

}  // namespace jaxcc

#endif  // JAXCC_REDUCE_H_
