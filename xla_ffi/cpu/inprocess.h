// InProcess transport: the devices of one process meet in a shared-memory
// rendezvous and read each other's buffers directly (no staging copies).
//
// A rendezvous is keyed by (run id, op id, group, instance): the run id is the
// same on every device of one execution, the op id names the call site, the
// group the ranks along the axis (a multi-axis mesh has several), and the
// instance counts how often this rank has run that call site in this
// execution (a collective inside a loop runs once per iteration).
#ifndef JAXCC_CPU_INPROCESS_H_
#define JAXCC_CPU_INPROCESS_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "jaxcc/transport.h"

namespace jaxcc {

struct Rendezvous;

class InProcessTransport final : public Transport {
 public:
  struct Key {
    int64_t run_id, op_id, group, instance;
    bool operator<(const Key& o) const;
  };

  // Joins the rendezvous of `key` as `rank` of `p` with buffer `buf`. Ranks
  // that planned a schedule with another digest are an error.
  static std::string Join(const Key& key, int p, int rank, char* buf, int64_t digest,
                          std::chrono::milliseconds timeout, const std::string& what,
                          std::unique_ptr<InProcessTransport>* out);
  ~InProcessTransport() override;

  // The next instance number of (run id, op id, group) for `rank`.
  static int64_t NextInstance(int64_t run_id, int64_t op_id, int64_t group, int rank);

  std::string Publish(int64_t step, const RankStep& plan) override;
  std::string Receive(int64_t step, const Piece& piece, size_t itemsize,
                      const char** view) override;
  std::string ReceivesDone(int64_t step) override;
  std::string SendsDone(int64_t step, const RankStep& plan) override;
  // Marks the rendezvous failed so that the other ranks stop waiting.
  void Fail(const std::string& error) override;

 private:
  InProcessTransport(Key key, std::shared_ptr<Rendezvous> r, int rank,
                     std::chrono::milliseconds timeout, std::string what);
  // Waits until ready() or failure or the deadline; an error names `peer`.
  template <typename Ready>
  std::string Wait(std::unique_lock<std::mutex>& lock, Ready ready, int peer, int64_t step,
                   const char* doing);

  Key key_;
  std::shared_ptr<Rendezvous> r_;
  int rank_;
  std::chrono::milliseconds timeout_;
  std::string what_;
};

}  // namespace jaxcc

#endif  // JAXCC_CPU_INPROCESS_H_
