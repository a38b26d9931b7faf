// The jaxcc codecs on the GPU: jaxcc_codec_{encode,decode}_{fixed,entropy},
// byte for byte the CPU formats of xla_ffi/include/jaxcc/codec.h (the same
// header code decides every block; tests/gpu/codec_check.py compares them).
//
// "fixed": one thread per element, one 256-thread CUDA block per codec block;
// the spill area is placed by an exclusive scan of the per-block spill sizes.
// "entropy": one 256-thread CUDA block per 65536-element codec block: shared
// histograms, the block's plan by one thread (the shared planner), then one
// thread per 1024-symbol Huffman sub-stream. Blocks are encoded into
// worst-case slots of a scratch buffer and compacted after a scan of their
// sizes. Decoding parses each block's plane headers in one thread, builds the
// decode table in shared memory and decodes one sub-stream per thread.
//
// Encoding never synchronises with the host. Decoding copies the 32-byte
// header to the host to check it, and the status and checksum back at the
// end, so that a corrupted encoding fails the call with a message.
#include <cub/cub.cuh>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "jaxcc/codec.h"
#include "jaxcc/codec_ffi.h"
#include "jaxcc/reduce.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jaxcc {
namespace codec {
namespace {

constexpr int kThreads = 256;
static_assert(kThreads == kFixedBlock, "one thread per fixed-codec element");
static_assert(kEntropyBlock / kThreads == 256, "a thread owns 256 elements in compactions");

template <DTypeId D>
using Bits = std::conditional_t<D == kF32, uint32_t, uint16_t>;

template <typename T>
__host__ __device__ inline T Min(T a, T b) {
  return a < b ? a : b;
}

// Decode failures, reported through a device status word (first one wins).
enum Status : uint32_t {
  kOk = 0,
  kBadBlockHeader,
  kBadEscape,
  kBadSize,
  kBadPlane,
  kBadBitmap,
  kBadBlockKind,
};

const char* StatusText(uint32_t s) {
  switch (s) {
    case kBadBlockHeader: return "bad block header";
    case kBadEscape: return "bad escape";
    case kBadSize: return "size mismatch: the blocks do not add up to nbytes";
    case kBadPlane: return "corrupted plane";
    case kBadBitmap: return "bad zero bitmap";
    case kBadBlockKind: return "bad block kind";
  }
  return "unknown failure";
}

struct MaxOp {
  __device__ uint32_t operator()(uint32_t a, uint32_t b) const { return a > b ? a : b; }
};

__device__ inline void Fail(uint32_t* status, uint32_t s) { atomicCAS(status, 0u, s); }

// ---------------------------------------------------------------------------
// Host-side helpers.
// ---------------------------------------------------------------------------

ffi::Error CudaError(const std::string& name, cudaError_t err, const char* what) {
  return ffi::Error::Internal(name + ": " + what + ": " + cudaGetErrorName(err) + ": " +
                              cudaGetErrorString(err));
}

#define JAXCC_CUDA(name, call)                                        \
  do {                                                                \
    const cudaError_t err_ = (call);                                  \
    if (err_ != cudaSuccess) return CudaError(name, err_, #call);     \
  } while (0)

#define JAXCC_LAUNCHED(name)                                                    \
  do {                                                                          \
    const cudaError_t err_ = cudaGetLastError();                                \
    if (err_ != cudaSuccess) return CudaError(name, err_, "kernel launch");     \
  } while (0)

// Carves typed arrays out of one scratch allocation.
struct Carver {
  uint8_t* base;
  uint64_t used = 0;
  template <typename T>
  T* Take(uint64_t count) {
    T* p = reinterpret_cast<T*>(base + used);
    used += (count * sizeof(T) + 255) / 256 * 256;
    return p;
  }
};

std::optional<uint8_t*> Allocate(ffi::ScratchAllocator& scratch, uint64_t bytes) {
  if (bytes == 0) bytes = 256;
  std::optional<void*> p = scratch.Allocate(bytes, 256);
  if (!p.has_value() || *p == nullptr) return std::nullopt;
  return static_cast<uint8_t*>(*p);
}

// Exclusive scan of count u32 values into out (count + 1 values: the total last).
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

// ---------------------------------------------------------------------------
// Checksum and header.
// ---------------------------------------------------------------------------

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
  return static_cast<int>(Min<uint64_t>(std::max<uint64_t>(CeilDiv(bytes, 4 * kThreads * 8), 1), 4096));
}

// Sums the checksum of out[0, *nbytes) (header fields already in place) and
// writes the header and the nbytes result.
ffi::Error Finish(const std::string& name, cudaStream_t stream, uint8_t* out, CodecId codec,
                  DTypeId dtype, uint64_t n, uint64_t max_bytes, const uint64_t* nbytes,
                  uint32_t* sums, int32_t* nbytes_out) {
  const int block_log2 = codec == kFixed ? kFixedBlockLog2 : kEntropyBlockLog2;
  JAXCC_CUDA(name, cudaMemsetAsync(sums, 0, 2 * sizeof(uint32_t), stream));
  HeaderKernel<<<1, 1, 0, stream>>>(out, codec, dtype, block_log2, n, nbytes, sums, nbytes_out);
  JAXCC_LAUNCHED(name);
  ChecksumKernel<<<ChecksumBlocks(max_bytes), kThreads, 0, stream>>>(out, nbytes, sums);
  JAXCC_LAUNCHED(name);
  HeaderKernel<<<1, 1, 0, stream>>>(out, codec, dtype, block_log2, n, nbytes, sums, nbytes_out);
  JAXCC_LAUNCHED(name);
  return ffi::Error::Success();
}

// ---------------------------------------------------------------------------
// "fixed" encode.
// ---------------------------------------------------------------------------

// ORs v over the 8-lane group of this lane (lanes 8g..8g+7 of a warp).
__device__ inline uint32_t GroupOr8(uint32_t v) {
  v |= __shfl_xor_sync(0xffffffffu, v, 1);
  v |= __shfl_xor_sync(0xffffffffu, v, 2);
  v |= __shfl_xor_sync(0xffffffffu, v, 4);
  return v;
}

// Pass 1: table entry, codes, planes; the block's spill size into spill_size.
template <DTypeId D>
__global__ void __launch_bounds__(kThreads)
    FixedEncodeKernel(const Bits<D>* x, uint64_t n, uint8_t* out, uint32_t* spill_size) {
  const FixedLayout l = MakeFixedLayout(D, n);
  const uint64_t blk = blockIdx.x;
  const uint64_t start = blk * kFixedBlock;
  const uint32_t m = static_cast<uint32_t>(Min<uint64_t>(kFixedBlock, n - start));
  const uint32_t i = threadIdx.x;
  const bool live = i < m;
  const uint32_t v = live ? x[start + i] : 0u;
  const uint32_t e = Exponent<D>(v);
  using Reduce = cub::BlockReduce<uint32_t, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  __shared__ uint32_t shared_base, shared_esc;
  const uint32_t mx = Reduce(temp).Reduce(e, MaxOp());
  if (i == 0) shared_base = FixedBase(mx);
  __syncthreads();
  const uint32_t base = shared_base;
  const uint32_t escapes = Reduce(temp).Sum(live && FixedEscapes(e, base) ? 1u : 0u);
  if (i == 0) shared_esc = FixedEscByte(D, escapes, m);
  __syncthreads();
  const uint32_t esc = shared_esc;
  uint32_t c = esc == kFixedRawExponents ? (e & 15u) : FixedCode(e, base);
  const uint32_t hi_c = __shfl_down_sync(0xffffffffu, c, 1);
  if (live && (i & 1) == 0) {
    out[l.codes + start / 2 + i / 2] = static_cast<uint8_t>(c | ((i + 1 < m ? hi_c : 0u) << 4));
  }
  uint8_t p[kMaxPlanes];
  Split<D>(v, p);
  if constexpr (D == kF16) {
    if (live) out[l.planes + start + i] = p[1];
    const uint32_t k = i & 7;
    const uint32_t word = GroupOr8(live ? uint32_t{p[2]} << (3 * k) : 0u);
    const uint32_t g = i / 8;
    if (live && k == 0) {
      const uint32_t bytes = Min(3u, static_cast<uint32_t>(CeilDiv(3 * (m - 8 * g), 8)));
      uint8_t* p3 = out + l.packed3 + start / 8 * 3 + 3 * g;
      for (uint32_t b = 0; b < bytes; ++b) p3[b] = static_cast<uint8_t>(word >> (8 * b));
    }
  } else {
    constexpr int kSm = D == kF32 ? 3 : 1;
    if (live) {
      for (int k = 0; k < kSm; ++k) out[l.planes + k * n + start + i] = p[1 + k];
    }
  }
  if (i == 0) {
    out[l.table + 2 * blk] = static_cast<uint8_t>(base);
    out[l.table + 2 * blk + 1] = static_cast<uint8_t>(esc);
    spill_size[blk] = static_cast<uint32_t>(FixedBlockSpill(D, esc, m));
  }
}

// Pass 2: the spill of the blocks that have one, at the scanned offsets.
template <DTypeId D>
__global__ void __launch_bounds__(kThreads)
    FixedSpillKernel(const Bits<D>* x, uint64_t n, uint8_t* out, const uint32_t* spill_offset) {
  const FixedLayout l = MakeFixedLayout(D, n);
  const uint64_t blk = blockIdx.x;
  const uint64_t start = blk * kFixedBlock;
  const uint32_t m = static_cast<uint32_t>(Min<uint64_t>(kFixedBlock, n - start));
  const uint32_t base = out[l.table + 2 * blk];
  const uint32_t esc = out[l.table + 2 * blk + 1];
  if (esc == 0) return;
  const uint32_t i = threadIdx.x;
  const bool live = i < m;
  const uint32_t e = live ? Exponent<D>(x[start + i]) : 0u;
  uint8_t* s = out + l.spill + spill_offset[blk];
  if (esc == kFixedRawExponents) {
    if constexpr (D == kF16) {
      const uint32_t bit = (e >> 4) & 1u;
      const uint32_t byte = GroupOr8(live ? bit << (i & 7) : 0u);
      if (live && (i & 7) == 0) s[i / 8] = static_cast<uint8_t>(byte);
    } else {
      const uint32_t hi = e >> 4;
      const uint32_t next = __shfl_down_sync(0xffffffffu, hi, 1);
      if (live && (i & 1) == 0) s[i / 2] = static_cast<uint8_t>(hi | ((i + 1 < m ? next : 0u) << 4));
    }
    return;
  }
  const bool escapes = live && FixedEscapes(e, base);
  using Scan = cub::BlockScan<uint32_t, kThreads>;
  __shared__ typename Scan::TempStorage temp;
  uint32_t rank;
  Scan(temp).ExclusiveSum(escapes ? 1u : 0u, rank);
  if (escapes) {
    s[2 * rank] = static_cast<uint8_t>(i);
    s[2 * rank + 1] = static_cast<uint8_t>(e);
  }
}

// nbytes = max(static size, end of spill); zero-fills the unused pool.
__global__ void FixedSizeKernel(uint8_t* out, FixedLayout l, const uint32_t* spill_total,
                                uint64_t* nbytes) {
  const uint64_t used = *spill_total;
  const uint64_t end = max(l.static_bytes, l.spill + used);
  for (uint64_t k = l.spill + used + uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; k < end;
       k += uint64_t{gridDim.x} * blockDim.x) {
    out[k] = 0;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) *nbytes = end;
}

// ---------------------------------------------------------------------------
// "fixed" decode.
// ---------------------------------------------------------------------------

template <DTypeId D>
__global__ void FixedSpillSizesKernel(const uint8_t* in, uint64_t n, uint32_t* spill_size) {
  const FixedLayout l = MakeFixedLayout(D, n);
  const uint64_t blk = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (blk >= l.blocks) return;
  const uint64_t m = Min<uint64_t>(kFixedBlock, n - blk * kFixedBlock);
  spill_size[blk] = static_cast<uint32_t>(FixedBlockSpill(D, in[l.table + 2 * blk + 1], m));
}

template <DTypeId D>
__global__ void __launch_bounds__(kThreads)
    FixedDecodeKernel(const uint8_t* in, uint64_t nbytes, uint64_t n, const uint32_t* spill_offset,
                      Bits<D>* y, uint32_t* status) {
  constexpr int kExpBits = D == kF16 ? 5 : 8;
  const FixedLayout l = MakeFixedLayout(D, n);
  const uint64_t blk = blockIdx.x;
  const uint64_t start = blk * kFixedBlock;
  const uint32_t m = static_cast<uint32_t>(Min<uint64_t>(kFixedBlock, n - start));
  const uint32_t i = threadIdx.x;
  const uint32_t base = in[l.table + 2 * blk];
  const uint32_t esc = in[l.table + 2 * blk + 1];
  const uint64_t need = FixedBlockSpill(D, esc, m);
  const uint64_t at = l.spill + spill_offset[blk];
  if (base >= (1u << kExpBits) || base < 15 ||
      (esc != kFixedRawExponents && 2 * esc > FixedRawSpill(D, m)) || at + need > nbytes) {
    if (i == 0) Fail(status, kBadBlockHeader);
    return;
  }
  const uint8_t* s = in + at;
  __shared__ uint8_t e[kFixedBlock];
  const uint32_t code = i < m ? (in[l.codes + start / 2 + i / 2] >> (4 * (i & 1))) & 15u : 0u;
  if (esc == kFixedRawExponents) {
    uint32_t hi = 0;
    if (i < m) hi = kExpBits == 8 ? (s[i / 2] >> (4 * (i & 1))) & 15u : (s[i / 8] >> (i & 7)) & 1u;
    e[i] = static_cast<uint8_t>(code | hi << 4);
  } else {
    e[i] = static_cast<uint8_t>(FixedExponent(code, base));
  }
  __syncthreads();
  bool bad_escape = false;
  if (esc != kFixedRawExponents && i < esc) {
    const uint32_t idx = s[2 * i], ex = s[2 * i + 1];
    const uint32_t prev = i ? s[2 * i - 2] : 0u;
    bad_escape = (i && idx <= prev) || idx >= m || e[idx] != 0 || !FixedEscapes(ex, base);
  }
  if (__syncthreads_or(bad_escape)) {
    if (i == 0) Fail(status, kBadEscape);
    return;
  }
  if (esc != kFixedRawExponents && i < esc) e[s[2 * i]] = s[2 * i + 1];
  __syncthreads();
  if (i >= m) return;
  if constexpr (D == kBF16) {
    y[start + i] = static_cast<uint16_t>(Join<D>(e[i], in[l.planes + start + i]));
  } else if constexpr (D == kF32) {
    const uint8_t* p1 = in + l.planes + start + i;
    y[start + i] = Join<D>(e[i], p1[0], p1[n], p1[2 * n]);
  } else {
    const uint8_t* p3 = in + l.packed3 + start / 8 * 3;
    const uint32_t g = i / 8, k = i % 8;
    const uint32_t byte = 3 * g + (3 * k) / 8, sh = (3 * k) % 8;
    uint32_t two = p3[byte];
    if (sh > 5) two |= uint32_t{p3[byte + 1]} << 8;
    y[start + i] = static_cast<uint16_t>(Join<D>(e[i], in[l.planes + start + i], (two >> sh) & 7u));
  }
}

// ---------------------------------------------------------------------------
// "entropy" encode.
// ---------------------------------------------------------------------------

// Per-block scratch: planes and nonzero planes of 65536 symbols, the bitmap,
// and a worst-case output slot.
template <DTypeId D>
struct EntropySlots {
  static constexpr int kPlanes = D == kF32 ? 4 : D == kF16 ? 3 : 2;
  static constexpr uint64_t kSlot = 1 + kEntropyBlock * sizeof(Bits<D>);
  uint8_t* planes;  // [blocks][kPlanes][kEntropyBlock]
  uint8_t* nz;      // [blocks][kPlanes][kEntropyBlock]
  uint8_t* bitmap;  // [blocks][kEntropyBlock / 8]
  uint8_t* slots;   // [blocks][kSlot]
  uint32_t* sizes;  // [blocks + 1]
  uint32_t* offsets;  // [blocks + 1]
};

struct BlockPlan {
  uint8_t kind;
  uint32_t nnz;
  PlanePlan plane[kMaxPlanes];
  PlanePlan bitmap;
  uint8_t len[kMaxPlanes + 1][256];  // the bitmap's lengths last
  uint16_t code[256];
};

__device__ inline void PutByte(uint8_t*& o, uint32_t v) { *o++ = static_cast<uint8_t>(v); }

// Writes one plane of c symbols (sym) at o, cooperatively; returns the end.
// Every thread calls it; the plan and lengths are in shared memory.
__device__ uint8_t* WritePlaneBlock(uint8_t* o, const uint8_t* sym, uint64_t c,
                                    const PlanePlan& plan, const uint8_t* len, uint16_t* code,
                                    uint32_t* sub_bytes) {
  const uint32_t t = threadIdx.x;
  if (plan.kind == kRawPlane) {
    if (t == 0) o[0] = kRawPlane;
    for (uint64_t i = t; i < c; i += kThreads) o[1 + i] = sym[i];
    __syncthreads();
    return o + 1 + c;
  }
  if (plan.kind == kConstant) {
    if (t == 0) {
      o[0] = kConstant;
      o[1] = plan.lo;
    }
    __syncthreads();
    return o + 2;
  }
  const uint32_t subs = NumSubStreams(c);
  const uint32_t table = TableBytes(plan.lo, plan.hi);
  if (t == 0) {
    uint8_t* h = o;
    PutByte(h, kHuffman);
    PutByte(h, plan.lo);
    PutByte(h, plan.hi);
    for (uint32_t s = plan.lo; s <= plan.hi; s += 2) {
      PutByte(h, len[s] | (s + 1 <= plan.hi ? len[s + 1] << 4 : 0));
    }
    CanonicalCodes(len, code);
  }
  __syncthreads();
  // Bits of each sub-stream, then byte offsets (subs <= 64 <= kThreads).
  if (t < subs) {
    const uint64_t lo = uint64_t{t} * kSubStream;
    const uint64_t hi = Min<uint64_t>(c, lo + kSubStream);
    uint32_t bits = 0;
    for (uint64_t i = lo; i < hi; ++i) bits += len[sym[i]];
    sub_bytes[t] = (bits + 7) / 8;
  }
  __syncthreads();
  uint8_t* sizes = o + 1 + table;
  uint8_t* data = sizes + 2 * subs;
  if (t < subs) {
    uint32_t off = 0;
    for (uint32_t j = 0; j < t; ++j) off += sub_bytes[j];
    sizes[2 * t] = static_cast<uint8_t>(sub_bytes[t]);
    sizes[2 * t + 1] = static_cast<uint8_t>(sub_bytes[t] >> 8);
    uint8_t* w = data + off;
    const uint64_t lo = uint64_t{t} * kSubStream;
    const uint64_t hi = Min<uint64_t>(c, lo + kSubStream);
    uint64_t buf = 0;
    uint32_t nb = 0;
    for (uint64_t i = lo; i < hi; ++i) {
      buf |= uint64_t{code[sym[i]]} << nb;
      nb += len[sym[i]];
      while (nb >= 8) {
        PutByte(w, static_cast<uint32_t>(buf));
        buf >>= 8;
        nb -= 8;
      }
    }
    if (nb) PutByte(w, static_cast<uint32_t>(buf));
  }
  __syncthreads();
  uint32_t total = 0;
  for (uint32_t j = 0; j < subs; ++j) total += sub_bytes[j];
  __syncthreads();
  return data + total;
}

// Splits, plans and writes one block into its slot.
template <DTypeId D>
__global__ void __launch_bounds__(kThreads)
    EntropyEncodeKernel(const Bits<D>* x, uint64_t n, EntropySlots<D> s) {
  constexpr int kPlanes = EntropySlots<D>::kPlanes;
  const uint64_t blk = blockIdx.x;
  const uint64_t start = blk * kEntropyBlock;
  const uint32_t m = static_cast<uint32_t>(Min<uint64_t>(kEntropyBlock, n - start));
  const uint32_t t = threadIdx.x;
  const Bits<D>* v = x + start;
  uint8_t* planes = s.planes + blk * kPlanes * kEntropyBlock;
  uint8_t* nz = s.nz + blk * kPlanes * kEntropyBlock;
  uint8_t* bitmap = s.bitmap + blk * (kEntropyBlock / 8);
  uint8_t* slot = s.slots + blk * EntropySlots<D>::kSlot;

  __shared__ uint32_t hist[kPlanes][256], sample[kPlanes][256], bm_hist[256];
  __shared__ uint32_t zeros, counts[kThreads], sub_bytes[kThreads];
  __shared__ BlockPlan plan;
  __shared__ bool sampled_raw[kPlanes];
  for (uint32_t k = t; k < 256; k += kThreads) {
    for (int p = 0; p < kPlanes; ++p) hist[p][k] = sample[p][k] = 0;
    bm_hist[k] = 0;
  }
  if (t == 0) zeros = 0;
  __syncthreads();
  uint32_t z = 0;
  for (uint32_t i = t; i < m; i += kThreads) {
    const uint32_t bits = v[i];
    uint8_t p[kMaxPlanes];
    Split<D>(bits, p);
    for (int k = 0; k < kPlanes; ++k) {
      planes[k * kEntropyBlock + i] = p[k];
      atomicAdd(&hist[k][p[k]], 1u);
      if (i % kSampleStride == 0) atomicAdd(&sample[k][p[k]], 1u);
    }
    z += bits == 0;
  }
  atomicAdd(&zeros, z);
  __syncthreads();
  const bool sparse_candidate = uint64_t{zeros} * 8 >= m;
  const uint32_t bm_bytes = static_cast<uint32_t>(CeilDiv(m, 8));
  if (sparse_candidate) {
    for (uint32_t g = t; g < bm_bytes; g += kThreads) {
      uint32_t byte = 0;
      for (uint32_t k = 0; k < 8 && 8 * g + k < m; ++k) byte |= uint32_t(v[8 * g + k] != 0) << k;
      bitmap[g] = static_cast<uint8_t>(byte);
      atomicAdd(&bm_hist[byte], 1u);
    }
  }
  if (t > 0 && t < kPlanes) {
    sampled_raw[t] = !sparse_candidate && m >= kSampleMin &&
                     !SampleWorthCoding(sample[t], CeilDiv(m, kSampleStride));
  }
  __syncthreads();
  if (t == 0) {
    uint64_t dense_bytes = 1;
    for (int p = 0; p < kPlanes; ++p) {
      if (p > 0 && sampled_raw[p]) {
        plan.plane[p] = {kRawPlane, 0, 0, 1 + uint64_t{m}};
      } else {
        plan.plane[p] = PlanPlane(hist[p], m, plan.len[p]);
      }
      dense_bytes += plan.plane[p].bound;
    }
    uint64_t best = 1 + uint64_t{m} * sizeof(Bits<D>);
    plan.kind = kRawBlock;
    if (dense_bytes < best) {
      best = dense_bytes;
      plan.kind = kDense;
    }
    plan.nnz = m - zeros;
    if (sparse_candidate) {
      PlanePlan bm = PlanPlane(bm_hist, bm_bytes, plan.len[kMaxPlanes]);
      uint64_t sparse_bytes = 1 + 4 + bm.bound;
      PlanePlan nzp[kMaxPlanes];
      uint8_t nz_len[kMaxPlanes][256];
      for (int p = 0; p < kPlanes; ++p) {
        hist[p][0] -= zeros;
        nzp[p] = PlanPlane(hist[p], plan.nnz, nz_len[p]);
        sparse_bytes += nzp[p].bound;
      }
      if (sparse_bytes < best) {
        plan.kind = kSparse;
        plan.bitmap = bm;
        for (int p = 0; p < kPlanes; ++p) {
          plan.plane[p] = nzp[p];
          for (int k = 0; k < 256; ++k) plan.len[p][k] = nz_len[p][k];
        }
      }
    }
  }
  __syncthreads();
  uint8_t* o = slot;
  if (t == 0) o[0] = plan.kind;
  ++o;
  if (plan.kind == kRawBlock) {
    const uint8_t* raw = reinterpret_cast<const uint8_t*>(v);
    for (uint64_t i = t; i < uint64_t{m} * sizeof(Bits<D>); i += kThreads) o[i] = raw[i];
    o += uint64_t{m} * sizeof(Bits<D>);
  } else if (plan.kind == kDense) {
    for (int p = 0; p < kPlanes; ++p) {
      o = WritePlaneBlock(o, planes + p * kEntropyBlock, m, plan.plane[p], plan.len[p], plan.code,
                          sub_bytes);
    }
  } else {
    if (t == 0) Store32(o, plan.nnz);
    o += 4;
    o = WritePlaneBlock(o, bitmap, bm_bytes, plan.bitmap, plan.len[kMaxPlanes], plan.code,
                        sub_bytes);
    // Compact the nonzero elements: thread t owns elements [256 t, 256 t + 256).
    const uint32_t lo = t * 256, hi = Min(m, lo + 256);
    uint32_t count = 0;
    for (uint32_t i = lo; i < hi; ++i) count += v[i] != 0;
    counts[t] = count;
    __syncthreads();
    uint32_t at = 0;
    for (uint32_t j = 0; j < t; ++j) at += counts[j];
    for (uint32_t i = lo; i < hi; ++i) {
      if (v[i] != 0) {
        for (int p = 0; p < kPlanes; ++p) nz[p * kEntropyBlock + at] = planes[p * kEntropyBlock + i];
        ++at;
      }
    }
    __syncthreads();
    for (int p = 0; p < kPlanes; ++p) {
      o = WritePlaneBlock(o, nz + p * kEntropyBlock, plan.nnz, plan.plane[p], plan.len[p],
                          plan.code, sub_bytes);
    }
  }
  if (t == 0) s.sizes[blk] = static_cast<uint32_t>(o - slot);
}

// Copies each block's slot to its place and writes the size table.
template <DTypeId D>
__global__ void EntropyCompactKernel(uint8_t* out, uint64_t blocks, EntropySlots<D> s) {
  const uint64_t blk = blockIdx.x;
  const uint32_t size = s.sizes[blk];
  uint8_t* dst = out + kHeaderBytes + 4 * blocks + s.offsets[blk];
  const uint8_t* src = s.slots + blk * EntropySlots<D>::kSlot;
  for (uint32_t i = threadIdx.x; i < size; i += blockDim.x) dst[i] = src[i];
  if (threadIdx.x == 0) Store32(out + kHeaderBytes + 4 * blk, size);
}

__global__ void EntropySizeKernel(uint64_t blocks, const uint32_t* offsets, uint64_t* nbytes) {
  *nbytes = kHeaderBytes + 4 * blocks + offsets[blocks];
}

// ---------------------------------------------------------------------------
// "entropy" decode.
// ---------------------------------------------------------------------------

__global__ void EntropyBlockSizesKernel(const uint8_t* in, uint64_t blocks, uint32_t* sizes) {
  const uint64_t blk = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (blk < blocks) sizes[blk] = Load32(in + kHeaderBytes + 4 * blk);
}

__global__ void EntropyCheckSizeKernel(uint64_t blocks, const uint32_t* sizes,
                                       const uint32_t* offsets, uint64_t nbytes,
                                       uint32_t* status) {
  // The scan is mod 2^32: check the running sums never wrapped.
  for (uint64_t b = 0; b < blocks; ++b) {
    if (sizes[b] == 0 || offsets[b + 1] < offsets[b]) {
      Fail(status, kBadSize);
      return;
    }
  }
  if (kHeaderBytes + 4 * blocks + uint64_t{offsets[blocks]} != nbytes) Fail(status, kBadSize);
}

struct PlaneDesc {
  uint8_t kind;
  uint8_t value;             // constant
  uint32_t lo, hi;           // huffman
  const uint8_t* sizes;      // huffman: u16 sub-stream sizes
  const uint8_t* data;       // raw: the symbols; huffman: the sub-streams
  uint64_t count;
};

// Parses a plane header at p (bounded by end); nullptr if malformed.
__device__ const uint8_t* ParsePlane(const uint8_t* p, const uint8_t* end, uint64_t c,
                                     PlaneDesc* d, uint8_t* len) {
  if (p >= end) return nullptr;
  d->kind = *p++;
  d->count = c;
  if (d->kind == kRawPlane) {
    if (c > uint64_t(end - p)) return nullptr;
    d->data = p;
    return p + c;
  }
  if (d->kind == kConstant) {
    if (p >= end || c == 0) return nullptr;
    d->value = *p;
    return p + 1;
  }
  if (d->kind != kHuffman || end - p < 2 || c == 0) return nullptr;
  d->lo = p[0];
  d->hi = p[1];
  p += 2;
  if (d->lo >= d->hi || TableBytes(d->lo, d->hi) - 2 > uint64_t(end - p)) return nullptr;
  for (int s = 0; s < 256; ++s) len[s] = 0;
  for (uint32_t s = d->lo; s <= d->hi; ++s) len[s] = (p[(s - d->lo) / 2] >> (4 * ((s - d->lo) & 1))) & 15;
  if ((d->hi - d->lo) % 2 == 0 && (p[(d->hi - d->lo) / 2] >> 4)) return nullptr;
  p += TableBytes(d->lo, d->hi) - 2;
  const uint32_t subs = NumSubStreams(c);
  if (2 * uint64_t{subs} > uint64_t(end - p)) return nullptr;
  d->sizes = p;
  p += 2 * subs;
  uint64_t total = 0;
  for (uint32_t j = 0; j < subs; ++j) total += d->sizes[2 * j] | uint32_t{d->sizes[2 * j + 1]} << 8;
  if (total > uint64_t(end - p)) return nullptr;
  d->data = p;
  return p + total;
}

// Decodes a plane into out (cooperatively); false if it is corrupted. The
// decode table of codec.h's BuildDecodeTable, filled one symbol per thread.
__device__ bool DecodePlaneBlock(const PlaneDesc& d, const uint8_t* len, uint16_t* table,
                                 uint16_t* code, const uint8_t* limit, uint8_t* out, bool* ok) {
  const uint32_t t = threadIdx.x;
  if (d.kind == kRawPlane) {
    for (uint64_t i = t; i < d.count; i += kThreads) out[i] = d.data[i];
    return true;
  }
  if (d.kind == kConstant) {
    for (uint64_t i = t; i < d.count; i += kThreads) out[i] = d.value;
    return true;
  }
  if (t == 0) {
    uint32_t kraft = 0;
    for (uint32_t s = d.lo; s <= d.hi; ++s) {
      if (len[s] > kMaxCodeLen) kraft = ~0u;
      if (len[s] && kraft != ~0u) kraft += kTableSize >> len[s];
    }
    *ok = kraft == kTableSize;
    if (*ok) CanonicalCodes(len, code);
  }
  __syncthreads();
  if (!*ok) return false;
  const uint32_t s = d.lo + t;
  if (s <= d.hi && len[s]) {
    const uint16_t entry = static_cast<uint16_t>(s | uint32_t{len[s]} << 8);
    for (uint32_t k = code[s]; k < kTableSize; k += 1u << len[s]) table[k] = entry;
  }
  __syncthreads();
  const uint32_t subs = NumSubStreams(d.count);
  bool good = true;
  if (t < subs) {
    const uint8_t* p = d.data;
    for (uint32_t j = 0; j < t; ++j) p += d.sizes[2 * j] | uint32_t{d.sizes[2 * j + 1]} << 8;
    const uint32_t size = d.sizes[2 * t] | uint32_t{d.sizes[2 * t + 1]} << 8;
    const uint64_t lo = uint64_t{t} * kSubStream;
    const uint64_t hi = Min<uint64_t>(d.count, lo + kSubStream);
    uint64_t buf = 0;
    uint32_t nb = 0;
    uint64_t consumed = 0;
    const uint8_t* q = p;
    for (uint64_t i = lo; i < hi; ++i) {
      while (nb <= 56) {
        buf |= uint64_t{q < limit ? *q : uint8_t{0}} << nb;
        ++q;
        nb += 8;
      }
      const uint32_t e = table[buf & (kTableSize - 1)];
      out[i] = static_cast<uint8_t>(e);
      buf >>= e >> 8;
      nb -= e >> 8;
      consumed += e >> 8;
    }
    good = CeilDiv(consumed, 8) == size;
  }
  return __syncthreads_and(good);
}

template <DTypeId D>
__global__ void __launch_bounds__(kThreads)
    EntropyDecodeKernel(const uint8_t* in, uint64_t nbytes, uint64_t n, const uint32_t* offsets,
                        uint8_t* scratch, Bits<D>* y, uint32_t* status) {
  constexpr int kPlanes = D == kF32 ? 4 : D == kF16 ? 3 : 2;
  const uint64_t blocks = CeilDiv(n, kEntropyBlock);
  const uint64_t blk = blockIdx.x;
  const uint64_t start = blk * kEntropyBlock;
  const uint32_t m = static_cast<uint32_t>(Min<uint64_t>(kEntropyBlock, n - start));
  const uint32_t t = threadIdx.x;
  const uint8_t* limit = in + nbytes;
  const uint8_t* p = in + kHeaderBytes + 4 * blocks + offsets[blk];
  const uint8_t* end = in + kHeaderBytes + 4 * blocks + offsets[blk + 1];
  if (end > limit || p >= end) {
    if (t == 0) Fail(status, kBadSize);
    return;
  }
  uint8_t* planes = scratch + blk * (kPlanes + 1) * kEntropyBlock;
  uint8_t* bitmap = planes + kPlanes * kEntropyBlock;
  __shared__ PlaneDesc desc[kMaxPlanes + 1];
  __shared__ uint8_t len[kMaxPlanes + 1][256];
  __shared__ uint16_t table[kTableSize], code[256];
  __shared__ uint32_t fail, kind, nnz, counts[kThreads];
  __shared__ bool ok;
  if (t == 0) {
    fail = kOk;
    kind = *p++;
    nnz = m;
    if (kind == kRawBlock) {
      if (uint64_t(end - p) != uint64_t{m} * sizeof(Bits<D>)) fail = kBadSize;
    } else if (kind == kDense || kind == kSparse) {
      if (kind == kSparse) {
        if (end - p < 4 || Load32(p) > m) {
          p = nullptr;
        } else {
          nnz = Load32(p);
          p = ParsePlane(p + 4, end, CeilDiv(m, 8), &desc[kMaxPlanes], len[kMaxPlanes]);
        }
      }
      for (int k = 0; k < kPlanes && p; ++k) p = ParsePlane(p, end, nnz, &desc[k], len[k]);
      if (p != end) fail = kBadPlane;
    } else {
      fail = kBadBlockKind;
    }
    if (fail) Fail(status, fail);
  }
  __syncthreads();
  if (fail) return;
  Bits<D>* out = y + start;
  if (kind == kRawBlock) {
    const uint8_t* raw = end - uint64_t{m} * sizeof(Bits<D>);
    uint8_t* dst = reinterpret_cast<uint8_t*>(out);
    for (uint64_t i = t; i < uint64_t{m} * sizeof(Bits<D>); i += kThreads) dst[i] = raw[i];
    return;
  }
  bool good = true;
  if (kind == kSparse) {
    good = DecodePlaneBlock(desc[kMaxPlanes], len[kMaxPlanes], table, code, limit, bitmap, &ok);
  }
  for (int k = 0; k < kPlanes && good; ++k) {
    good = DecodePlaneBlock(desc[k], len[k], table, code, limit, planes + k * kEntropyBlock, &ok);
    __syncthreads();
  }
  if (!good) {
    if (t == 0) Fail(status, kBadPlane);
    return;
  }
  const uint8_t* pl[kMaxPlanes];
  for (int k = 0; k < kPlanes; ++k) pl[k] = planes + k * kEntropyBlock;
  auto join = [&](uint32_t j) -> Bits<D> {
    if constexpr (D == kBF16) return static_cast<uint16_t>(Join<D>(pl[0][j], pl[1][j]));
    else if constexpr (D == kF16) return static_cast<uint16_t>(Join<D>(pl[0][j] & 31u, pl[1][j], pl[2][j] & 7u));
    else return Join<D>(pl[0][j], pl[1][j], pl[2][j], pl[3][j]);
  };
  if (kind == kDense) {
    for (uint32_t i = t; i < m; i += kThreads) out[i] = join(i);
    return;
  }
  // Sparse: thread t owns elements [256 t, 256 t + 256), i.e. 32 bitmap bytes.
  const uint32_t lo = t * 256, hi = Min(m, lo + 256);
  uint32_t count = 0;
  for (uint32_t i = lo; i < hi; i += 8) count += __popc(bitmap[i / 8]);
  counts[t] = count;
  __syncthreads();
  uint32_t at = 0, total = 0;
  for (uint32_t j = 0; j < kThreads; ++j) {
    if (j < t) at += counts[j];
    total += counts[j];
  }
  const uint32_t bm_bytes = static_cast<uint32_t>(CeilDiv(m, 8));
  if (total != nnz || (m % 8 && (bitmap[bm_bytes - 1] >> (m % 8)))) {
    if (t == 0) Fail(status, kBadBitmap);
    return;
  }
  for (uint32_t i = lo; i < hi; ++i) {
    if ((bitmap[i >> 3] >> (i & 7)) & 1u) {
      out[i] = join(at++);
    } else {
      out[i] = 0;
    }
  }
}

// ---------------------------------------------------------------------------
// Handlers.
// ---------------------------------------------------------------------------

ffi::Error NoScratch(const std::string& name, uint64_t bytes) {
  return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                    name + ": cannot allocate " + std::to_string(bytes) + " bytes of scratch");
}

template <DTypeId D>
ffi::Error EncodeFixedOn(const std::string& name, cudaStream_t stream,
                         ffi::ScratchAllocator& scratch, const void* x, uint64_t n, uint8_t* out,
                         int32_t* nbytes_out) {
  const FixedLayout l = MakeFixedLayout(D, n);
  const uint64_t bytes = 2 * 256 + 2 * (l.blocks + 1) * sizeof(uint32_t) + 2 * 256;
  std::optional<uint8_t*> buf = Allocate(scratch, bytes);
  if (!buf) return NoScratch(name, bytes);
  Carver carve{*buf};
  uint64_t* nbytes = carve.Take<uint64_t>(1);
  uint32_t* sums = carve.Take<uint32_t>(2);
  uint32_t* spill_size = carve.Take<uint32_t>(l.blocks + 1);
  uint32_t* spill_offset = carve.Take<uint32_t>(l.blocks + 1);
  const Bits<D>* src = static_cast<const Bits<D>*>(x);
  JAXCC_CUDA(name, cudaMemsetAsync(spill_size, 0, (l.blocks + 1) * sizeof(uint32_t), stream));
  if (l.blocks) {
    FixedEncodeKernel<D><<<l.blocks, kThreads, 0, stream>>>(src, n, out, spill_size);
    JAXCC_LAUNCHED(name);
  }
  ffi::Error err = ExclusiveScan(name, stream, scratch, spill_size, spill_offset, l.blocks);
  if (err.failure()) return err;
  if (l.blocks) {
    FixedSpillKernel<D><<<l.blocks, kThreads, 0, stream>>>(src, n, out, spill_offset);
    JAXCC_LAUNCHED(name);
  }
  const int fill_blocks = static_cast<int>(std::max<uint64_t>(1, Min<uint64_t>(CeilDiv(l.static_bytes - l.spill, kThreads), 1024)));
  FixedSizeKernel<<<fill_blocks, kThreads, 0, stream>>>(out, l, spill_offset + l.blocks, nbytes);
  JAXCC_LAUNCHED(name);
  return Finish(name, stream, out, kFixed, D, n, l.max_bytes, nbytes, sums, nbytes_out);
}

template <DTypeId D>
ffi::Error EncodeEntropyOn(const std::string& name, cudaStream_t stream,
                           ffi::ScratchAllocator& scratch, const void* x, uint64_t n, uint8_t* out,
                           int32_t* nbytes_out) {
  using Slots = EntropySlots<D>;
  const uint64_t blocks = CeilDiv(n, kEntropyBlock);
  const uint64_t bytes = 1024 + 2 * (blocks + 1) * sizeof(uint32_t) + 512 +
                         blocks * (2 * Slots::kPlanes * kEntropyBlock + kEntropyBlock / 8 +
                                   Slots::kSlot + 1024);
  std::optional<uint8_t*> buf = Allocate(scratch, bytes);
  if (!buf) return NoScratch(name, bytes);
  Carver carve{*buf};
  uint64_t* nbytes = carve.Take<uint64_t>(1);
  uint32_t* sums = carve.Take<uint32_t>(2);
  Slots s;
  s.sizes = carve.Take<uint32_t>(blocks + 1);
  s.offsets = carve.Take<uint32_t>(blocks + 1);
  s.planes = carve.Take<uint8_t>(blocks * Slots::kPlanes * kEntropyBlock);
  s.nz = carve.Take<uint8_t>(blocks * Slots::kPlanes * kEntropyBlock);
  s.bitmap = carve.Take<uint8_t>(blocks * (kEntropyBlock / 8));
  s.slots = carve.Take<uint8_t>(blocks * Slots::kSlot);
  JAXCC_CUDA(name, cudaMemsetAsync(s.sizes, 0, (blocks + 1) * sizeof(uint32_t), stream));
  if (blocks) {
    EntropyEncodeKernel<D><<<blocks, kThreads, 0, stream>>>(static_cast<const Bits<D>*>(x), n, s);
    JAXCC_LAUNCHED(name);
  }
  ffi::Error err = ExclusiveScan(name, stream, scratch, s.sizes, s.offsets, blocks);
  if (err.failure()) return err;
  if (blocks) {
    EntropyCompactKernel<D><<<blocks, kThreads, 0, stream>>>(out, blocks, s);
    JAXCC_LAUNCHED(name);
  }
  EntropySizeKernel<<<1, 1, 0, stream>>>(blocks, s.offsets, nbytes);
  JAXCC_LAUNCHED(name);
  return Finish(name, stream, out, kEntropy, D, n, EntropyMaxBytes(D, n), nbytes, sums,
                nbytes_out);
}

template <CodecId C>
ffi::Error EncodeImpl(cudaStream_t stream, ffi::ScratchAllocator scratch, ffi::AnyBuffer x,
                      ffi::Result<ffi::Buffer<ffi::U8>> payload,
                      ffi::Result<ffi::BufferR0<ffi::S32>> nbytes) {
  const std::string name = Name(C, true);
  DTypeId d;
  ffi::Error err = CheckEncodeArgs(C, x, payload->element_count(), &d);
  if (!err.success()) return err;
  const uint64_t n = x.element_count();
  uint8_t* out = payload->typed_data();
  int32_t* size = nbytes->typed_data();
  const void* src = x.untyped_data();
  if constexpr (C == kFixed) {
    switch (d) {
      case kBF16: return EncodeFixedOn<kBF16>(name, stream, scratch, src, n, out, size);
      case kF16: return EncodeFixedOn<kF16>(name, stream, scratch, src, n, out, size);
      default: return EncodeFixedOn<kF32>(name, stream, scratch, src, n, out, size);
    }
  } else {
    switch (d) {
      case kBF16: return EncodeEntropyOn<kBF16>(name, stream, scratch, src, n, out, size);
      case kF16: return EncodeEntropyOn<kF16>(name, stream, scratch, src, n, out, size);
      default: return EncodeEntropyOn<kF32>(name, stream, scratch, src, n, out, size);
    }
  }
}

// Checks a header copied to the host; "" if it matches.
std::string CheckHeader(const uint8_t* head, uint64_t buffer_bytes, int64_t nbytes_arg,
                        CodecId codec, DTypeId dtype, uint64_t n) {
  Header h;
  if (!ReadHeader(head, &h)) return "bad header: not a jaxcc encoding (wrong magic bytes)";
  const int block_log2 = codec == kFixed ? kFixedBlockLog2 : kEntropyBlockLog2;
  if (h.codec != codec) {
    return "bad header: codec id " + std::to_string(h.codec) + ", expected " +
           std::to_string(codec) + " (decoded with the wrong codec?)";
  }
  if (h.dtype != dtype || h.block_log2 != block_log2) {
    return "bad header: dtype id " + std::to_string(h.dtype) + " / block 2^" +
           std::to_string(h.block_log2) + ", expected dtype id " + std::to_string(dtype);
  }
  if (h.count != n) {
    return "bad header: " + std::to_string(h.count) + " elements, expected " + std::to_string(n);
  }
  if (nbytes_arg < 0 || h.nbytes != static_cast<uint64_t>(nbytes_arg)) {
    return "size mismatch: the header says " + std::to_string(h.nbytes) + " bytes, nbytes says " +
           std::to_string(nbytes_arg);
  }
  if (h.nbytes > buffer_bytes || h.nbytes < kHeaderBytes) {
    return "truncated: the header says " + std::to_string(h.nbytes) +
           " bytes but the buffer holds " + std::to_string(buffer_bytes);
  }
  return "";
}

template <DTypeId D>
ffi::Error DecodeFixedOn(const std::string& name, cudaStream_t stream,
                         ffi::ScratchAllocator& scratch, const uint8_t* in, uint64_t nbytes,
                         uint64_t n, void* y, uint32_t* status) {
  const FixedLayout l = MakeFixedLayout(D, n);
  if (nbytes < l.static_bytes) {
    return ffi::Error::InvalidArgument(name + ": cannot decode: truncated: " +
                                       std::to_string(nbytes) + " bytes, less than the static size " +
                                       std::to_string(l.static_bytes));
  }
  const uint64_t bytes = 2 * (l.blocks + 1) * sizeof(uint32_t) + 512;
  std::optional<uint8_t*> buf = Allocate(scratch, bytes);
  if (!buf) return NoScratch(name, bytes);
  Carver carve{*buf};
  uint32_t* spill_size = carve.Take<uint32_t>(l.blocks + 1);
  uint32_t* spill_offset = carve.Take<uint32_t>(l.blocks + 1);
  JAXCC_CUDA(name, cudaMemsetAsync(spill_size, 0, (l.blocks + 1) * sizeof(uint32_t), stream));
  if (l.blocks) {
    FixedSpillSizesKernel<D><<<CeilDiv(l.blocks, kThreads), kThreads, 0, stream>>>(in, n, spill_size);
    JAXCC_LAUNCHED(name);
  }
  ffi::Error err = ExclusiveScan(name, stream, scratch, spill_size, spill_offset, l.blocks);
  if (err.failure()) return err;
  if (l.blocks) {
    FixedDecodeKernel<D><<<l.blocks, kThreads, 0, stream>>>(in, nbytes, n, spill_offset,
                                                            static_cast<Bits<D>*>(y), status);
    JAXCC_LAUNCHED(name);
  }
  // The total size check: status[1] = spill total (u32; < 2^31 bytes overall).
  JAXCC_CUDA(name, cudaMemcpyAsync(status + 1, spill_offset + l.blocks, sizeof(uint32_t),
                                   cudaMemcpyDeviceToDevice, stream));
  return ffi::Error::Success();
}

template <DTypeId D>
ffi::Error DecodeEntropyOn(const std::string& name, cudaStream_t stream,
                           ffi::ScratchAllocator& scratch, const uint8_t* in, uint64_t nbytes,
                           uint64_t n, void* y, uint32_t* status) {
  constexpr int kPlanes = D == kF32 ? 4 : D == kF16 ? 3 : 2;
  const uint64_t blocks = CeilDiv(n, kEntropyBlock);
  if (kHeaderBytes + 4 * blocks > nbytes) {
    return ffi::Error::InvalidArgument(name + ": cannot decode: truncated: the block table does not fit");
  }
  const uint64_t bytes = 2 * (blocks + 1) * sizeof(uint32_t) + 512 +
                         blocks * (kPlanes + 1) * kEntropyBlock;
  std::optional<uint8_t*> buf = Allocate(scratch, bytes);
  if (!buf) return NoScratch(name, bytes);
  Carver carve{*buf};
  uint32_t* sizes = carve.Take<uint32_t>(blocks + 1);
  uint32_t* offsets = carve.Take<uint32_t>(blocks + 1);
  uint8_t* planes = carve.Take<uint8_t>(blocks * (kPlanes + 1) * kEntropyBlock);
  JAXCC_CUDA(name, cudaMemsetAsync(sizes, 0, (blocks + 1) * sizeof(uint32_t), stream));
  if (blocks) {
    EntropyBlockSizesKernel<<<CeilDiv(blocks, kThreads), kThreads, 0, stream>>>(in, blocks, sizes);
    JAXCC_LAUNCHED(name);
  }
  ffi::Error err = ExclusiveScan(name, stream, scratch, sizes, offsets, blocks);
  if (err.failure()) return err;
  EntropyCheckSizeKernel<<<1, 1, 0, stream>>>(blocks, sizes, offsets, nbytes, status);
  JAXCC_LAUNCHED(name);
  if (blocks) {
    EntropyDecodeKernel<D><<<blocks, kThreads, 0, stream>>>(in, nbytes, n, offsets, planes,
                                                            static_cast<Bits<D>*>(y), status);
    JAXCC_LAUNCHED(name);
  }
  return ffi::Error::Success();
}

template <CodecId C>
ffi::Error DecodeImpl(cudaStream_t stream, ffi::ScratchAllocator scratch,
                      ffi::Buffer<ffi::U8> payload, ffi::BufferR0<ffi::S32> nbytes_arg,
                      ffi::Result<ffi::AnyBuffer> y) {
  const std::string name = Name(C, false);
  DTypeId d;
  ffi::Error err = CheckDType(name, y->element_type(), &d);
  if (!err.success()) return err;
  const uint64_t n = y->element_count();
  const uint64_t buffer_bytes = payload.element_count();
  const uint8_t* in = payload.typed_data();
  if (buffer_bytes < kHeaderBytes) {
    return ffi::Error::InvalidArgument(name + ": cannot decode: truncated: the buffer holds " +
                                       std::to_string(buffer_bytes) +
                                       " bytes, less than the 32-byte header");
  }
  // The header and nbytes, to the host.
  uint8_t head[kHeaderBytes];
  int32_t claimed = 0;
  JAXCC_CUDA(name, cudaMemcpyAsync(head, in, kHeaderBytes, cudaMemcpyDeviceToHost, stream));
  JAXCC_CUDA(name, cudaMemcpyAsync(&claimed, nbytes_arg.typed_data(), sizeof(int32_t),
                                   cudaMemcpyDeviceToHost, stream));
  JAXCC_CUDA(name, cudaStreamSynchronize(stream));
  const std::string bad = CheckHeader(head, buffer_bytes, claimed, C, d, n);
  if (!bad.empty()) return ffi::Error::InvalidArgument(name + ": cannot decode: " + bad);
  const uint64_t nbytes = static_cast<uint64_t>(claimed);
  // Device words: status, spill total (fixed), checksum sums, nbytes.
  std::optional<uint8_t*> buf = Allocate(scratch, 512);
  if (!buf) return NoScratch(name, 512);
  Carver carve{*buf};
  uint32_t* words = carve.Take<uint32_t>(4);
  uint64_t* dev_nbytes = carve.Take<uint64_t>(1);
  JAXCC_CUDA(name, cudaMemsetAsync(words, 0, 4 * sizeof(uint32_t), stream));
  JAXCC_CUDA(name, cudaMemcpyAsync(dev_nbytes, &nbytes, sizeof(uint64_t), cudaMemcpyHostToDevice,
                                   stream));
  ChecksumKernel<<<ChecksumBlocks(nbytes), kThreads, 0, stream>>>(in, dev_nbytes, words + 2);
  JAXCC_LAUNCHED(name);
  void* dst = y->untyped_data();
  err = ffi::Error::Success();
  if constexpr (C == kFixed) {
    switch (d) {
      case kBF16: err = DecodeFixedOn<kBF16>(name, stream, scratch, in, nbytes, n, dst, words); break;
      case kF16: err = DecodeFixedOn<kF16>(name, stream, scratch, in, nbytes, n, dst, words); break;
      default: err = DecodeFixedOn<kF32>(name, stream, scratch, in, nbytes, n, dst, words); break;
    }
  } else {
    switch (d) {
      case kBF16: err = DecodeEntropyOn<kBF16>(name, stream, scratch, in, nbytes, n, dst, words); break;
      case kF16: err = DecodeEntropyOn<kF16>(name, stream, scratch, in, nbytes, n, dst, words); break;
      default: err = DecodeEntropyOn<kF32>(name, stream, scratch, in, nbytes, n, dst, words); break;
    }
  }
  if (err.failure()) return err;
  uint32_t host[4];
  JAXCC_CUDA(name, cudaMemcpyAsync(host, words, sizeof(host), cudaMemcpyDeviceToHost, stream));
  JAXCC_CUDA(name, cudaStreamSynchronize(stream));
  Header h;
  ReadHeader(head, &h);
  if (host[2] != h.sum_a || host[3] != h.sum_b) {
    return ffi::Error::InvalidArgument(name + ": cannot decode: checksum mismatch: the data is corrupted");
  }
  if (host[0] != kOk) {
    return ffi::Error::InvalidArgument(name + ": cannot decode: " + StatusText(host[0]));
  }
  if constexpr (C == kFixed) {
    const FixedLayout l = MakeFixedLayout(d, n);
    const uint64_t expected = std::max(l.static_bytes, l.spill + host[1]);
    if (nbytes != expected) {
      return ffi::Error::InvalidArgument(name + ": cannot decode: size mismatch: " +
                                         std::to_string(nbytes) + " bytes, the blocks need " +
                                         std::to_string(expected));
    }
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace codec
}  // namespace jaxcc

#define JAXCC_CODEC_CUDA_HANDLERS(Name, Codec)                                                   \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxccCodecEncode##Name##Cuda, jaxcc::codec::EncodeImpl<Codec>,   \
                                ffi::Ffi::Bind()                                                 \
                                    .Ctx<ffi::PlatformStream<cudaStream_t>>()  /* stream */      \
                                    .Ctx<ffi::ScratchAllocator>()              /* scratch */     \
                                    .Arg<ffi::AnyBuffer>()                     /* x */           \
                                    .Ret<ffi::Buffer<ffi::U8>>()               /* payload */     \
                                    .Ret<ffi::BufferR0<ffi::S32>>());          /* nbytes */      \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxccCodecDecode##Name##Cuda, jaxcc::codec::DecodeImpl<Codec>,   \
                                ffi::Ffi::Bind()                                                 \
                                    .Ctx<ffi::PlatformStream<cudaStream_t>>()  /* stream */      \
                                    .Ctx<ffi::ScratchAllocator>()              /* scratch */     \
                                    .Arg<ffi::Buffer<ffi::U8>>()               /* payload */     \
                                    .Arg<ffi::BufferR0<ffi::S32>>()            /* nbytes */      \
                                    .Ret<ffi::AnyBuffer>())                    /* y */

JAXCC_CODEC_CUDA_HANDLERS(Fixed, jaxcc::codec::kFixed);
JAXCC_CODEC_CUDA_HANDLERS(Entropy, jaxcc::codec::kEntropy);
