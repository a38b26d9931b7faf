// Element types: bit-exact 16-bit float conversions, the accumulator-type
// trait, and the names of XLA's element types for messages.
//
// Host code reproduces what XLA:CPU does for `astype` (checked bit for bit
// against jax 0.10.2 on every bf16/f16 input and every f32 input):
//   * bf16 -> f32 is exact: the 16 bits become the top half (signalling NaNs
//     stay signalling, like XLA).
//   * f16 -> f32 is exact; a NaN is quieted, keeping its sign and payload.
//   * f32 -> bf16 / f16 round to nearest even; overflow gives +-inf, tiny
//     values become subnormals or +-0.
//   * NaN -> bf16: XLA drops the payload and keeps the sign (0x7fc0 / 0xffc0).
//     This differs from a plain truncation (which would keep the top payload
//     bits); we match XLA.
//   * NaN -> f16: sign, quiet bit and the top 9 payload bits are kept (what
//     x86 F16C, and therefore XLA:CPU, does).
// Device code uses the CUDA conversion intrinsics (cvt.rn.*), which is what
// XLA:GPU should emit for `astype` (not yet checked on a GPU); they agree with
// the host code except that a NaN becomes the canonical 0x7fff.
#ifndef JAXCC_DTYPES_H_
#define JAXCC_DTYPES_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "xla/ffi/api/ffi.h"

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define JAXCC_HD __host__ __device__
#else
#define JAXCC_HD
#endif

namespace jaxcc {

// Storage types: 16 raw bits, distinct so that templates can dispatch on them.
struct alignas(2) BFloat16 {
  uint16_t bits;
};
struct alignas(2) Float16 {
  uint16_t bits;
};
static_assert(sizeof(BFloat16) == 2 && sizeof(Float16) == 2, "16-bit storage");

JAXCC_HD inline uint32_t FloatToBits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

JAXCC_HD inline float BitsToFloat(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// A NaN with its quiet bit set (sign and payload kept).
JAXCC_HD inline float QuietNaN(float x) { return BitsToFloat(FloatToBits(x) | 0x400000u); }
JAXCC_HD inline double QuietNaN(double x) {
  uint64_t u;
  std::memcpy(&u, &x, sizeof(u));
  u |= uint64_t{1} << 51;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

// bf16 -> f32: exact.
JAXCC_HD inline float BFloat16ToFloat(BFloat16 x) {
  return BitsToFloat(static_cast<uint32_t>(x.bits) << 16);
}

// f32 -> bf16, round to nearest even; NaN -> sign | 0x7fc0 (XLA:CPU).
JAXCC_HD inline BFloat16 FloatToBFloat16(float f) {
#ifdef __CUDA_ARCH__
  return BFloat16{__bfloat16_as_ushort(__float2bfloat16_rn(f))};
#else
  const uint32_t u = FloatToBits(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = ((u >> 16) & 0x8000u) | 0x7fc0u;
  const bool is_nan = (u & 0x7fffffffu) > 0x7f800000u;
  return BFloat16{static_cast<uint16_t>(is_nan ? nan : rounded)};
#endif
}

// f16 -> f32: exact; NaN is quieted (payload kept).
JAXCC_HD inline float Float16ToFloat(Float16 x) {
#ifdef __CUDA_ARCH__
  return __half2float(__ushort_as_half(x.bits));
#else
  const uint32_t h = x.bits;
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  const uint32_t normal = sign | ((exp + 112u) << 23) | (mant << 13);
  const uint32_t special = sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u);
  // Subnormal (or zero): mant * 2^-24, exact in f32 and always a normal f32.
  const uint32_t tiny = sign | FloatToBits(static_cast<float>(static_cast<int32_t>(mant)) *
                                           5.9604644775390625e-8f);
  return BitsToFloat(exp == 0x1fu ? special : (exp == 0u ? tiny : normal));
#endif
}

// f32 -> f16, round to nearest even; NaN keeps sign and top payload bits.
JAXCC_HD inline Float16 FloatToFloat16(float f) {
#ifdef __CUDA_ARCH__
  return Float16{__half_as_ushort(__float2half_rn(f))};
#else
  const uint32_t u = FloatToBits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  // Normal f16 range: rebias the exponent and round the 13 dropped bits.
  const uint32_t normal = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;  // 0xc8000000 = -112 << 23
  // Below 2^-14: adding 0.5f aligns the f16 subnormal unit (2^-24) with the
  // last bit of the f32 mantissa, so the FPU does the round to nearest even.
  // An f32 subnormal input gives 0 whether or not denormals are flushed.
  const uint32_t tiny = FloatToBits(BitsToFloat(a) + 0.5f) - 0x3f000000u;
  const uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);
  uint32_t r = a < 0x38800000u ? tiny : normal;
  r = a >= 0x477ff000u ? 0x7c00u : r;  // >= 65520 rounds to inf
  r = a > 0x7f800000u ? nan : r;
  return Float16{static_cast<uint16_t>(sign | r)};
#endif
}

// Accumulator type: f32 for f32/bf16/f16, f64 for f64, the integer itself for
// integers (sums wrap in two's complement, like XLA).
template <typename T>
struct AccumulatorOf {
  static_assert(std::is_arithmetic_v<T>, "unsupported element type");
  using Type = T;
};
template <>
struct AccumulatorOf<BFloat16> {
  using Type = float;
};
template <>
struct AccumulatorOf<Float16> {
  using Type = float;
};
template <typename T>
using Accumulator = typename AccumulatorOf<T>::Type;

// Element -> accumulator (exact).
template <typename T>
JAXCC_HD inline Accumulator<T> ToAccumulator(T x) {
  return x;
}
template <>
JAXCC_HD inline float ToAccumulator<BFloat16>(BFloat16 x) {
  return BFloat16ToFloat(x);
}
template <>
JAXCC_HD inline float ToAccumulator<Float16>(Float16 x) {
  return Float16ToFloat(x);
}

// Accumulator -> element (the one rounding for bf16/f16).
template <typename T>
JAXCC_HD inline T FromAccumulator(Accumulator<T> x) {
  return x;
}
template <>
JAXCC_HD inline BFloat16 FromAccumulator<BFloat16>(float x) {
  return FloatToBFloat16(x);
}
template <>
JAXCC_HD inline Float16 FromAccumulator<Float16>(float x) {
  return FloatToFloat16(x);
}

// Lower-case jnp name of an FFI dtype, for messages and for the Python side.
inline std::string DataTypeName(xla::ffi::DataType dtype) {
  namespace ffi = xla::ffi;
  switch (dtype) {
    case ffi::PRED: return "bool";
    case ffi::S8: return "int8";
    case ffi::S16: return "int16";
    case ffi::S32: return "int32";
    case ffi::S64: return "int64";
    case ffi::U8: return "uint8";
    case ffi::U16: return "uint16";
    case ffi::U32: return "uint32";
    case ffi::U64: return "uint64";
    case ffi::F16: return "float16";
    case ffi::BF16: return "bfloat16";
    case ffi::F32: return "float32";
    case ffi::F64: return "float64";
    case ffi::C64: return "complex64";
    case ffi::C128: return "complex128";
    default: return "dtype #" + std::to_string(static_cast<int>(dtype));
  }
}

}  // namespace jaxcc

#endif  // JAXCC_DTYPES_H_
