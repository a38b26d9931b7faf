// The Schedule IR on the native side: the int64 table of jaxcc/schedules/ir.py,
// cut into what one rank does in each step. Platform neutral (CPU and CUDA
// builds share it).
//
// The table (Schedule.serialized): a header of kTableMagic, kTableVersion, the
// column count and the row count, then the rows: step, src, dst, src_start,
// dst_start, length, op (elements). A change of the layout bumps kTableVersion
// here and TABLE_VERSION in ir.py.
// Per step a rank sends pieces of its buffer, copies received pieces into
// place, and sums every REDUCE piece into one range together with its own
// values, in the canonical order: ascending (rank - src) mod p.
#ifndef JAXCC_SCHEDULE_H_
#define JAXCC_SCHEDULE_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace jaxcc {

enum Column : int64_t { kStep, kSrc, kDst, kSrcStart, kDstStart, kLength, kOp, kColumns };
enum Op : int64_t { kCopy = 0, kReduce = 1 };
constexpr int64_t kTableMagic = 0x6A61786363534348;  // "jaxccSCH"
constexpr int64_t kTableVersion = 1;
constexpr size_t kHeaderLen = 4;

// One piece moved in a step; `peer` is the destination of a send and the
// source of a receive. Offsets and length are in elements.
struct Piece {
  int peer;
  int64_t src_start;
  int64_t dst_start;
  int64_t length;
};

struct RankStep {
  std::vector<Piece> sends;
  std::vector<Piece> copies;
  std::vector<Piece> reduces;  // one shared dst range, canonical order
};

// What `rank` does in every step of a schedule of `num_steps` steps over
// buffers of `length` elements; `table` is the serialized table of `values`
// int64s, header included. Returns an error message, empty on success.
inline std::string PlanRank(const int64_t* table, size_t values, int64_t num_steps, int p,
                            int rank, int64_t length, std::vector<RankStep>* plan) {
  if (values < kHeaderLen || table[0] != kTableMagic || table[1] != kTableVersion) {
    const std::string found = values < kHeaderLen || table[0] != kTableMagic
                                  ? "no jaxcc table header"
                                  : "version " + std::to_string(table[1]);
    return "schedule table magic/version mismatch: rebuild jaxcc (found " + found +
           ", this build reads version " + std::to_string(kTableVersion) + ")";
  }
  const int64_t columns = table[2], rows_in_header = table[3];
  if (columns != kColumns || rows_in_header < 0 ||
      values - kHeaderLen != static_cast<size_t>(rows_in_header) * kColumns) {
    return "schedule table header says " + std::to_string(rows_in_header) + " rows of " +
           std::to_string(columns) + " columns, but the table has " +
           std::to_string(values - kHeaderLen) + " values after it";
  }
  table += kHeaderLen;
  if (rank < 0 || rank >= p) {
    return "rank " + std::to_string(rank) + " outside [0, " + std::to_string(p) + ")";
  }
  plan->assign(static_cast<size_t>(std::max<int64_t>(num_steps, 0)), RankStep{});
  const size_t rows = static_cast<size_t>(rows_in_header);
  for (size_t i = 0; i < rows; ++i) {
    const int64_t* r = table + i * kColumns;
    const std::string where = "schedule row " + std::to_string(i) + ": ";
    if (r[kStep] < 0 || r[kStep] >= num_steps) return where + "step out of range";
    if (r[kSrc] < 0 || r[kSrc] >= p || r[kDst] < 0 || r[kDst] >= p || r[kSrc] == r[kDst]) {
      return where + "bad ranks " + std::to_string(r[kSrc]) + " -> " + std::to_string(r[kDst]);
    }
    if (r[kLength] <= 0 || r[kSrcStart] < 0 || r[kDstStart] < 0 ||
        r[kSrcStart] + r[kLength] > length || r[kDstStart] + r[kLength] > length) {
      return where + "range outside the buffer of " + std::to_string(length) + " elements";
    }
    if (r[kOp] != kCopy && r[kOp] != kReduce) return where + "unknown op";
    RankStep& step = (*plan)[static_cast<size_t>(r[kStep])];
    if (r[kSrc] == rank) {
      step.sends.push_back({static_cast<int>(r[kDst]), r[kSrcStart], r[kDstStart], r[kLength]});
    }
    if (r[kDst] == rank) {
      const Piece in{static_cast<int>(r[kSrc]), r[kSrcStart], r[kDstStart], r[kLength]};
      (r[kOp] == kReduce ? step.reduces : step.copies).push_back(in);
    }
  }
  for (size_t t = 0; t < plan->size(); ++t) {
    std::vector<Piece>& red = (*plan)[t].reduces;
    std::sort(red.begin(), red.end(), [&](const Piece& a, const Piece& b) {
      return (rank - a.peer + p) % p < (rank - b.peer + p) % p;
    });
    for (const Piece& piece : red) {
      if (piece.dst_start != red[0].dst_start || piece.length != red[0].length) {
        return "step " + std::to_string(t) + ": reduces into rank " + std::to_string(rank) +
               " do not share one range";
      }
    }
  }
  return "";
}

}  // namespace jaxcc

#endif  // JAXCC_SCHEDULE_H_
