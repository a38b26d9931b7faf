// Tcp transport: the ranks of several processes exchange a schedule's pieces
// over one TCP connection per process pair (push model).
//
// jaxcc/_src/tcp_bootstrap.py connects and authenticates the sockets once per
// process and hands them to TcpStart. A per-process progress thread then owns
// them (non-blocking): it writes posted pieces straight from the senders'
// buffers, a stripe at a time per connection, and reads every incoming message
// into a staging buffer, keyed by (op id, instance, group, dst, step, src), so
// several collectives in flight never mix. A piece posted in parts is staged
// once its last part came, the parts received straight after each other into
// one buffer of the bound the first part carries. Pieces between ranks of this
// process are copied into staging directly. Every message carries the
// sender's schedule digest; a receiver that planned another schedule fails.
//
// A lost connection fails every wait on a rank of that process at once; a
// rank that fails tells the other processes of its group (an abort message),
// so they fail at once too, naming the first error.
//
// Pacing (SO_MAX_PACING_RATE) is set per call on the connections of the
// group: the sum of the rates of the rank pairs a connection carries, or none.
// Calls in flight at once on one connection share the last call's setting.
#ifndef JAXCC_CPU_TCP_H_
#define JAXCC_CPU_TCP_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jaxcc/dataflow.h"

namespace jaxcc {

namespace tcp {
class Engine;
}  // namespace tcp

// Starts the process-wide engine as `process` over connected, authenticated
// sockets: fds[q] for process q, -1 for this process. Takes them over. Returns
// an error message, empty on success.
std::string TcpStart(int process, const std::vector<int>& fds);
// This process' index once TcpStart ran, else -1.
int TcpProcess();

class TcpTransport final : public AsyncTransport {
 public:
  struct Call {
    int64_t op_id, instance, group;
  };

  // The transport of `rank` of `p` for one call. procs[r] is the process of
  // rank r; pacing (p * p bytes/s per ordered rank pair, 0: none) may be null
  // (unpaced).
  static std::string Create(const Call& call, int p, int rank, const int64_t* procs,
                            const int64_t* pacing, int64_t digest,
                            std::unique_ptr<TcpTransport>* out);
  // The next instance number of (op id, group) for `rank`, over the process'
  // lifetime (every process runs the same executions in the same order).
  static int64_t NextInstance(int64_t op_id, int64_t group, int rank);
  ~TcpTransport() override;

  std::string Post(int64_t step, int peer, const char* data, uint64_t bytes,
                   std::unique_ptr<char[]> owned) override;
  std::string PostPart(int64_t step, int peer, std::unique_ptr<char[]> data, uint64_t bytes,
                       uint64_t bound, bool last) override;
  std::string Sync(std::vector<Arrival>* arrived, std::vector<int64_t>* written,
                   uint64_t* events) override;
  std::string View(int64_t step, int src, const char** data, uint64_t* bytes) override;
  void Release(int64_t step, int src) override;
  void Wait(uint64_t events, std::chrono::steady_clock::time_point deadline) override;
  std::string Lost(int rank) override;
  std::string Peer(int rank) const override;  // "rank r (process q)"
  // Fails the call on this process' other ranks and on the other processes.
  void Fail(const std::string& error) override;

 private:
  TcpTransport(tcp::Engine* engine, const Call& call, int p, int rank, const int64_t* procs,
               int64_t digest);

  tcp::Engine* e_;
  Call call_;
  int rank_;
  std::vector<int> procs_;
  int64_t digest_;
  std::vector<int64_t> written_;  // per peer rank: unowned pieces that left the buffer
};

}  // namespace jaxcc

#endif  // JAXCC_CPU_TCP_H_
