// Encoded pieces: their segmented layout (xla_ffi/cpu/piece_codec.h) and the
// plan of a rank's coded steps over the Nccl transport (xla_ffi/cuda/
// collective.cu). Host code, built into the CPU module as well, so the plan is
// tested without a GPU (tests/codec/test_piece_layout.py).
//
// A piece of n elements travels as ceil(n / kSegment) encodings of kSegment
// elements (the last one fewer), back to back; a segment holds 256 "fixed"
// blocks or one "entropy" block.
//
// A coded step of the Nccl transport, per rank:
//   1. every send is encoded into the send area, or forwards bytes the
//      previous step left: a copy's received bytes unchanged, or the encoding
//      of the previous step's sum (made by the fused reduce hop);
//   2. sizes: one u32 per segment of every piece goes to its receiver, in
//      pair order (peer, src_start, dst_start, length) on both sides, so
//      NCCL matches the messages; the receiver learns each piece's size and
//      where its segments start;
//   3. the encoded bytes, at their real sizes, into the staging area of the
//      step's parity (a step's received bytes stay for the next step's
//      forwards while that step receives into the other half);
//   4. copies decode into place; the reduce decodes its pieces, adds them to
//      its range in the canonical order and encodes the sum when the next
//      step forwards it.
#ifndef JAXCC_PIECE_LAYOUT_H_
#define JAXCC_PIECE_LAYOUT_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "jaxcc/codec.h"
#include "jaxcc/codec_ffi.h"
#include "jaxcc/schedule.h"

