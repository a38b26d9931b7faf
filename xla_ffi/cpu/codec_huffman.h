// Planes of byte symbols in the "entropy" format (jaxcc/codec.h: raw,
// constant, or canonical Huffman sub-streams), on the CPU: written by
// WritePlane, parsed by ParsePlane and decoded four sub-streams at a time.
// The split layout's exponent blocks are such planes too.
#ifndef JAXCC_CPU_CODEC_HUFFMAN_H_
#define JAXCC_CPU_CODEC_HUFFMAN_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "codec_cpu.h"
#include "jaxcc/codec.h"

namespace jaxcc {
namespace codec {

// Decoding tables. An entry of the multi-symbol table holds the up to
// kMultiSymbols symbols that an 11-bit window starts with: the bits they use
// in bits [0, 8) (at the bottom, so that shifting the bit buffer by the
// entry needs no masking), symbol k in bits [8k + 8, 8k + 16), their count
// in bits [56, 64). len holds the code lengths, to end a sub-stream exactly.
constexpr uint32_t kMultiSymbols = 6;

struct DecodeTables {
  // Level k (0..11) at [1 << k, 2 << k): the symbols that a k-bit window
  // (higher bits zero) starts with, each whole within the k bits. Level 11
  // is the table.
  alignas(64) uint64_t multi[2 * kTableSize];
  uint8_t len[256];
  const uint64_t* Multi() const { return multi + kTableSize; }
  // The bits of the first c symbols of entry e.
  uint32_t Bits(uint64_t e, uint32_t c) const {
    uint32_t bits = 0;
    for (uint32_t i = 0; i < c; ++i) bits += len[(e >> (8 * i + 8)) & 0xff];
    return bits;
  }
};

// Decodes up to four sub-streams, k of them, into out (stream j at
// out + j * kSubStream, counts[j] symbols, from start[j], size[j] bytes);
// writes nothing past their symbols. False if a sub-stream does not end
// exactly at its size.
bool DecodeGroup(const uint8_t* const* start, const uint64_t* size, const uint32_t* counts,
                 uint32_t k, const uint8_t* limit, const DecodeTables& t, uint8_t* out);

// Symbols per group of four sub-streams.
constexpr uint32_t kGroup = 4 * kSubStream;

// Decodes the sub-streams of a Huffman plane of c symbols four at a time;
// group g goes to out(g * kGroup) (room for min(kGroup, c - g * kGroup)
// symbols), then emit(g * kGroup, that count) runs.
template <typename Out, typename Emit>
inline bool DecodeSubStreams(const uint8_t* data, const uint8_t* sizes, const uint8_t* limit,
                             const DecodeTables& t, uint64_t c, Out&& out, Emit&& emit) {
  const uint32_t subs = NumSubStreams(c);
  const uint8_t* p = data;
  for (uint32_t s0 = 0; s0 < subs; s0 += 4) {
    const uint32_t k = std::min<uint32_t>(4, subs - s0);
    const uint64_t first = uint64_t{s0} * kSubStream;
    const uint8_t* start[4];
    uint64_t size[4];
    uint32_t counts[4];
    for (uint32_t j = 0; j < k; ++j) {
      const uint32_t sub = s0 + j;
      size[j] = sizes[2 * sub] | uint64_t{sizes[2 * sub + 1]} << 8;
      if (size[j] > uint64_t(limit - p)) return false;
      start[j] = p;
      p += size[j];
      counts[j] = static_cast<uint32_t>(std::min<uint64_t>(c - first - j * kSubStream, kSubStream));
    }
    if (!DecodeGroup(start, size, counts, k, limit, t, out(first))) return false;
    emit(first, static_cast<uint32_t>(std::min<uint64_t>(c - first, kGroup)));
  }
  return true;
}

// A parsed plane of c symbols: raw (data), constant (symbol) or Huffman
// (sub-stream sizes and data; the tables built).
struct PlaneView {
  uint8_t kind;
  uint8_t symbol;
  const uint8_t* data;
  const uint8_t* sizes;
};

// Parses one plane of c symbols (building the decoding tables of a Huffman
// plane); returns its end, or nullptr if it is malformed.
const uint8_t* ParsePlane(const uint8_t* p, const uint8_t* end, uint64_t c, PlaneView* v,
                          DecodeTables* t);

// Reads one plane of c symbols. *sym points at them afterwards: into the
// input for a raw plane, else into `scratch` (c bytes). Returns the end
// of the plane, or nullptr if it is malformed.
const uint8_t* ReadPlane(const uint8_t* p, const uint8_t* end, const uint8_t* limit, uint64_t c,
                         uint8_t* scratch, const uint8_t** sym, DecodeTables* t);

// Writes one plane; returns the end.
uint8_t* WritePlane(uint8_t* o, const uint8_t* sym, uint64_t c, const PlanePlan& plan,
                    const uint8_t* len);

// Histogram of m bytes, eight partial counts to break store-to-load chains.
void Histogram(const uint8_t* s, uint32_t m, uint32_t* hist);

// Per-block scratch of the entropy coder, one per thread, kept between calls.
struct EntropyScratch {
  std::vector<uint8_t> planes[kMaxPlanes];
  std::vector<uint8_t> nz[kMaxPlanes];
  std::vector<uint8_t> bitmap;
  std::vector<uint32_t> joined;
  DecodeTables tables;
  alignas(64) uint8_t group[kGroup];
  EntropyScratch() {
    for (int p = 0; p < kMaxPlanes; ++p) {
      planes[p].resize(kEntropyBlock);
      nz[p].resize(kEntropyBlock);
    }
    bitmap.resize(kEntropyBlock / 8);
    joined.resize(kEntropyBlock);
  }
};

// This thread's scratch.
EntropyScratch& Scratch();

}  // namespace codec
}  // namespace jaxcc

#endif  // JAXCC_CPU_CODEC_HUFFMAN_H_
