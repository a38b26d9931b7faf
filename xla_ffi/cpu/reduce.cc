// jaxcc_reduce on the CPU: out = ((in0 + in1) + ...) + in{k-1}, elementwise,
// accumulated in f32 for 16-bit floats (one rounding at the end), or the max /
// min fold in the same order (`op`). The contract is in
// xla_ffi/include/jaxcc/reduce.h.
//
// The loop is blocked over elements: each block of kBlock elements is summed
// into a small L1-resident accumulator array, up to kGroup inputs per pass, so
// every inner loop is straight-line streaming code the compiler vectorises,
// each input is read from memory once, and the output is written once.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "jaxcc/dtypes.h"
#include "jaxcc/reduce.h"
#include "reduce_host.h"
#include "xla/ffi/api/ffi.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace ffi = xla::ffi;

namespace jaxcc {
namespace {

constexpr size_t kBlock = 2048;  // elements per block: 8 KiB of f32 accumulator
constexpr size_t kGroup = 4;     // inputs streamed together in one pass over a block

// Whether this thread treats subnormal operands as zero (x86 MXCSR.DAZ,
// AArch64 FPCR.FZ): XLA:CPU sets it on the threads that run handlers.
bool ThreadFlushesSubnormals() {
#if defined(__x86_64__) || defined(__i386__)
  return (_mm_getcsr() & 0x0040u) != 0;
#elif defined(__aarch64__)
  return ((__builtin_aarch64_get_fpcr() >> 24) & 1u) != 0;
#else
  return false;
#endif
}

// +-0 for a subnormal a (its sign kept), else a.
template <typename A>
inline A FlushSubnormal(A a) {
  return std::fabs(a) < std::numeric_limits<A>::min() ? std::copysign(A(0), a) : a;
}

// One pass over a block of m elements: a = (first pass ? x0 : acc) + x1 + ...
// (+ standing for kOp's step), then acc = a, or out = round(a) on the last
// pass (max / min results flushed to zero if subnormal and `flush`: a max or
// min instruction returns a subnormal operand flushed where operands are).
// Fixed arity, so the loop body is straight-line code and vectorises.
template <ReduceOp kOp, typename T, bool kFirst, bool kLast, typename... Ts>
inline void Pass(Accumulator<T>* __restrict acc, T* __restrict out, size_t m, bool flush,
                 const T* __restrict x0, const Ts* __restrict... xs) {
  using A = Accumulator<T>;
  for (size_t i = 0; i < m; ++i) {
    A a = kFirst ? FoldFirst<kOp>(ToAccumulator(x0[i]))
                 : AccumulatorCombine<kOp>(acc[i], ToAccumulator(x0[i]));
    ((a = AccumulatorCombine<kOp>(a, ToAccumulator(xs[i]))), ...);  // left to right
    if constexpr (kLast) {
      if constexpr (kOp != ReduceOp::kSum && std::is_floating_point_v<A>) {
        if (flush) a = FlushSubnormal(a);
      }
      out[i] = FromAccumulator<T>(a);
    } else {
      acc[i] = a;
    }
  }
}

template <ReduceOp kOp, typename T, bool kFirst, bool kLast>
void PassGroup(Accumulator<T>* acc, T* out, size_t m, bool flush, const T* const* x,
               size_t count) {
  switch (count) {
    case 1: return Pass<kOp, T, kFirst, kLast>(acc, out, m, flush, x[0]);
    case 2: return Pass<kOp, T, kFirst, kLast>(acc, out, m, flush, x[0], x[1]);
    case 3: return Pass<kOp, T, kFirst, kLast>(acc, out, m, flush, x[0], x[1], x[2]);
    default: return Pass<kOp, T, kFirst, kLast>(acc, out, m, flush, x[0], x[1], x[2], x[3]);
  }
}

// On x86-64 glibc, ReduceBlocked is compiled twice, for AVX2 and for the
// baseline (SSE2), and the loader picks one at run time: AVX2 speed without
// -march, so the module still runs on any x86-64. Both give the same bits (no
// FMA; the NaN rules are explicit).
#if defined(__x86_64__) && defined(__GLIBC__) && defined(__has_attribute)
#if __has_attribute(target_clones) && __has_attribute(flatten)
#define JAXCC_CPU_CLONES __attribute__((target_clones("avx2", "default"), flatten))
#endif
#endif
#ifndef JAXCC_CPU_CLONES
#define JAXCC_CPU_CLONES
#endif

// k >= 2 inputs of n elements, block by block, kGroup inputs per pass.
template <ReduceOp kOp, typename T>
JAXCC_CPU_CLONES void ReduceBlocked(const T* const* inputs, size_t k, T* out, size_t n,
                                    bool flush) {
  static_assert(kGroup == 4, "PassGroup handles up to 4 inputs");
  using A = Accumulator<T>;
  alignas(64) A scratch[kBlock];
  for (size_t base = 0; base < n; base += kBlock) {
    const size_t m = std::min(kBlock, n - base);
    const T* x[kGroup];
    for (size_t first = 0; first < k; first += kGroup) {
      const size_t count = std::min(kGroup, k - first);
      for (size_t j = 0; j < count; ++j) x[j] = inputs[first + j] + base;
      const bool is_first = first == 0, is_last = first + count == k;
      if (is_first && is_last) {
        PassGroup<kOp, T, true, true>(scratch, out + base, m, flush, x, count);
      } else if (is_first) {
        PassGroup<kOp, T, true, false>(scratch, out + base, m, flush, x, count);
      } else if (is_last) {
        PassGroup<kOp, T, false, true>(scratch, out + base, m, flush, x, count);
      } else {
        PassGroup<kOp, T, false, false>(scratch, out + base, m, flush, x, count);
      }
    }
  }
}

// ReduceOnHost for one op and element type.
template <ReduceOp kOp, typename T>
ffi::Error ReduceTyped(const void* const* inputs, size_t k, void* out, size_t n) {
  T* dst = static_cast<T*>(out);
  if (n == 0 || (k == 1 && inputs[0] == out)) return ffi::Error::Success();
  if (k == 1) {
    std::memcpy(dst, inputs[0], n * sizeof(T));
    return ffi::Error::Success();
  }
  const bool flush = kOp != ReduceOp::kSum && ThreadFlushesSubnormals();
  std::vector<const T*> typed(k);
  bool aliased = false;
  for (size_t j = 0; j < k; ++j) {
    typed[j] = static_cast<const T*>(inputs[j]);
    aliased |= typed[j] == dst;
  }
  if (!aliased) {
    ReduceBlocked<kOp>(typed.data(), k, dst, n, flush);
    return ffi::Error::Success();
  }
  // out is an input: reduce block by block from a copy of the block, so no
  // restrict-qualified loop reads what it writes.
  std::vector<T> copy(std::min(n, kBlock));
  std::vector<const T*> shifted(k);
  for (size_t base = 0; base < n; base += kBlock) {
    const size_t m = std::min(kBlock, n - base);
    std::memcpy(copy.data(), dst + base, m * sizeof(T));
    for (size_t j = 0; j < k; ++j) shifted[j] = typed[j] == dst ? copy.data() : typed[j] + base;
    ReduceBlocked<kOp>(shifted.data(), k, dst + base, m, flush);
  }
  return ffi::Error::Success();
}

ffi::Error ReduceImpl(ffi::RemainingArgs args, ffi::Result<ffi::AnyBuffer> out, int64_t op) {
  ffi::ErrorOr<ReduceArgs> parsed = ParseReduceArgs(args, *out);
  if (!parsed.has_value()) return parsed.error();
  return ReduceOnHost(out->element_type(), parsed->inputs.data(), parsed->inputs.size(),
                      out->untyped_data(), parsed->element_count, static_cast<ReduceOp>(op));
}

}  // namespace

ffi::Error ReduceOnHost(ffi::DataType dtype, const void* const* inputs, size_t k, void* out,
                        size_t n, ReduceOp op) {
  return DispatchReduceType(dtype, [&](auto tag) {
    using T = typename decltype(tag)::Type;
    return DispatchReduceOp(static_cast<int64_t>(op), "jaxcc_reduce", [&](auto kind) {
      return ReduceTyped<decltype(kind)::value, T>(inputs, k, out, n);
    });
  });
}

}  // namespace jaxcc

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxccReduce, jaxcc::ReduceImpl,
                              ffi::Ffi::Bind()
                                  .RemainingArgs()          // inputs: k >= 1 same-typed arrays
                                  .Ret<ffi::AnyBuffer>()    // out: their elementwise reduction
                                  .Attr<int64_t>("op"));    // 0: sum, 1: max, 2: min