namespace jaxcc {
namespace piece {

constexpr uint64_t kSegment = codec::kEntropyBlock;  // elements per segment
constexpr uint64_t kSegmentFixedBlocks = kSegment / codec::kFixedBlock;
constexpr uint64_t kAlign = 256;  // every area in device memory starts 256-byte aligned

JAXCC_HD inline uint64_t Align(uint64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
JAXCC_HD inline uint64_t Segments(uint64_t n) { return codec::CeilDiv(n, kSegment); }
JAXCC_HD inline uint64_t SegmentLength(uint64_t n, uint64_t s) {
  return n - s * kSegment < kSegment ? n - s * kSegment : kSegment;
}

// Areas laid out one after another in one allocation, each starting aligned.
struct Areas {
  uint64_t bytes = 0;  // the end of the last one
  uint64_t Take(uint64_t size) {
    const uint64_t at = bytes;
    bytes += Align(size);
    return at;
  }
};

// The most a piece of n elements takes, segmented.
inline uint64_t MaxPieceBytes(codec::CodecId c, codec::DTypeId d, uint64_t n) {
  const uint64_t whole = n / kSegment, rest = n % kSegment;
  return whole * codec::MaxBytes(c, d, kSegment) + (rest ? codec::MaxBytes(c, d, rest) : 0);
}

// A received piece as the device kernels read it.
struct HopInput {
  const uint8_t* data;      // its bytes
  const uint64_t* offsets;  // device: its Segments(n) + 1 segment starts, the total last
  const uint32_t* spill;    // device ("fixed"): its blocks' spill offsets within their segments
  uint32_t* status;         // device: its first decoding failure (codec_cuda.h: Status)
};

// Where the device work areas of one hop lie in its workspace (256-aligned
// byte offsets) and the bytes it takes: k received pieces of n elements
// decoded (with `sum`, added to own), then, with `encode`, the result encoded.
struct HopWork {
  uint64_t inputs = 0;        // k HopInput
  uint64_t spill = 0;         // "fixed": k x blocks u32, the received blocks' spill offsets
  uint64_t meta = 0;          // "fixed": blocks u16, base | esc << 8 of the result's blocks
  uint64_t spill_size = 0;    // "fixed": blocks u32, their spill sizes
  uint64_t spill_offset = 0;  // "fixed": blocks u32, their spill offsets
  uint64_t planes = 0;        // "entropy": segments x (planes + 1) x kSegment plane bytes
  uint64_t nz = 0;            // "entropy": segments x planes x kSegment, the nonzero planes
  uint64_t bitmap = 0;        // "entropy": segments x kSegment / 8
  uint64_t slots = 0;         // "entropy": segments x (1 + kSegment x itemsize), encoded blocks
  uint64_t block_sizes = 0;   // "entropy": segments + 1 u32
  uint64_t decoded = 0;       // "entropy", `sum`: k x n elements, the decoded pieces
  uint64_t bytes = 0;
};

inline HopWork HopWorkLayout(codec::CodecId c, codec::DTypeId d, uint64_t n, uint64_t k,
                             bool sum, bool encode) {
  HopWork w;
  Areas areas;
  const uint64_t segments = Segments(n);
  const codec::DTypeInfo info = codec::Info(d);
  w.inputs = areas.Take(k * sizeof(HopInput));
  if (c == codec::kFixed) {
    const uint64_t blocks = codec::CeilDiv(n, codec::kFixedBlock);
    w.spill = areas.Take(k * Align(4 * blocks));
    w.meta = areas.Take(2 * blocks);
    w.spill_size = areas.Take(4 * blocks);
    w.spill_offset = areas.Take(4 * blocks);
  } else {
    w.planes = areas.Take(segments * (info.planes + 1) * kSegment);
    if (encode) {
      w.nz = areas.Take(segments * info.planes * kSegment);
      w.bitmap = areas.Take(segments * (kSegment / 8));
      w.slots = areas.Take(segments * (1 + kSegment * info.elem_bytes));
      w.block_sizes = areas.Take(4 * (segments + 1));
    }
    w.decoded = areas.Take(sum ? k * n * info.elem_bytes : 0);
  }
  w.bytes = areas.bytes;
  return w;
}

// A send of a coded step: its piece, what it forwards and where it is encoded.
struct CodedSend {
  Piece piece;
  int64_t forwards = -1;  // index of the previous step's recv whose bytes it sends; -1: none
  bool forwards_sum = false;  // it sends the previous step's encoded sum
  uint64_t offset = 0;        // its fresh encoding in the send area
  uint64_t word = 0;          // its first segment size in the step's u32 send sizes
};

// A piece a coded step receives.
struct CodedRecv {
  Piece piece;
  bool reduce = false;
  uint64_t offset = 0;  // in the staging half of the step's parity
  uint64_t word = 0;    // its first segment size in the step's u32 received sizes
};

struct CodedStep {
  std::vector<CodedSend> sends;  // pair order
  std::vector<CodedRecv> recvs;  // pair order
  bool keeps_sum = false;        // the next step forwards this step's sum: encode it
  uint64_t send_words = 0;       // u32 segment sizes this step sends
  uint64_t recv_words = 0;       // and receives
};

struct CodedPlan {
  std::vector<CodedStep> steps;
  uint64_t send_bytes = 0;     // the largest step's fresh encodings
  uint64_t staging_bytes = 0;  // one parity's received pieces, the largest step
  uint64_t sum_bytes = 0;      // one parity's encoded sum, the largest step
  uint64_t words = 0;          // the most u32 sizes a step sends or receives
  uint64_t reduce_inputs = 0;  // the most pieces one reduce sums
  uint64_t reduce_length = 0;  // the longest reduce range (elements)
};

inline bool PairOrder(const Piece& a, const Piece& b) {
  return std::tie(a.peer, a.src_start, a.dst_start, a.length) <
         std::tie(b.peer, b.src_start, b.dst_start, b.length);
}

// The coded steps of `plan` (one rank's steps, PlanRank) for codec c and dtype d.
inline CodedPlan PlanCoded(const std::vector<RankStep>& plan, codec::CodecId c, codec::DTypeId d) {
  CodedPlan out;
  out.steps.resize(plan.size());
  for (size_t t = 0; t < plan.size(); ++t) {
    CodedStep& step = out.steps[t];
    for (const auto* list : {&plan[t].copies, &plan[t].reduces}) {
      for (const Piece& in : *list) {
        step.recvs.push_back({in, list == &plan[t].reduces, 0, 0});
      }
    }
    std::sort(step.recvs.begin(), step.recvs.end(),
              [](const CodedRecv& a, const CodedRecv& b) { return PairOrder(a.piece, b.piece); });
    Areas staging;
    for (CodedRecv& in : step.recvs) {
      in.offset = staging.Take(MaxPieceBytes(c, d, in.piece.length));
      in.word = step.recv_words;
      step.recv_words += Segments(in.piece.length);
    }
    out.staging_bytes = std::max(out.staging_bytes, staging.bytes);
    const std::vector<Piece>& red = plan[t].reduces;
    if (!red.empty()) {
      out.reduce_inputs = std::max<uint64_t>(out.reduce_inputs, red.size());
      out.reduce_length = std::max<uint64_t>(out.reduce_length, red[0].length);
    }

    std::vector<Piece> sends = plan[t].sends;
    std::sort(sends.begin(), sends.end(), PairOrder);
    Areas fresh;
    for (const Piece& p : sends) {
      CodedSend send{p};
      send.word = step.send_words;
      step.send_words += Segments(p.length);
      if (t > 0) {
        // What the previous step left in this exact range: its reduce (applied after its
        // copies) or one of its copies.
        const CodedStep& prev = out.steps[t - 1];
        const std::vector<Piece>& prev_red = plan[t - 1].reduces;
        if (!prev_red.empty() && prev_red[0].dst_start == p.src_start &&
            prev_red[0].length == p.length) {
          send.forwards_sum = true;
          out.steps[t - 1].keeps_sum = true;
          out.sum_bytes = std::max(out.sum_bytes, Align(MaxPieceBytes(c, d, p.length)));
        } else {
          for (size_t i = 0; i < prev.recvs.size(); ++i) {
            const Piece& in = prev.recvs[i].piece;
            if (!prev.recvs[i].reduce && in.dst_start == p.src_start && in.length == p.length) {
              send.forwards = static_cast<int64_t>(i);
            }
          }
          // A later write of the previous step over the range (its reduce) voids a copy.
          if (send.forwards >= 0 && !prev_red.empty() &&
              prev_red[0].dst_start < p.src_start + p.length &&
              p.src_start < prev_red[0].dst_start + prev_red[0].length) {
            send.forwards = -1;
          }
        }
      }
      if (send.forwards < 0 && !send.forwards_sum) {
        send.offset = fresh.Take(MaxPieceBytes(c, d, p.length));
      }
      step.sends.push_back(send);
    }
    out.send_bytes = std::max(out.send_bytes, fresh.bytes);
    out.words = std::max({out.words, step.send_words, step.recv_words});
  }
  return out;
}

// The byte offsets of the segments of a piece from its u32 segment sizes, and its total;
// an error if a size cannot be one of a segment of this piece or the total passes `cap`.
inline std::string SegmentOffsets(codec::CodecId c, codec::DTypeId d, uint64_t n,
                                  const uint32_t* sizes, uint64_t cap, uint64_t* offsets,
                                  uint64_t* total) {
  uint64_t at = 0;
  for (uint64_t s = 0; s < Segments(n); ++s) {
    const uint64_t m = SegmentLength(n, s);
    if (sizes[s] < codec::kHeaderBytes || sizes[s] > codec::MaxBytes(c, d, m)) {
      return "segment " + std::to_string(s) + " of " + std::to_string(m) +
             " elements announced as " + std::to_string(sizes[s]) + " bytes (at most " +
             std::to_string(codec::MaxBytes(c, d, m)) + ")";
    }
    offsets[s] = at;
    at += sizes[s];
  }
  if (at > cap) {
    return "the piece's segments add up to " + std::to_string(at) + " bytes, more than the " +
           std::to_string(cap) + " it may take";
  }
  *total = at;
  return "";
}

}  // namespace piece
}  // namespace jaxcc

#endif  // JAXCC_PIECE_LAYOUT_H_
