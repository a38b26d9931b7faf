// The "entropy" codec on the GPU (format: jaxcc/codec.h): one 256-thread CUDA
// block per 65536-element codec block: shared histograms, the block's plan by
// one thread (the shared planner), then one thread per 1024-symbol Huffman
// sub-stream. Blocks are encoded into worst-case slots of a scratch buffer
// and compacted after a scan of their sizes. Decoding parses each block's
// plane headers in one thread, builds the decode table in shared memory and
// decodes one sub-stream per thread. A segmented piece (jaxcc/piece_layout.h)
// is one block per segment, framed as its own encoding.
#include <cub/cub.cuh>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "codec_cuda.h"
#include "jaxcc/codec.h"
#include "xla/ffi/api/ffi.h"

namespace jaxcc {
namespace codec {
namespace {

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

// Decodes the block of m elements at [p, end) (planes bounded by limit) into
// out, with (planes + 1) x 65536 bytes of scratch at `planes`; failures into
// status. Every thread of the CUDA block calls it.
template <DTypeId D>
__device__ void DecodeEntropyBlock(const uint8_t* p, const uint8_t* end, const uint8_t* limit,
                                   uint32_t m, uint8_t* planes, Bits<D>* out, uint32_t* status) {
  constexpr int kPlanes = D == kF32 ? 4 : D == kF16 ? 3 : 2;
  const uint32_t t = threadIdx.x;
  if (end > limit || p >= end) {
    if (t == 0) Fail(status, kBadSize);
    return;
  }
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

template <DTypeId D>
__global__ void __launch_bounds__(kThreads)
    EntropyDecodeKernel(const uint8_t* in, uint64_t nbytes, uint64_t n, const uint32_t* offsets,
                        uint8_t* scratch, Bits<D>* y, uint32_t* status) {
  constexpr int kPlanes = D == kF32 ? 4 : D == kF16 ? 3 : 2;
  const uint64_t blocks = CeilDiv(n, kEntropyBlock);
  const uint64_t blk = blockIdx.x;
  const uint64_t start = blk * kEntropyBlock;
  const uint32_t m = static_cast<uint32_t>(Min<uint64_t>(kEntropyBlock, n - start));
  const uint8_t* body = in + kHeaderBytes + 4 * blocks;
  DecodeEntropyBlock<D>(body + offsets[blk], body + offsets[blk + 1], in + nbytes, m,
                        scratch + blk * (kPlanes + 1) * kEntropyBlock, y + start, status);
}

// ---------------------------------------------------------------------------
// Segmented pieces (jaxcc/piece_layout.h): segment s is an "entropy" encoding
// of one block: header | u32 block size | block.
// ---------------------------------------------------------------------------

constexpr uint64_t kSegmentHead = kHeaderBytes + 4;

// The size of each encoded segment from its block's.
__global__ void EntropySegmentSizesKernel(const uint32_t* block_sizes, uint64_t segments,
                                          uint32_t* sizes) {
  const uint64_t s = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (s < segments) sizes[s] = static_cast<uint32_t>(kSegmentHead + block_sizes[s]);
}

// Copies each block's slot into its segment and writes the block size.
template <DTypeId D>
__global__ void EntropySegmentFrameKernel(EntropySlots<D> s, const uint64_t* offsets,
                                          uint8_t* out) {
  const uint64_t seg = blockIdx.x;
  const uint32_t size = s.sizes[seg];
  uint8_t* dst = out + offsets[seg];
  const uint8_t* src = s.slots + seg * EntropySlots<D>::kSlot;
  for (uint32_t i = threadIdx.x; i < size; i += blockDim.x) dst[kSegmentHead + i] = src[i];
  if (threadIdx.x == 0) Store32(dst + kHeaderBytes, size);
}

// Decodes each segment of a received piece (its header and checksum were
// checked by CheckSegments; here its block size).
template <DTypeId D>
__global__ void __launch_bounds__(kThreads)
    EntropySegmentDecodeKernel(piece::HopInput in, uint64_t n, uint8_t* scratch, Bits<D>* y) {
  constexpr int kPlanes = D == kF32 ? 4 : D == kF16 ? 3 : 2;
  const uint64_t s = blockIdx.x;
  const uint32_t m = static_cast<uint32_t>(piece::SegmentLength(n, s));
  const uint8_t* seg = in.data + in.offsets[s];
  const uint8_t* end = in.data + in.offsets[s + 1];
  if (end - seg < static_cast<int64_t>(kSegmentHead) + 1 ||
      Load32(seg + kHeaderBytes) != static_cast<uint64_t>(end - seg) - kSegmentHead) {
    if (threadIdx.x == 0) Fail(in.status, kBadSize);
    return;
  }
  DecodeEntropyBlock<D>(seg + kSegmentHead, end, end, m,
                        scratch + s * (kPlanes + 1) * kEntropyBlock, y + s * piece::kSegment,
                        in.status);
}

}  // namespace

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

template <DTypeId D>
ffi::Error EntropyPieceEncodeOn(const std::string& name, cudaStream_t stream, const void* x,
                                uint64_t n, uint8_t* work, const piece::HopWork& w, uint8_t* out,
                                uint32_t* sizes, uint64_t* offsets) {
  using Slots = EntropySlots<D>;
  const uint64_t segments = piece::Segments(n);
  if (segments == 0) return ScanSegments(name, stream, sizes, 0, offsets);
  Slots s;
  s.planes = work + w.planes;
  s.nz = work + w.nz;
  s.bitmap = work + w.bitmap;
  s.slots = work + w.slots;
  s.sizes = reinterpret_cast<uint32_t*>(work + w.block_sizes);
  s.offsets = nullptr;
  EntropyEncodeKernel<D><<<segments, kThreads, 0, stream>>>(static_cast<const Bits<D>*>(x), n, s);
  JAXCC_LAUNCHED(name);
  EntropySegmentSizesKernel<<<CeilDiv(segments, kThreads), kThreads, 0, stream>>>(s.sizes,
                                                                                  segments, sizes);
  JAXCC_LAUNCHED(name);
  ffi::Error err = ScanSegments(name, stream, sizes, segments, offsets);
  if (err.failure()) return err;
  EntropySegmentFrameKernel<D><<<segments, kThreads, 0, stream>>>(s, offsets, out);
  JAXCC_LAUNCHED(name);
  return FinishSegments(name, stream, out, offsets, kEntropy, D, n);
}

template <DTypeId D>
ffi::Error EntropyPieceDecodeOn(const std::string& name, cudaStream_t stream,
                                const piece::HopInput& in, uint64_t n, uint8_t* work,
                                const piece::HopWork& w, void* y) {
  const uint64_t segments = piece::Segments(n);
  if (segments == 0) return ffi::Error::Success();
  EntropySegmentDecodeKernel<D><<<segments, kThreads, 0, stream>>>(in, n, work + w.planes,
                                                                   static_cast<Bits<D>*>(y));
  JAXCC_LAUNCHED(name);
  return ffi::Error::Success();
}

#define JAXCC_ENTROPY_PIECE(D)                                                                 \
  template ffi::Error EntropyPieceEncodeOn<D>(const std::string&, cudaStream_t, const void*,    \
                                              uint64_t, uint8_t*, const piece::HopWork&,        \
                                              uint8_t*, uint32_t*, uint64_t*);                  \
  template ffi::Error EntropyPieceDecodeOn<D>(const std::string&, cudaStream_t,                 \
                                              const piece::HopInput&, uint64_t, uint8_t*,       \
                                              const piece::HopWork&, void*);
JAXCC_ENTROPY_PIECE(kBF16)
JAXCC_ENTROPY_PIECE(kF16)
JAXCC_ENTROPY_PIECE(kF32)
#undef JAXCC_ENTROPY_PIECE

// The launchers of each dtype, for codec.cu.
template ffi::Error EncodeEntropyOn<kBF16>(const std::string&, cudaStream_t, ffi::ScratchAllocator&,
                                           const void*, uint64_t, uint8_t*, int32_t*);
template ffi::Error EncodeEntropyOn<kF16>(const std::string&, cudaStream_t, ffi::ScratchAllocator&,
                                          const void*, uint64_t, uint8_t*, int32_t*);
template ffi::Error EncodeEntropyOn<kF32>(const std::string&, cudaStream_t, ffi::ScratchAllocator&,
                                          const void*, uint64_t, uint8_t*, int32_t*);
template ffi::Error DecodeEntropyOn<kBF16>(const std::string&, cudaStream_t, ffi::ScratchAllocator&,
                                           const uint8_t*, uint64_t, uint64_t, void*, uint32_t*);
template ffi::Error DecodeEntropyOn<kF16>(const std::string&, cudaStream_t, ffi::ScratchAllocator&,
                                          const uint8_t*, uint64_t, uint64_t, void*, uint32_t*);
template ffi::Error DecodeEntropyOn<kF32>(const std::string&, cudaStream_t, ffi::ScratchAllocator&,
                                          const uint8_t*, uint64_t, uint64_t, void*, uint32_t*);

}  // namespace codec
}  // namespace jaxcc
