// The "entropy" codec on the CPU (format: jaxcc/codec.h): per 65536-element
// block, its planes split, planned (dense, sparse or raw; each plane raw,
// constant or Huffman) and written; decoding joins a Huffman exponent plane
// with the other planes four sub-streams at a time, while it is in L1.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "codec_checksum.h"
#include "codec_cpu.h"
#include "codec_huffman.h"
#include "codec_planes.h"
#include "jaxcc/codec.h"

namespace jaxcc {
namespace codec {
namespace {

// SampleWorthCoding with a quick exit: no prefix code takes fewer bits than
// the sample's entropy, so when that alone saves less than 1/32 (the usual
// case of mantissa bytes) the Huffman code is never built. The margin covers
// the rounding of the sum.
bool SampleWorth(const uint32_t* sample_freq, uint64_t sample_count) {
  const double count = static_cast<double>(sample_count);
  double entropy_bits = 0;
  for (int s = 0; s < 256; ++s) {
    if (sample_freq[s]) entropy_bits += sample_freq[s] * std::log2(count / sample_freq[s]);
  }
  const uint64_t raw_bits = 8 * sample_count;
  if (entropy_bits * (1 - 1e-9) >= static_cast<double>(raw_bits - (raw_bits >> 5))) return false;
  return SampleWorthCoding(sample_freq, sample_count);
}

// The first word of the blocks of an entropy encoding.
inline uint64_t EntropyBodyWord(uint64_t n) {
  return (kHeaderBytes + 4 * CeilDiv(n, kEntropyBlock)) / 4;
}

// Returns the size; *body gets the checksum of the words from
// EntropyBodyWord(n) on.
template <DTypeId D>
uint64_t EntropyEncode(const Bits<D>* x, uint64_t n, uint8_t* out, Checksum* body) {
  constexpr int kPlanes = D == kF32 ? 4 : D == kF16 ? 3 : 2;
  constexpr uint32_t kElemBytes = sizeof(Bits<D>);
  const uint64_t blocks = CeilDiv(n, kEntropyBlock);
  EntropyScratch& sc = Scratch();
  uint8_t* planes[kMaxPlanes];
  for (int p = 0; p < kMaxPlanes; ++p) planes[p] = sc.planes[p].data();
  uint8_t* o = out + kHeaderBytes + 4 * blocks;
  RunningChecksum sum(out, ~uint64_t{0}, EntropyBodyWord(n));
  for (uint64_t blk = 0; blk < blocks; ++blk) {
    const uint64_t start = blk * kEntropyBlock;
    const uint32_t m = static_cast<uint32_t>(std::min<uint64_t>(kEntropyBlock, n - start));
    const Bits<D>* v = x + start;
    uint32_t hist[kPlanes][256];
    const uint32_t zeros = SplitBlock<D, true, false>(v, m, planes);
    const bool sparse_candidate = uint64_t{zeros} * 8 >= m;
    uint8_t len[kPlanes][256];
    PlanePlan dense[kPlanes];
    uint64_t dense_bytes = 1;
    // Sign+mantissa planes judged raw on the sample are written straight
    // from the input when all of them are (direct); else they are split
    // into scratch here.
    bool sampled_raw[kPlanes] = {};
    bool direct = !sparse_candidate && m >= kSampleMin;
    if (direct) {
      uint32_t sample[kPlanes - 1][256] = {};
      for (uint32_t i = 0; i < m; i += kSampleStride) {
        uint8_t b[kMaxPlanes];
        Split<D>(v[i], b);
        for (int p = 1; p < kPlanes; ++p) sample[p - 1][b[p]]++;
      }
      for (int p = 1; p < kPlanes; ++p) {
        sampled_raw[p] = !SampleWorth(sample[p - 1], CeilDiv(m, kSampleStride));
        direct &= sampled_raw[p];
      }
    }
    if (!direct) SplitBlock<D, false, true>(v, m, planes);
    for (int p = 0; p < kPlanes; ++p) {
      if (sampled_raw[p]) {
        dense[p] = {kRawPlane, 0, 0, 1 + uint64_t{m}};
        dense_bytes += dense[p].bound;
        continue;
      }
      Histogram(planes[p], m, hist[p]);
      dense[p] = PlanPlane(hist[p], m, len[p]);
      dense_bytes += dense[p].bound;
    }
    uint64_t best = 1 + uint64_t{m} * kElemBytes;
    BlockKind kind = kRawBlock;
    if (dense_bytes < best) {
      best = dense_bytes;
      kind = kDense;
    }
    // Sparse: the zeros leave every plane's symbol-0 count.
    uint8_t nz_len[kPlanes][256], bm_len[256];
    PlanePlan nz_plan[kPlanes], bm_plan{};
    const uint32_t nnz = m - zeros;
    const uint32_t bm_bytes = static_cast<uint32_t>(CeilDiv(m, 8));
    if (sparse_candidate) {
      uint8_t* bm = sc.bitmap.data();
      uint32_t bm_hist[256] = {};
      for (uint32_t g = 0; g < bm_bytes; ++g) {
        uint8_t byte = 0;
        for (uint32_t k = 0; k < 8 && 8 * g + k < m; ++k) byte |= uint8_t(v[8 * g + k] != 0) << k;
        bm[g] = byte;
        bm_hist[byte]++;
      }
      bm_plan = PlanPlane(bm_hist, bm_bytes, bm_len);
      uint64_t sparse_bytes = 1 + 4 + bm_plan.bound;
      for (int p = 0; p < kPlanes; ++p) {
        uint32_t h[256];
        std::memcpy(h, hist[p], sizeof(h));
        h[0] -= zeros;
        nz_plan[p] = PlanPlane(h, nnz, nz_len[p]);
        sparse_bytes += nz_plan[p].bound;
      }
      if (sparse_bytes < best) {
        best = sparse_bytes;
        kind = kSparse;
      }
    }
    uint8_t* block_start = o;
    *o++ = kind;
    if (kind == kRawBlock) {
      std::memcpy(o, v, uint64_t{m} * kElemBytes);
      o += uint64_t{m} * kElemBytes;
    } else if (kind == kDense && direct) {
      o = WritePlane(o, planes[0], m, dense[0], len[0]);
      uint8_t* raw[kMaxPlanes] = {};
      for (int p = 1; p < kPlanes; ++p) {
        *o++ = kRawPlane;
        raw[p] = o;
        o += m;
      }
      SplitBlock<D, false, true>(v, m, raw);
    } else if (kind == kDense) {
      for (int p = 0; p < kPlanes; ++p) o = WritePlane(o, planes[p], m, dense[p], len[p]);
    } else {
      Store32(o, nnz);
      o += 4;
      o = WritePlane(o, sc.bitmap.data(), bm_bytes, bm_plan, bm_len);
      for (int p = 0; p < kPlanes; ++p) {
        uint8_t* dst = sc.nz[p].data();
        const uint8_t* src = planes[p];
        uint32_t j = 0;
        for (uint32_t i = 0; i < m; ++i) {
          dst[j] = src[i];
          j += v[i] != 0;
        }
        o = WritePlane(o, dst, nnz, nz_plan[p], nz_len[p]);
      }
    }
    Store32(out + kHeaderBytes + 4 * blk, static_cast<uint32_t>(o - block_start));
    sum.Upto(o - out);  // while the block is in the cache
  }
  sum.nbytes = static_cast<uint64_t>(o - out);
  *body = sum.Finish();
  return sum.nbytes;
}


template <DTypeId D>
bool EntropyDecodeBlocks(const uint8_t* in, uint64_t nbytes, uint64_t n, Bits<D>* y, Failure* f,
                         RunningChecksum* sum) {
  constexpr int kPlanes = D == kF32 ? 4 : D == kF16 ? 3 : 2;
  constexpr uint32_t kElemBytes = sizeof(Bits<D>);
  const uint64_t blocks = CeilDiv(n, kEntropyBlock);
  if (kHeaderBytes + 4 * blocks > nbytes) {
    f->what = "truncated: the block table does not fit";
    return false;
  }
  const uint8_t* limit = in + nbytes;
  const uint8_t* p = in + kHeaderBytes + 4 * blocks;
  EntropyScratch& sc = Scratch();
  Bits<D>* joined = reinterpret_cast<Bits<D>*>(sc.joined.data());
  DecodeTables* tables = &sc.tables;
  const uint8_t* sym[kMaxPlanes];
  const bool streaming = kHaveStreamingStores && D != kF16 && n * kElemBytes >= kStreamingBytes;
  auto join = [streaming](const uint8_t* const* planes, uint32_t count, Bits<D>* dst) {
    if (streaming) {
      JoinBlockStream<D>(planes, count, dst);
    } else {
      JoinBlock<D>(planes, count, dst);
    }
  };
  for (uint64_t blk = 0; blk < blocks; ++blk) {
    const uint64_t start = blk * kEntropyBlock;
    const uint32_t m = static_cast<uint32_t>(std::min<uint64_t>(kEntropyBlock, n - start));
    const uint64_t size = Load32(in + kHeaderBytes + 4 * blk);
    auto where = [blk] { return " in block " + std::to_string(blk); };
    if (size == 0 || size > uint64_t(limit - p)) {
      f->what = "truncated: block " + std::to_string(blk) + " runs past the end";
      return false;
    }
    const uint8_t* end = p + size;
    sum->Upto(end - in);  // the block's bytes, into the cache before decoding them
    const uint8_t kind = *p++;
    Bits<D>* out = y + start;
    if (kind == kRawBlock) {
      if (uint64_t(end - p) != uint64_t{m} * kElemBytes) {
        f->what = "bad raw block size" + where();
        return false;
      }
      std::memcpy(out, p, uint64_t{m} * kElemBytes);
      p = end;
      continue;
    }
    if (kind == kDense) {
      // A Huffman exponent plane followed by raw or constant planes (the
      // usual case) is decoded four sub-streams at a time and joined with
      // them while the exponents are in L1.
      PlaneView exp;
      const uint8_t* q = ParsePlane(p, end, m, &exp, tables);
      bool fused = q && exp.kind == kHuffman;
      for (int k = 1; k < kPlanes && fused; ++k) {
        if (q >= end || *q == kHuffman) {
          fused = false;
        } else {
          q = ReadPlane(q, end, limit, m, sc.planes[k].data(), &sym[k], tables);
          fused = q != nullptr;
        }
      }
      if (fused) {
        const bool ok = q == end && DecodeSubStreams(
            exp.data, exp.sizes, limit, *tables, m, [&](uint64_t) { return sc.group; },
            [&](uint64_t first, uint32_t count) {
              const uint8_t* planes[kMaxPlanes] = {sc.group};
              for (int k = 1; k < kPlanes; ++k) planes[k] = sym[k] + first;
              join(planes, count, out + first);
            });
        if (!ok) {
          f->what = "corrupted plane" + where();
          return false;
        }
        p = end;
        continue;
      }
      for (int k = 0; k < kPlanes && p; ++k) {
        p = ReadPlane(p, end, limit, m, sc.planes[k].data(), &sym[k], tables);
      }
      if (p != end) {
        f->what = "corrupted plane" + where();
        return false;
      }
      join(sym, m, out);
      continue;
    }
    if (kind != kSparse || end - p < 4) {
      f->what = "bad block kind" + where();
      return false;
    }
    const uint32_t nnz = Load32(p);
    p += 4;
    const uint32_t bm_bytes = static_cast<uint32_t>(CeilDiv(m, 8));
    const uint8_t* bm = nullptr;
    if (nnz > m) p = nullptr;
    if (p) p = ReadPlane(p, end, limit, bm_bytes, sc.bitmap.data(), &bm, tables);
    for (int k = 0; k < kPlanes && p; ++k) {
      p = ReadPlane(p, end, limit, nnz, sc.nz[k].data(), &sym[k], tables);
    }
    if (p != end) {
      f->what = "corrupted plane" + where();
      return false;
    }
    uint64_t ones = 0;
    for (uint32_t g = 0; g < bm_bytes; ++g) ones += __builtin_popcount(bm[g]);
    if (ones != nnz || (m % 8 && (bm[bm_bytes - 1] >> (m % 8)))) {
      f->what = "bad zero bitmap" + where();
      return false;
    }
    JoinBlock<D>(sym, nnz, joined);
    uint32_t j = 0;
    for (uint32_t i = 0; i < m; ++i) {
      const uint32_t bit = (bm[i >> 3] >> (i & 7)) & 1u;
      out[i] = bit ? joined[j] : Bits<D>{0};
      j += bit;
    }
  }
  if (p != limit) {
    f->what = "size mismatch: the blocks end before nbytes";
    return false;
  }
  return true;
}

template <DTypeId D>
// Decodes and checks the checksum on the way (block by block, each just
// before it is decoded): a checksum mismatch is the error whenever there is
// one, as if it had been checked first; the decoder never reads or writes
// out of bounds on any input.
bool EntropyDecode(const uint8_t* in, uint64_t nbytes, uint64_t n, Bits<D>* y, Failure* f,
                   const Header& h) {
  const uint64_t head = kChecksumOffset / 4 + 2;
  RunningChecksum sum(in, nbytes, head);
  const bool ok = EntropyDecodeBlocks<D>(in, nbytes, n, y, f, &sum);
  StreamingFence();
  Checksum c = sum.Finish();
  AddHead(in, head, &c);
  if (c.a != h.sum_a || c.b != h.sum_b) {
    f->what = kChecksumMismatch;
    return false;
  }
  return ok;
}

}  // namespace

uint64_t EncodeEntropy(DTypeId d, const void* x, uint64_t n, uint8_t* out) {
  uint64_t size = 0;
  Checksum body;
  switch (d) {
    case kBF16: size = EntropyEncode<kBF16>(static_cast<const uint16_t*>(x), n, out, &body); break;
    case kF16: size = EntropyEncode<kF16>(static_cast<const uint16_t*>(x), n, out, &body); break;
    case kF32: size = EntropyEncode<kF32>(static_cast<const uint32_t*>(x), n, out, &body); break;
  }
  FinishHeader(out, kEntropy, d, kEntropyBlockLog2, n, size, &body, EntropyBodyWord(n));
  return size;
}

bool DecodeEntropy(DTypeId d, const uint8_t* in, uint64_t nbytes, uint64_t n, void* y,
                   const Header& h, Failure* f) {
  switch (d) {
    case kBF16: return EntropyDecode<kBF16>(in, nbytes, n, static_cast<uint16_t*>(y), f, h);
    case kF16: return EntropyDecode<kF16>(in, nbytes, n, static_cast<uint16_t*>(y), f, h);
    case kF32: return EntropyDecode<kF32>(in, nbytes, n, static_cast<uint32_t*>(y), f, h);
  }
  return false;
}

}  // namespace codec
}  // namespace jaxcc
