// The Transport interface the schedule interpreter runs on, and the
// interpreter itself. Platform neutral: the CPU and CUDA builds share it and
// differ only in their transports and their copy/reduce kernels.
//
// Per step t a rank:
//   1. Publish(t): its buffer now holds its state before step t; pieces it
//      sends in step t may be read (pull transports) or are posted (push).
//   2. Receive(t, piece): a pointer to the bytes `piece.peer` sends it in step
//      t, valid until ReceivesDone(t); copies go into place, reduce pieces are
//      summed with its own range in one kernel call.
//   3. ReceivesDone(t), then SendsDone(t, step): every piece it sent in step t
//      has been taken, so later steps may overwrite those ranges.
// Every wait ends within the transport's timeout (the handler's `timeout_ms`
// attribute: JAXCC_TIMEOUT_S) with an error that names the peer and the step.
// A rank that fails calls Fail, so that its peers stop waiting for it.
#ifndef JAXCC_TRANSPORT_H_
#define JAXCC_TRANSPORT_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "jaxcc/schedule.h"

namespace jaxcc {

class Transport {
 public:
  virtual ~Transport() = default;
  // Each returns an error message, empty on success.
  virtual std::string Publish(int64_t step, const RankStep& plan) = 0;
  virtual std::string Receive(int64_t step, const Piece& piece, size_t itemsize,
                              const char** view) = 0;
  virtual std::string ReceivesDone(int64_t step) = 0;
  virtual std::string SendsDone(int64_t step, const RankStep& plan) = 0;
  // Ends the call on this rank with `error` and tells the other ranks.
  virtual void Fail(const std::string& error) = 0;
};

// A timeout as text for messages: "2 s", "0.5 s".
inline std::string TimeoutText(std::chrono::milliseconds timeout) {
  std::ostringstream out;
  out << static_cast<double>(timeout.count()) / 1000 << " s";
  return out.str();
}

// The kernels a platform supplies: copy bytes, and sum k inputs of n elements
// in order into out (out may be inputs[0]).
class Kernels {
 public:
  virtual ~Kernels() = default;
  virtual std::string Copy(char* dst, const char* src, size_t bytes) = 0;
  virtual std::string Reduce(const char* const* inputs, size_t k, char* out, size_t n) = 0;
};

// Runs `plan` (this rank's steps) on `buf`, a buffer of elements of
// `itemsize` bytes. Returns an error message, empty on success.
inline std::string RunSchedule(const std::vector<RankStep>& plan, Transport& transport,
                               Kernels& kernels, char* buf, size_t itemsize) {
  std::vector<const char*> inputs;
  for (size_t t = 0; t < plan.size(); ++t) {
    const RankStep& step = plan[t];
    const int64_t s = static_cast<int64_t>(t);
    std::string err = transport.Publish(s, step);
    for (const Piece& in : step.copies) {
      if (!err.empty()) break;
      const char* view = nullptr;
      err = transport.Receive(s, in, itemsize, &view);
      if (err.empty()) err = kernels.Copy(buf + in.dst_start * itemsize, view, in.length * itemsize);
    }
    if (err.empty() && !step.reduces.empty()) {
      const Piece& first = step.reduces.front();
      char* own = buf + first.dst_start * itemsize;
      inputs.assign(1, own);
      for (const Piece& in : step.reduces) {
        const char* view = nullptr;
        err = transport.Receive(s, in, itemsize, &view);
        if (!err.empty()) break;
        inputs.push_back(view);
      }
      if (err.empty()) {
        err = kernels.Reduce(inputs.data(), inputs.size(), own, static_cast<size_t>(first.length));
      }
    }
    if (err.empty()) err = transport.ReceivesDone(s);
    if (err.empty()) err = transport.SendsDone(s, step);
    if (!err.empty()) return "step " + std::to_string(t) + ": " + err;
  }
  return "";
}

}  // namespace jaxcc

#endif  // JAXCC_TRANSPORT_H_
