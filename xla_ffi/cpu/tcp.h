// Tcp transport: the ranks of several processes exchange a schedule's pieces
// over one TCP connection per process pair (push model).
//
// jaxcc/_src/tcp_bootstrap.py connects and authenticates the sockets once per
// process and hands them, each with the key its handshake made, to TcpStart;
// it hands a process' new connection to TcpRejoin. A per-process progress
// thread then owns them (non-blocking): it writes posted pieces straight from
// the senders' buffers, a stripe at a time per connection, and reads every
// incoming frame into a staging buffer, keyed by (op id, instance, group,
// dst, step, src), so several collectives in flight never mix. A piece posted
// in parts is staged once its last part came, the parts received straight
// after each other into one buffer of the bound the first part carries.
// Pieces between ranks of this process are copied into staging directly.
//
// A frame is a WireHeader (tcp_engine.h), its payload and, with integrity on,
// an HMAC-SHA256 under the connection's key of the frame's number on that
// connection (one count per direction), the header and the payload. Every
// header is checked against what the receiving rank's call may be sent
// (TcpReceives: which (step, src) pieces, how many bytes; the sender's
// schedule digest) before its payload is read (tcp_engine.h: Admit); one
// that does not fit, or a MAC that does not verify, closes the connection and
// fails the call with an error naming the process and the field.
//
// A connection with nothing to send for 100 ms carries a beat (a header with
// no payload, not timed by TcpRecords): a process whose progress thread runs
// is never silent longer, however slow its compute, so a wait can tell a
// stopped or cut-off peer (TcpTransport::Silent) from a slow one. Bytes: 72
// (104 with integrity) per idle connection per 100 ms.
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
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "jaxcc/dataflow.h"

