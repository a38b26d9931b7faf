// The "fixed" codec on the GPU (format: jaxcc/codec.h): one thread per
// element, one 256-thread CUDA block per codec block; the spill area is placed
// by an exclusive scan of the per-block spill sizes. Segmented pieces
// (jaxcc/piece_layout.h) have the fused hop: one kernel decodes a block of
// every received piece, sums and plans its encoding; the spill offsets and
// segment sizes are scanned per segment, then one kernel writes the blocks.
#include <cub/cub.cuh>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>

#include "codec_cuda.h"
#include "jaxcc/codec.h"
#include "jaxcc/dtypes.h"
#include "jaxcc/piece_layout.h"
#include "jaxcc/reduce.h"
#include "xla/ffi/api/ffi.h"

namespace jaxcc {
namespace codec {
namespace {

// ORs v over the 8-lane group of this lane (lanes 8g..8g+7 of a warp).
__device__ inline uint32_t GroupOr8(uint32_t v) {
  v |= __shfl_xor_sync(0xffffffffu, v, 1);
  v |= __shfl_xor_sync(0xffffffffu, v, 2);
  v |= __shfl_xor_sync(0xffffffffu, v, 4);
  return v;
}

// The base and esc byte of a block of m elements whose thread i holds exponent e
// (live: i < m). Every thread of the block calls it.
template <DTypeId D>
__device__ inline void FixedBlockMeta(uint32_t e, bool live, uint32_t m, uint32_t* base,
                                      uint32_t* esc) {
  using Reduce = cub::BlockReduce<uint32_t, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  __shared__ uint32_t shared_base, shared_esc;
  const uint32_t mx = Reduce(temp).Reduce(e, MaxOp());
  if (threadIdx.x == 0) shared_base = FixedBase(mx);
  __syncthreads();
  *base = shared_base;
  const uint32_t escapes = Reduce(temp).Sum(live && FixedEscapes(e, *base) ? 1u : 0u);
  if (threadIdx.x == 0) shared_esc = FixedEscByte(D, escapes, m);
  __syncthreads();
  *esc = shared_esc;
}

// Block blk's table entry, codes and planes in the encoding of n elements at
// out (layout l), from thread i's element bits v. Every thread calls it.
template <DTypeId D>
__device__ inline void WriteFixedBlock(uint32_t v, bool live, uint32_t m, uint32_t base,
                                       uint32_t esc, uint8_t* out, const FixedLayout& l,
                                       uint64_t n, uint64_t blk) {
  const uint64_t start = blk * kFixedBlock;
  const uint32_t i = threadIdx.x;
  const uint32_t e = Exponent<D>(v);
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
  }
}

// A block's spill at s from thread i's exponent e. Every thread calls it.
template <DTypeId D>
__device__ inline void WriteFixedSpill(uint32_t e, bool live, uint32_t m, uint32_t base,
                                       uint32_t esc, uint8_t* s) {
  if (esc == 0) return;
  const uint32_t i = threadIdx.x;
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

// Pass 1: table entry, codes, planes; the block's spill size into spill_size.
template <DTypeId D>
__global__ void __launch_bounds__(kThreads)
    FixedEncodeKernel(const Bits<D>* x, uint64_t n, uint8_t* out, uint32_t* spill_size) {
  const FixedLayout l = MakeFixedLayout(D, n);
  const uint64_t blk = blockIdx.x;
  const uint32_t m = static_cast<uint32_t>(Min<uint64_t>(kFixedBlock, n - blk * kFixedBlock));
  const bool live = threadIdx.x < m;
  const uint32_t v = live ? x[blk * kFixedBlock + threadIdx.x] : 0u;
  uint32_t base, esc;
  FixedBlockMeta<D>(Exponent<D>(v), live, m, &base, &esc);
  WriteFixedBlock<D>(v, live, m, base, esc, out, l, n, blk);
  if (threadIdx.x == 0) spill_size[blk] = static_cast<uint32_t>(FixedBlockSpill(D, esc, m));
}

// Pass 2: the spill of the blocks that have one, at the scanned offsets.
template <DTypeId D>
__global__ void __launch_bounds__(kThreads)
    FixedSpillKernel(const Bits<D>* x, uint64_t n, uint8_t* out, const uint32_t* spill_offset) {
  const FixedLayout l = MakeFixedLayout(D, n);
  const uint64_t blk = blockIdx.x;
  const uint32_t m = static_cast<uint32_t>(Min<uint64_t>(kFixedBlock, n - blk * kFixedBlock));
  const uint32_t base = out[l.table + 2 * blk];
  const uint32_t esc = out[l.table + 2 * blk + 1];
  const bool live = threadIdx.x < m;
  const uint32_t e = live ? Exponent<D>(x[blk * kFixedBlock + threadIdx.x]) : 0u;
  WriteFixedSpill<D>(e, live, m, base, esc, out + l.spill + spill_offset[blk]);
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

// Decodes element i = threadIdx.x of block blk of the encoding of n elements at
// `in` (layout l, nbytes bytes; the block's spill at l.spill + spill_offset)
// into *v. Returns the failure (kOk if none); the same in every thread, so a
// block that fails leaves as one. Every thread calls it.
template <DTypeId D>
__device__ inline uint32_t DecodeFixedBlock(const uint8_t* in, uint64_t nbytes,
                                            const FixedLayout& l, uint64_t n, uint64_t blk,
                                            uint32_t spill_offset, uint32_t* v) {
  constexpr int kExpBits = D == kF16 ? 5 : 8;
  const uint64_t start = blk * kFixedBlock;
  const uint32_t m = static_cast<uint32_t>(Min<uint64_t>(kFixedBlock, n - start));
  const uint32_t i = threadIdx.x;
  if (nbytes < l.static_bytes) return kBadSize;
  const uint32_t base = in[l.table + 2 * blk];
  const uint32_t esc = in[l.table + 2 * blk + 1];
  const uint64_t need = FixedBlockSpill(D, esc, m);
  const uint64_t at = l.spill + spill_offset;
  if (base >= (1u << kExpBits) || base < 15 ||
      (esc != kFixedRawExponents && 2 * esc > FixedRawSpill(D, m)) || at + need > nbytes) {
    return kBadBlockHeader;
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
  if (__syncthreads_or(bad_escape)) return kBadEscape;
  if (esc != kFixedRawExponents && i < esc) e[s[2 * i]] = s[2 * i + 1];
  __syncthreads();
  if (i >= m) return kOk;
  if constexpr (D == kBF16) {
    *v = Join<D>(e[i], in[l.planes + start + i]);
  } else if constexpr (D == kF32) {
    const uint8_t* p1 = in + l.planes + start + i;
    *v = Join<D>(e[i], p1[0], p1[n], p1[2 * n]);
  } else {
    const uint8_t* p3 = in + l.packed3 + start / 8 * 3;
    const uint32_t g = i / 8, k = i % 8;
    const uint32_t byte = 3 * g + (3 * k) / 8, sh = (3 * k) % 8;
    uint32_t two = p3[byte];
    if (sh > 5) two |= uint32_t{p3[byte + 1]} << 8;
    *v = Join<D>(e[i], in[l.planes + start + i], (two >> sh) & 7u);
  }
  return kOk;
}

template <DTypeId D>
__global__ void __launch_bounds__(kThreads)
    FixedDecodeKernel(const uint8_t* in, uint64_t nbytes, uint64_t n, const uint32_t* spill_offset,
                      Bits<D>* y, uint32_t* status) {
  const FixedLayout l = MakeFixedLayout(D, n);
  const uint64_t blk = blockIdx.x;
  uint32_t v = 0;
  const uint32_t fail = DecodeFixedBlock<D>(in, nbytes, l, n, blk, spill_offset[blk], &v);
  if (fail != kOk) {
    if (threadIdx.x == 0) Fail(status, fail);
    return;
  }
  const uint64_t at = blk * kFixedBlock + threadIdx.x;
  if (at < n) y[at] = static_cast<Bits<D>>(v);
}

// ---------------------------------------------------------------------------
// Segmented pieces (jaxcc/piece_layout.h): fixed block b of a piece is block
// b % 256 of segment b / 256.
// ---------------------------------------------------------------------------

template <DTypeId D>
using Elem = std::conditional_t<D == kF32, float, std::conditional_t<D == kBF16, BFloat16, Float16>>;

template <DTypeId D>
__device__ inline Accumulator<Elem<D>> BitsToAccumulator(uint32_t v) {
  if constexpr (D == kF32) return BitsToFloat(v);
  else return ToAccumulator(Elem<D>{static_cast<uint16_t>(v)});
}

template <DTypeId D>
__device__ inline uint32_t AccumulatorToBits(Accumulator<Elem<D>> a) {
  if constexpr (D == kF32) return FloatToBits(a);
  else return FromAccumulator<Elem<D>>(a).bits;
}

// The spill offsets of a received piece's blocks within their segments, and
// the size check of each segment (nbytes = max(static size, end of spill)).
// Grid: one block per segment; thread j owns fixed block j of it.
template <DTypeId D>
__global__ void __launch_bounds__(kThreads)
    FixedPieceSpillKernel(const uint8_t* in, const uint64_t* offsets, uint64_t n,
                          uint32_t* spill_offset, uint32_t* status) {
  const uint64_t s = blockIdx.x;
  const uint64_t ms = piece::SegmentLength(n, s);
  const FixedLayout l = MakeFixedLayout(D, ms);
  const uint8_t* seg = in + offsets[s];
  const uint64_t nbytes = offsets[s + 1] - offsets[s];
  const uint32_t j = threadIdx.x;
  const bool ok = nbytes >= l.static_bytes;
  uint32_t size = 0;
  if (ok && j < l.blocks) {
    size = static_cast<uint32_t>(FixedBlockSpill(
        D, seg[l.table + 2 * j + 1], Min<uint64_t>(kFixedBlock, ms - uint64_t{j} * kFixedBlock)));
  }
  using Scan = cub::BlockScan<uint32_t, kThreads>;
  __shared__ typename Scan::TempStorage temp;
  uint32_t at, total;
  Scan(temp).ExclusiveSum(size, at, total);
  if (j < l.blocks) spill_offset[s * piece::kSegmentFixedBlocks + j] = at;
  if (j == 0 && (!ok || nbytes != max(l.static_bytes, l.spill + total))) Fail(status, kBadSize);
}

// The fused hop over fixed block b of a piece of n elements: decodes block b
// of each of the k received pieces, adds them to own's block in order (the
// jaxcc_reduce contract: accumulator type, one rounding; with add_own false
// and k = 1 a copy of the decoded bits), writes the result into own and, with
// meta, the block's base and esc byte (meta) and spill size of its encoding.
template <DTypeId D>
__global__ void __launch_bounds__(kThreads)
    FixedHopKernel(const piece::HopInput* inputs, uint32_t k, bool add_own, Bits<D>* own,
                   uint64_t n, uint16_t* meta, uint32_t* spill_size) {
  const uint64_t b = blockIdx.x;
  const uint64_t s = b / piece::kSegmentFixedBlocks, j = b % piece::kSegmentFixedBlocks;
  const uint64_t ms = piece::SegmentLength(n, s);
  const FixedLayout l = MakeFixedLayout(D, ms);
  const uint64_t at = b * kFixedBlock + threadIdx.x;
  const uint32_t m = static_cast<uint32_t>(Min<uint64_t>(kFixedBlock, n - b * kFixedBlock));
  const bool live = threadIdx.x < m;
  uint32_t v = live ? uint32_t{own[at]} : 0u;
  Accumulator<Elem<D>> acc = BitsToAccumulator<D>(v);
  for (uint32_t i = 0; i < k; ++i) {
    const piece::HopInput in = inputs[i];
    const uint64_t off = in.offsets[s];
    uint32_t x = 0;
    const uint32_t fail = DecodeFixedBlock<D>(in.data + off, in.offsets[s + 1] - off, l, ms, j,
                                              in.spill[b], &x);
    if (fail != kOk && threadIdx.x == 0) Fail(in.status, fail);
    if (i == 0 && !add_own) {
      acc = BitsToAccumulator<D>(x);
      v = x;
    } else {
      acc = AccumulatorAdd(acc, BitsToAccumulator<D>(x));
    }
  }
  if (k > 1 || (k == 1 && add_own)) v = AccumulatorToBits<D>(acc);
  if (!live) v = 0;
  if (live && k > 0) own[at] = static_cast<Bits<D>>(v);
  if (meta == nullptr) return;
  uint32_t base, esc;
  FixedBlockMeta<D>(Exponent<D>(v), live, m, &base, &esc);
  if (threadIdx.x == 0) {
    meta[b] = static_cast<uint16_t>(base | esc << 8);
    spill_size[b] = static_cast<uint32_t>(FixedBlockSpill(D, esc, m));
  }
}

// Per segment of the encoded result: its blocks' spill offsets and its size.
// Grid: one block per segment; thread j owns fixed block j of it.
template <DTypeId D>
__global__ void __launch_bounds__(kThreads)
    FixedPieceSizesKernel(const uint32_t* spill_size, uint64_t n, uint32_t* spill_offset,
                          uint32_t* sizes) {
  const uint64_t s = blockIdx.x;
  const FixedLayout l = MakeFixedLayout(D, piece::SegmentLength(n, s));
  const uint32_t j = threadIdx.x;
  const uint64_t b = s * piece::kSegmentFixedBlocks + j;
  using Scan = cub::BlockScan<uint32_t, kThreads>;
  __shared__ typename Scan::TempStorage temp;
  uint32_t at, total;
  Scan(temp).ExclusiveSum(j < l.blocks ? spill_size[b] : 0u, at, total);
  if (j < l.blocks) spill_offset[b] = at;
  if (j == 0) sizes[s] = static_cast<uint32_t>(max(l.static_bytes, l.spill + total));
}

// Writes fixed block b of the encoded result (own holds the values) into its
// segment at out + offsets[s]; the segment's last block zero-fills the unused
// spill pool.
template <DTypeId D>
__global__ void __launch_bounds__(kThreads)
    FixedPieceWriteKernel(const Bits<D>* own, uint64_t n, const uint16_t* meta,
                          const uint32_t* spill_size, const uint32_t* spill_offset,
                          const uint64_t* offsets, uint8_t* out) {
  const uint64_t b = blockIdx.x;
  const uint64_t s = b / piece::kSegmentFixedBlocks, j = b % piece::kSegmentFixedBlocks;
  const uint64_t ms = piece::SegmentLength(n, s);
  const FixedLayout l = MakeFixedLayout(D, ms);
  const uint32_t m = static_cast<uint32_t>(Min<uint64_t>(kFixedBlock, n - b * kFixedBlock));
  const bool live = threadIdx.x < m;
  const uint32_t v = live ? uint32_t{own[b * kFixedBlock + threadIdx.x]} : 0u;
  const uint32_t base = meta[b] & 255u, esc = meta[b] >> 8;
  uint8_t* seg = out + offsets[s];
  WriteFixedBlock<D>(v, live, m, base, esc, seg, l, ms, j);
  WriteFixedSpill<D>(Exponent<D>(v), live, m, base, esc, seg + l.spill + spill_offset[b]);
  if (j + 1 == l.blocks) {
    const uint64_t end = offsets[s + 1] - offsets[s];
    for (uint64_t x = l.spill + spill_offset[b] + spill_size[b] + threadIdx.x; x < end;
         x += kThreads) {
      seg[x] = 0;
    }
  }
}

}  // namespace

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
ffi::Error FixedPieceHopOn(const std::string& name, cudaStream_t stream,
                           const piece::HopInput* inputs, piece::HopInput* records, uint32_t k,
                           bool sum, void* own, uint64_t n, uint8_t* work,
                           const piece::HopWork& w, uint8_t* out, uint32_t* sizes,
                           uint64_t* offsets) {
  const uint64_t blocks = CeilDiv(n, kFixedBlock);
  const uint64_t segments = piece::Segments(n);
  if (blocks == 0) return ffi::Error::Success();
  for (uint32_t i = 0; i < k; ++i) {
    uint32_t* spill = reinterpret_cast<uint32_t*>(work + w.spill + i * piece::Align(4 * blocks));
    records[i] = inputs[i];
    records[i].spill = spill;
    FixedPieceSpillKernel<D><<<segments, kThreads, 0, stream>>>(
        records[i].data, records[i].offsets, n, spill, records[i].status);
    JAXCC_LAUNCHED(name);
  }
  auto* dev_inputs = reinterpret_cast<piece::HopInput*>(work + w.inputs);
  if (k > 0) {
    JAXCC_CUDA(name, cudaMemcpyAsync(dev_inputs, records, k * sizeof(piece::HopInput),
                                     cudaMemcpyHostToDevice, stream));
  }
  auto* x = static_cast<Bits<D>*>(own);
  auto* meta = out ? reinterpret_cast<uint16_t*>(work + w.meta) : nullptr;
  auto* spill_size = reinterpret_cast<uint32_t*>(work + w.spill_size);
  auto* spill_offset = reinterpret_cast<uint32_t*>(work + w.spill_offset);
  FixedHopKernel<D><<<blocks, kThreads, 0, stream>>>(dev_inputs, k, sum, x, n, meta, spill_size);
  JAXCC_LAUNCHED(name);
  if (out == nullptr) return ffi::Error::Success();
  FixedPieceSizesKernel<D><<<segments, kThreads, 0, stream>>>(spill_size, n, spill_offset, sizes);
  JAXCC_LAUNCHED(name);
  ffi::Error err = ScanSegments(name, stream, sizes, segments, offsets);
  if (err.failure()) return err;
  FixedPieceWriteKernel<D><<<blocks, kThreads, 0, stream>>>(x, n, meta, spill_size, spill_offset,
                                                            offsets, out);
  JAXCC_LAUNCHED(name);
  return FinishSegments(name, stream, out, offsets, kFixed, D, n);
}

#define JAXCC_FIXED_PIECE(D)                                                                   \
  template ffi::Error FixedPieceHopOn<D>(const std::string&, cudaStream_t,                      \
                                         const piece::HopInput*, piece::HopInput*, uint32_t,     \
                                         bool, void*, uint64_t, uint8_t*, const piece::HopWork&, \
                                         uint8_t*, uint32_t*, uint64_t*);
JAXCC_FIXED_PIECE(kBF16)
JAXCC_FIXED_PIECE(kF16)
JAXCC_FIXED_PIECE(kF32)
#undef JAXCC_FIXED_PIECE

// The launchers of each dtype, for codec.cu.
template ffi::Error EncodeFixedOn<kBF16>(const std::string&, cudaStream_t, ffi::ScratchAllocator&,
                                         const void*, uint64_t, uint8_t*, int32_t*);
template ffi::Error EncodeFixedOn<kF16>(const std::string&, cudaStream_t, ffi::ScratchAllocator&,
                                        const void*, uint64_t, uint8_t*, int32_t*);
template ffi::Error EncodeFixedOn<kF32>(const std::string&, cudaStream_t, ffi::ScratchAllocator&,
                                        const void*, uint64_t, uint8_t*, int32_t*);
template ffi::Error DecodeFixedOn<kBF16>(const std::string&, cudaStream_t, ffi::ScratchAllocator&,
                                         const uint8_t*, uint64_t, uint64_t, void*, uint32_t*);
template ffi::Error DecodeFixedOn<kF16>(const std::string&, cudaStream_t, ffi::ScratchAllocator&,
                                        const uint8_t*, uint64_t, uint64_t, void*, uint32_t*);
template ffi::Error DecodeFixedOn<kF32>(const std::string&, cudaStream_t, ffi::ScratchAllocator&,
                                        const uint8_t*, uint64_t, uint64_t, void*, uint32_t*);

}  // namespace codec
}  // namespace jaxcc
