// The reduction contract shared by the CPU and CUDA handlers of jaxcc_reduce.
//
// op = sum:
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
// op = max / min: XLA:CPU's all-reduce fold, in the given order, in the
// accumulator type:
//   a = lowest (max) or highest (min) value of the type (-inf / +inf for floats)
//   a = a < in[j][i] ? in[j][i] : a      (max; min: in[j][i] < a ? in[j][i] : a)
//   out[i] = round(a)
// So NaNs are skipped (all NaN gives the fold's start, -inf for max), of
// equal values (-0.0 and +0.0) the first wins, and on the CPU a subnormal f32
// (or bf16, as f32) result is flushed to zero where the thread flushes them
// (XLA:CPU's threads do: the compare-select is one max/min instruction).
// k == 1 is a copy here too (XLA drops an all-reduce of one rank).
//
// Per element: ToAccumulator, AccumulatorCombine and FromAccumulator, shared by
// the CPU and CUDA kernels. The pure-JAX twin (jaxcc/_src/reduce.py:
// reduce_reference) does the same operations in the same order, so the two
// are bit-identical.
#ifndef JAXCC_REDUCE_H_
#define JAXCC_REDUCE_H_

#include <cmath>
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

// The reduction of jaxcc_reduce's `op` attribute.
enum class ReduceOp : int64_t { kSum = 0, kMax = 1, kMin = 2 };

// The start of the max / min fold: the lowest (kMax) or highest (kMin) value of A.
template <ReduceOp kOp, typename A>
JAXCC_HD inline A FoldStart() {
  static_assert(kOp != ReduceOp::kSum, "a sum starts from its first input");
  constexpr bool kMax = kOp == ReduceOp::kMax;
  if constexpr (std::is_floating_point_v<A>) {
    const A inf = static_cast<A>(HUGE_VAL);
    return kMax ? -inf : inf;
  } else if constexpr (std::is_signed_v<A>) {
    using U = std::make_unsigned_t<A>;
    const U top = static_cast<U>(U{1} << (8 * sizeof(A) - 1));
    return static_cast<A>(kMax ? top : static_cast<U>(~top));
  } else {
    return kMax ? A{0} : static_cast<A>(~A{0});
  }
}

// One step of the fold: a + b, or the max / min rule above (a is the running value).
template <ReduceOp kOp, typename A>
JAXCC_HD inline A AccumulatorCombine(A a, A b) {
  if constexpr (kOp == ReduceOp::kSum) {
    return AccumulatorAdd(a, b);
  } else if constexpr (kOp == ReduceOp::kMax) {
    return a < b ? b : a;
  } else {
    return b < a ? b : a;
  }
}

// The running value after the first input x.
template <ReduceOp kOp, typename A>
JAXCC_HD inline A FoldFirst(A x) {
  if constexpr (kOp == ReduceOp::kSum) {
    return x;
  } else {
    return AccumulatorCombine<kOp>(FoldStart<kOp, A>(), x);
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

// Calls fn(std::integral_constant<ReduceOp, op>{}) for the op id `op`, or
// returns InvalidArgument naming `what` if it is not one.
template <typename Fn>
xla::ffi::Error DispatchReduceOp(int64_t op, const std::string& what, Fn&& fn) {
  switch (op) {
    case static_cast<int64_t>(ReduceOp::kSum):
      return fn(std::integral_constant<ReduceOp, ReduceOp::kSum>{});
    case static_cast<int64_t>(ReduceOp::kMax):
      return fn(std::integral_constant<ReduceOp, ReduceOp::kMax>{});
    case static_cast<int64_t>(ReduceOp::kMin):
      return fn(std::integral_constant<ReduceOp, ReduceOp::kMin>{});
    default:
      return xla::ffi::Error::InvalidArgument(what + ": unknown reduction op " +
                                              std::to_string(op) + " (0: sum, 1: max, 2: min)");
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