namespace jaxcc {

namespace tcp {
class Engine;
}  // namespace tcp

// Starts the process-wide engine as `process` over connected, authenticated
// sockets: fds[q] for process q, -1 for this process, keys[q] the key its
// handshake made; with `integrity` every frame carries a MAC under it. Takes
// the sockets over. fds[q] = -1 for another process q: not connected (yet),
// its connection starts lost for `unconnected` (then required), until
// TcpRejoin. Returns an error message, empty on success.
std::string TcpStart(int process, const std::vector<int>& fds,
                     const std::vector<std::string>& keys, bool integrity,
                     const std::string& unconnected);
// Replaces the connection to process q (lost, or q restarted) by the
// authenticated socket fd with its key. Takes fd over.
std::string TcpRejoin(int q, int fd, const std::string& key);
// This process' index once TcpStart ran, else -1.
int TcpProcess();
// Why the connection to process q is lost; empty while it is up (or q is this one).
std::string TcpLost(int q);
// When the connection to process q was found lost (seconds since the Unix
// epoch), 0 while it is up.
double TcpLostAt(int q);
// How long process q has sent nothing on a connection that is up (seconds;
// its transport beats every 100 ms while idle), 0 while bytes from it wait
// here unread, its connection is lost, or q is this process.
double TcpSilentS(int q);

// The next instance of each (op id, group, rank) this process has run
// (TcpTransport::Create counts them): a process that restarts takes its
// peers' counts (TcpSetInstances) so that its calls meet theirs.
using TcpInstanceCounts = std::vector<std::tuple<int64_t, int64_t, int, int64_t>>;
TcpInstanceCounts TcpInstances();
std::string TcpSetInstances(const TcpInstanceCounts& counts);

// Host messages: `data` from this process to process q under `tag`, outside
// any collective (op id kHostOp, instance `tag`), with the same frame checks
// and MAC as a collective's pieces. TcpRecvBytes waits up to `timeout` for
// q's message under `tag` (at most `max_bytes`); it fails naming q if q's
// connection is lost or the time runs out.
std::string TcpSendBytes(int q, int64_t tag, const std::string& data);
std::string TcpRecvBytes(int q, int64_t tag, uint64_t max_bytes,
                         std::chrono::milliseconds timeout, std::string* out);

// A frame as the progress thread moved it: what the measured network
// (jaxcc.network) reads. Times are CLOCK_REALTIME ns. A received frame runs
// from the kernel's receive timestamp (SO_TIMESTAMPING, software) of the
// data that brought its first header byte to that of the data that brought
// its last byte, so a read the thread made late keeps its data's time (the
// time of the read where the kernel stamps nothing). A sent frame runs from
// the write of its first byte into the socket to the write of its last.
// `bytes` counts header, payload and MAC.
struct FrameRecord {
  int32_t peer;       // the other process
  int32_t direction;  // kFrameReceived or kFrameSent
  int64_t op_id;      // the call site's op id, or -1 for a host message
  int64_t instance;   // the call's instance, or the host message's tag
  int64_t first_ns, last_ns;
  uint64_t bytes;
};
static_assert(sizeof(FrameRecord) == 48, "FrameRecord must have no padding");
constexpr int32_t kFrameReceived = 0;
constexpr int32_t kFrameSent = 1;

// The frames timed since the `since`-th (counting from the engine's start),
// oldest first: those still in the ring of the newest 65,536. Returns the
// count of frames timed so far (the next call's `since`); 0 before TcpStart.
uint64_t TcpRecords(uint64_t since, std::vector<FrameRecord>* out);

// Clears the pacing of every connection (the native probe measures the
// links' own rates); the next paced call sets its rates again.
void TcpUnpace();

// Waits up to `timeout` until every frame queued for a connection that is up
// has been written (a process about to exit); fails naming a process whose
// queue did not drain.
std::string TcpFlush(std::chrono::milliseconds timeout);

// How long a wait of call site (op id, group, rank) lets a peer be silent
// (not even its beats) before it is stuck: half the site's period, the time
// from its previous call's start on this process to `start`, and at least
// kMinPatience; zero (no limit) on the site's first call. Records `start`.
std::chrono::nanoseconds TcpStuckPatience(int64_t op_id, int64_t group, int rank,
                                          std::chrono::steady_clock::time_point start);
// A live peer's progress thread beats every 100 ms (tcp_engine.h: kBeatPeriod),
// however slow its compute; five beats hold a TCP retransmission (200 ms at the
// least) and a progress thread starved on a loaded host.
constexpr std::chrono::milliseconds kMinPatience{500};

// Time this process' calls spent blocked on the network: whole Tcp
// collectives, and the waits of exchange dones (exchange.cc).
void TcpAddBlocked(std::chrono::steady_clock::duration d);
uint64_t TcpBlockedNs();

// What a rank may be sent in one call: the wire bytes of the piece of each
// (step, src) its schedule receives; with `encoded`, at most that many (the
// codec's bound, maybe in parts), else exactly that many raw bytes.
struct TcpReceives {
  std::map<std::pair<int64_t, int>, uint64_t> bytes;
  bool encoded = false;
};

class TcpTransport final : public AsyncTransport {
 public:
  struct Call {
    int64_t op_id, instance, group;
  };

  // The transport of `rank` of `p` for the next execution of (op id, group)
  // on this rank: its instance counts them over the process' lifetime (every
  // process runs the same executions in the same order). procs[r] is the
  // process of rank r; pacing (p * p bytes/s per ordered rank pair, 0: none)
  // may be null (unpaced). Fails if a frame already staged for the call does
  // not fit `receives`; *out is set then too (its Fail tells the peers).
  static std::string Create(int64_t op_id, int64_t group, int p, int rank, const int64_t* procs,
                            const int64_t* pacing, int64_t digest, TcpReceives receives,
                            std::unique_ptr<TcpTransport>* out);
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
  std::string Stray(int rank) override;
  std::string Peer(int rank) const override;  // "rank r (process q)"
  // How long `rank`'s process has sent no byte, counted from `since` at the
  // earliest; zero for a rank of this process, and while bytes from it wait
  // in the socket or its connection is not read (a busy or parked reader
  // here, not a silent peer).
  std::chrono::nanoseconds Silent(int rank,
                                  std::chrono::steady_clock::time_point since) override;
  // Closes the connection to `rank`'s process as lost, saying `why`: every
  // wait on it here ends, and the peer finds this process lost.
  void Drop(int rank, const std::string& why);
  // Fails the call on this process' other ranks and on the other processes.
  void Fail(const std::string& error) override;

 private:
  TcpTransport(tcp::Engine* engine, const Call& call, int rank, std::vector<int> procs,
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
