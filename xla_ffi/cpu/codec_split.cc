// The split layout of a piece on the CPU (format: jaxcc/codec.h; functions:
// codec_host.h): part A is the sign+mantissa planes as they are, part B the
// exponent planes coded as "entropy" planes.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "codec_checksum.h"
#include "codec_cpu.h"
#include "codec_host.h"
#include "codec_huffman.h"
#include "codec_planes.h"
#include "jaxcc/codec.h"

namespace jaxcc {
namespace codec {
namespace {

constexpr size_t kSplitTrailer = 8;  // part B's checksum

// Bytes of part A before its zero padding: the header and the sm planes.
uint64_t SplitPlaneEnd(DTypeId d, uint64_t n) {
  return kHeaderBytes + uint64_t(Info(d).planes - 1) * n;
}

template <DTypeId D>
void SplitPlanesOf(const Bits<D>* x, uint64_t n, uint8_t* sm, uint8_t* exponents) {
  for (uint64_t start = 0; start < n; start += kEntropyBlock) {
    const uint32_t m = static_cast<uint32_t>(std::min<uint64_t>(kEntropyBlock, n - start));
    uint8_t* planes[kMaxPlanes] = {exponents + start, sm + start, sm + n + start,
                                   sm + 2 * n + start};
    SplitBlock<D>(x + start, m, planes);
  }
}

// Decodes blocks [first, first + count) of part B (whose block table and
// blocks are at `table`, ending at `limit`) joined with the sm planes into y.
template <DTypeId D>
bool SplitDecodeBlocks(const uint8_t* sm, const uint8_t* table, const uint8_t* limit, uint64_t n,
                       uint64_t first, uint64_t count, Bits<D>* y, Failure* f) {
  constexpr int kPlanes = D == kF32 ? 4 : 2;
  const uint64_t blocks = CeilDiv(n, kEntropyBlock);
  const uint8_t* p = table + 4 * blocks;
  for (uint64_t blk = 0; blk < first; ++blk) p += Load32(table + 4 * blk);
  EntropyScratch& sc = Scratch();
  for (uint64_t blk = first; blk < first + count; ++blk) {
    const uint64_t start = blk * kEntropyBlock;
    const uint32_t m = static_cast<uint32_t>(std::min<uint64_t>(kEntropyBlock, n - start));
    const uint8_t* end = p + Load32(table + 4 * blk);
    const uint8_t* sym[kMaxPlanes];
    for (int k = 1; k < kPlanes; ++k) sym[k] = sm + uint64_t(k - 1) * n + start;
    Bits<D>* out = y + (start - first * kEntropyBlock);
    PlaneView exp;
    const uint8_t* q = ParsePlane(p, end, m, &exp, &sc.tables);
    bool ok = q == end;
    if (ok && exp.kind == kHuffman) {
      ok = DecodeSubStreams(
          exp.data, exp.sizes, limit, sc.tables, m, [&](uint64_t) { return sc.group; },
          [&](uint64_t at, uint32_t c) {
            const uint8_t* planes[kMaxPlanes] = {sc.group};
            for (int k = 1; k < kPlanes; ++k) planes[k] = sym[k] + at;
            JoinBlock<D>(planes, c, out + at);
          });
    } else if (ok) {
      ok = ReadPlane(p, end, limit, m, sc.planes[0].data(), &sym[0], &sc.tables) == end;
      if (ok) JoinBlock<D>(sym, m, out);
    }
    if (!ok) {
      f->what = "corrupted exponent plane in block " + std::to_string(blk);
      return false;
    }
    p = end;
  }
  return true;
}

// Where part B's table starts and its blocks end, after checking the layout
// and both checksums.
bool SplitCheckLayout(DTypeId d, const uint8_t* in, uint64_t bytes, uint64_t n,
                      const uint8_t** table, const uint8_t** limit, Failure* f) {
  Header h;
  const uint64_t head = SplitHeadBytes(d, n);
  const uint64_t blocks = CeilDiv(n, kEntropyBlock);
  if (bytes < head + 4 * blocks + kSplitTrailer) {
    f->what = "truncated: " + std::to_string(bytes) + " bytes, a split piece of " +
              std::to_string(n) + " elements needs at least " +
              std::to_string(head + 4 * blocks + kSplitTrailer);
    return false;
  }
  ReadHeader(in, &h);
  if (Load32(in) != kSplitMagic || h.codec != kEntropy || h.dtype != d ||
      h.block_log2 != kEntropyBlockLog2 || h.count != n || h.nbytes != head) {
    f->what = "bad header: not a split piece of " + std::to_string(n) + " " + DTypeName(d) +
              " elements";
    return false;
  }
  const Checksum a = ComputeChecksum(in, head);
  const uint64_t body = bytes - head - kSplitTrailer;
  RunningChecksum b(in + head, body, 0);
  const Checksum cb = b.Finish();
  const uint8_t* trailer = in + head + body;
  if (a.a != h.sum_a || a.b != h.sum_b || cb.a != Load32(trailer) || cb.b != Load32(trailer + 4)) {
    f->what = kChecksumMismatch;
    return false;
  }
  uint64_t total = 4 * blocks;
  for (uint64_t blk = 0; blk < blocks; ++blk) total += Load32(in + head + 4 * blk);
  if (total != body) {
    f->what = "size mismatch: the exponent blocks need " + std::to_string(total) +
              " bytes, the piece has " + std::to_string(body);
    return false;
  }
  *table = in + head;
  *limit = trailer;
  return true;
}

}  // namespace

uint64_t SplitHeadBytes(DTypeId d, uint64_t n) { return CeilDiv(SplitPlaneEnd(d, n), 4) * 4; }

uint64_t SplitTailMaxBytes(uint64_t n) {
  return 5 * CeilDiv(n, kEntropyBlock) + n + kSplitTrailer;  // a raw plane per block at worst
}

void SplitEncodeHead(DTypeId d, const void* x, uint64_t n, uint8_t* head, uint8_t* exponents) {
  uint8_t* sm = head + kHeaderBytes;
  if (d == kBF16) {
    SplitPlanesOf<kBF16>(static_cast<const uint16_t*>(x), n, sm, exponents);
  } else {
    SplitPlanesOf<kF32>(static_cast<const uint32_t*>(x), n, sm, exponents);
  }
  const uint64_t end = SplitPlaneEnd(d, n), bytes = SplitHeadBytes(d, n);
  std::memset(head + end, 0, bytes - end);
  Header h;
  h.codec = kEntropy;
  h.dtype = d;
  h.block_log2 = kEntropyBlockLog2;
  h.count = n;
  h.nbytes = bytes;
  WriteHeader(head, h);
  Store32(head, kSplitMagic);
  const Checksum c = ComputeChecksum(head, bytes);
  Store32(head + kChecksumOffset, c.a);
  Store32(head + kChecksumOffset + 4, c.b);
}

uint64_t SplitEncodeTail(const uint8_t* exponents, uint64_t n, uint8_t* tail) {
  const uint64_t blocks = CeilDiv(n, kEntropyBlock);
  uint8_t* o = tail + 4 * blocks;
  for (uint64_t blk = 0; blk < blocks; ++blk) {
    const uint64_t start = blk * kEntropyBlock;
    const uint32_t m = static_cast<uint32_t>(std::min<uint64_t>(kEntropyBlock, n - start));
    uint32_t hist[256];
    uint8_t len[256];
    Histogram(exponents + start, m, hist);
    uint8_t* const begin = o;
    o = WritePlane(o, exponents + start, m, PlanPlane(hist, m, len), len);
    Store32(tail + 4 * blk, static_cast<uint32_t>(o - begin));
  }
  const uint64_t body = static_cast<uint64_t>(o - tail);
  RunningChecksum sum(tail, body, 0);
  const Checksum c = sum.Finish();
  Store32(o, c.a);
  Store32(o + 4, c.b);
  return body + kSplitTrailer;
}

bool IsSplit(const uint8_t* in, uint64_t bytes) {
  return bytes >= 4 && Load32(in) == kSplitMagic;
}

std::string SplitDecode(DTypeId d, const uint8_t* in, uint64_t bytes, uint64_t n, uint64_t first,
                        uint64_t count, void* y) {
  Failure f;
  const uint8_t *table, *limit;
  if (d == kF16) return "float16 pieces are never split";
  if (first % kEntropyBlock || first + count > n || (count % kEntropyBlock && first + count < n)) {
    return "elements [" + std::to_string(first) + ", " + std::to_string(first + count) +
           ") are not whole blocks of the piece";
  }
  if (first == 0 && !SplitCheckLayout(d, in, bytes, n, &table, &limit, &f)) return f.what;
  if (first != 0) {  // checked with the first range
    table = in + SplitHeadBytes(d, n);
    limit = in + bytes - kSplitTrailer;
  }
  const uint8_t* sm = in + kHeaderBytes;
  const uint64_t b0 = first / kEntropyBlock, nb = CeilDiv(count, kEntropyBlock);
  const bool ok =
      d == kBF16
          ? SplitDecodeBlocks<kBF16>(sm, table, limit, n, b0, nb, static_cast<uint16_t*>(y), &f)
          : SplitDecodeBlocks<kF32>(sm, table, limit, n, b0, nb, static_cast<uint32_t*>(y), &f);
  return ok ? "" : f.what;
}

}  // namespace codec
}  // namespace jaxcc
