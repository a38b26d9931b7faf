// The Tcp transport's engine: the process-wide connections to the other
// processes, the progress thread that owns their sockets, and the messages
// staged for this process' ranks (tcp.h describes the protocol). TcpStart
// makes the one engine; every TcpTransport runs on it.
//
// Every frame is checked before a rank sees a byte of it (Admit): its header,
// before its payload is read, against what the receiver's call may be sent
// (Expected, registered when the call starts); a frame for a call that has
// not started here is staged as pending and checked when the call starts; a
// frame for a call that failed is read and dropped. A frame that does not
// fit closes its connection and fails the receiver's call, naming the
// process and the field; one planned on another schedule (another digest)
// fails the call only. Pending frames take at most kPendingBytes per
// connection; past that the connection is not read until a call takes them
// (TCP's flow control holds the sender back).
#ifndef JAXCC_CPU_TCP_ENGINE_H_
#define JAXCC_CPU_TCP_ENGINE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "hmac_sha256.h"
#include "jaxcc/dataflow.h"
#include "tcp.h"

namespace jaxcc {
namespace tcp {

constexpr uint32_t kMagic = 0x4d43584a;  // "JXCM"
constexpr uint32_t kData = 1;            // a piece of a step, or the last part of one
constexpr uint32_t kAbort = 2;           // a rank failed the call; the payload says why
constexpr uint32_t kPart = 3;            // a part of a piece, more to follow
constexpr uint32_t kBeat = 4;            // no payload: the sender's progress thread runs
// A connection with nothing to send for this long carries a beat, so that a peer
// waiting on it tells a stopped or cut-off process (silent) from a slow one.
constexpr std::chrono::milliseconds kBeatPeriod{100};
constexpr uint64_t kUnpaced = ~uint64_t{0};
constexpr uint64_t kMacBytes = 32;      // with integrity: HMAC-SHA256 after each frame
constexpr uint64_t kMaxAbortText = 1 << 16;
constexpr uint64_t kPendingBytes = uint64_t{1} << 30;
constexpr std::chrono::seconds kRejoinWait{30};  // TcpRejoin's wait for the progress thread
constexpr int64_t kHostOp = -1;  // the op id of host messages (TcpSendBytes); call sites are > 0
constexpr size_t kRecordsKept = size_t{1} << 16;  // frames timed (TcpRecords), the newest

// The steady clock in ns.
inline int64_t SteadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct WireHeader {
  uint32_t magic;
  uint32_t kind;
  int64_t op_id, instance, group, step;
  int32_t src, dst;
  int64_t digest;
  uint64_t length;  // payload bytes that follow
  uint64_t bound;   // the first part of a piece: the most its parts take together
};
static_assert(sizeof(WireHeader) == 72, "WireHeader must have no padding");

struct CallKey {
  int64_t op_id, instance, group;
  bool operator<(const CallKey& o) const {
    return std::tie(op_id, instance, group) < std::tie(o.op_id, o.instance, o.group);
  }
};

// Messages sort by call, then receiver, so one receiver's are a contiguous range.
struct MsgKey {
  int64_t op_id, instance, group;
  int32_t dst;
  int64_t step;
  int32_t src;
  bool operator<(const MsgKey& o) const {
    return std::tie(op_id, instance, group, dst, step, src) <
           std::tie(o.op_id, o.instance, o.group, o.dst, o.step, o.src);
  }
};

struct Staging {
  std::unique_ptr<char[]> data;
  size_t capacity = 0;
};

struct Staged {
  Staging buffer;
  uint64_t length;
  int64_t digest;
  int from = -1;         // the process it came from; -1: this one
  bool pending = false;  // for a call not started here when it came: not yet checked
  uint64_t bound = 0;    // the most its parts take, as its first part said
};

// A receiver (a rank in one call) as registered when its call starts.
struct Expected {
  std::vector<int> procs;  // the process of each rank
  int64_t digest;
  TcpReceives receives;
  std::set<std::pair<int64_t, int>> received;  // (step, src) of the whole pieces staged
  std::string refused;                         // why a frame for it was refused
};

struct SendItem {
  WireHeader header;
  const char* payload;
  uint64_t done = 0;                // bytes of header, payload and MAC written
  int64_t first_ns = 0;             // when its first byte was written (CLOCK_REALTIME)
  uint8_t mac[kMacBytes];           // with integrity, once the payload is written
  std::unique_ptr<char[]> owned;    // the payload, once it no longer lives in a caller's buffer
  const void* owner = nullptr;      // the transport whose buffer holds the payload
  int64_t* written = nullptr;       // its count of pieces to the receiver that left the buffer
};

struct Conn {
  int fd = -1;
  std::deque<std::unique_ptr<SendItem>> queue;
  bool writing = false;  // the progress thread is in a send of the queue's head
  int64_t wrote_ns = 0;  // when bytes were last written to it (steady clock, ns)
  std::string error;     // why the connection was lost; empty while it is up
  double lost_at = 0;    // when it was found lost, seconds since the Unix epoch
  uint64_t pacing = kUnpaced;
  uint64_t pending_bytes = 0;  // staged from it for calls not started here
  bool parked = false;         // not read until pending frames are taken
  // The progress thread's own state: the frame being received, the MACs.
  WireHeader header{};
  size_t header_got = 0;
  int64_t first_ns = 0;   // when the frame's first byte came (tcp.h: FrameRecord)
  int64_t last_ns = 0;    // when the latest bytes read came
  // When bytes from q (a beat at least every kBeatPeriod) were last read or
  // its connection began (steady clock, ns): what a wait for q asks to tell a
  // stuck peer from a slow one.
  std::atomic<int64_t> heard_ns{0};
  bool admitted = false;  // the header passed Admit: its payload is being read
  bool drain = false;     // the payload is read and dropped (a failed call's frame)
  bool pending = false;   // the frame is for a call not started here
  Staging incoming;
  uint64_t offset = 0;  // bytes of the piece's earlier parts in `incoming`
  uint64_t bound = 0;   // the most the piece's parts take
  uint64_t payload_got = 0;
  uint8_t trailer[kMacBytes];
  size_t trailer_got = 0;
  HmacSha256 send_mac, receive_mac;  // keyed with the connection's key
  uint64_t sent_frames = 0, received_frames = 0;
};

// Whether two messages are for the same receiver of the same call.
inline bool SameReceiver(const MsgKey& a, const MsgKey& b) {
  return a.op_id == b.op_id && a.instance == b.instance && a.group == b.group && a.dst == b.dst;
}

// A receiver: a rank in one call.
using ReceiverKey = std::tuple<int64_t, int64_t, int64_t, int32_t>;  // op, instance, group, dst

// The process-wide state: connections, the progress thread, staged messages.
// Everything but the receive state and the sockets' I/O is guarded by mu.
class Engine {
 public:
  // keys[q]: the key of the connection to q; with `integrity` every frame carries a MAC.
  Engine(int process, const std::vector<int>& fds, const std::vector<std::string>& keys,
         bool integrity, int wake_fd);

  void Run();
  void Wake();  // wakes the progress thread from its poll
  // A staging buffer of at least `bytes`, null if memory ran out (mu held).
  Staging Allocate(uint64_t bytes);
  void Release(Staging buffer);  // mu held
  // Marks the connection to q lost and wakes every waiter (mu held).
  void Lose(int q, const std::string& why);
  // Queues an abort of `call` to process q (mu held).
  void PostAbort(int q, const CallKey& call, int src, const std::string& text);
  // Detaches the items `owner` queued from its buffer (mu held via `lock`).
  void Detach(const void* owner, std::unique_lock<std::mutex>& lock);
  void SetPacing(int q, uint64_t rate);  // mu held
  // Stages a message and tells its receiver (mu held).
  void Stage(const MsgKey& key, Staged staged);
  // Registers a receiver whose call starts, checking the frames pending for
  // its call; returns why one does not fit, empty if all do (mu held).
  std::string Register(const ReceiverKey& receiver, Expected expected);
  // Queues a new connection to q, with its key, for the progress thread; it
  // is in use once `rejoined` reaches the returned ticket (mu held).
  uint64_t Rejoin(int q, int fd, const std::string& key);
  // The frames from process q pending for calls not started here (mu held).
  std::string Stray(int q) const;
  // How long process q has sent nothing, counted from `since_ns` (steady
  // clock) at the earliest; zero while bytes from it wait in the socket or
  // its connection is not read (a busy or parked reader here, not a silent
  // peer) (mu held: the progress thread closes fds under it).
  int64_t SilentNs(int q, int64_t since_ns) const;
  // Times a frame to or from process q, a beat excepted (mu held).
  void Record(int q, int32_t direction, const WireHeader& h, int64_t first_ns, int64_t last_ns,
              uint64_t bytes);
  // Moves the event counter and wakes every waiter (mu held).
  void Notify() {
    ++events;
    cv.notify_all();
  }

  const int process;
  std::mutex mu;
  std::condition_variable cv;
  uint64_t events = 0;
  std::vector<Conn> conns;
  std::map<MsgKey, Staged> mailbox;
  std::map<MsgKey, Staged> partial;  // pieces whose last part has not come
  std::map<ReceiverKey, std::vector<Arrival>> arrivals;  // staged, not yet seen by the receiver
  std::map<ReceiverKey, Expected> expected;  // receivers whose calls run
  std::map<CallKey, std::string> aborts;
  std::map<std::tuple<int64_t, int64_t, int>, int64_t> instances;
  // Per (op id, group, rank): the instances a rejoin skipped here (TcpSetInstances),
  // [first, end). A frame for one is a peer's that the cut delayed: drained, not refused.
  std::map<std::tuple<int64_t, int64_t, int>, std::pair<int64_t, int64_t>> skipped;
  uint64_t rejoined = 0;  // new connections in use
  std::vector<FrameRecord> records;  // a ring of the newest kRecordsKept frames
  uint64_t records_total = 0;        // frames timed since the engine started

 private:
  void Read(int q);
  void Write(int q);
  // Checks the header just read from q and sets up its payload; false if the
  // frame was refused (the connection is closed) or q is parked (mu held).
  bool Admit(int q);
  // Why a frame or staged piece (total bytes `total`, of which the first
  // `bound` is the most its parts take) from q does not fit `e`; empty if it
  // does. `later`: a later part of a piece.
  std::string Fits(const Expected& e, int q, const MsgKey& key, uint32_t kind, uint64_t total,
                   uint64_t bound, bool later) const;
  // Why a frame from q with `digest` was planned on another schedule than
  // `e`; empty if it was not. Such a frame fails its call but not its
  // connection: the processes disagree, none is broken.
  std::string Mismatch(const Expected& e, int q, int64_t digest) const;
  // Closes the connection to q for a frame that does not fit and fails its
  // receiver's call (mu held).
  void Refuse(int q, const MsgKey& key, const std::string& why);
  void Finish(int q);  // the frame's last byte came: checks its MAC, delivers it
  void Deliver(int q);
  void ApplyRejoins();  // progress thread; mu held
  void CloseLost();     // closes the sockets of lost connections (progress thread; mu held)
  // Queues a beat on each idle connection due one; returns how long until the
  // next is due (progress thread; mu held).
  std::chrono::milliseconds Beat();
  // Drops q's pending pieces and its pieces still missing parts (mu held).
  void Purge(int q);
  void Reset(Conn& c);  // the receive state of a fresh connection (mu held)

  struct NewConn {
    int q, fd;
    std::string key;
  };
  const bool integrity_;
  std::unique_ptr<char[]> drain_;  // where dropped frames are read
  std::vector<NewConn> rejoins_;
  int wake_fd_;
  int detaching_ = 0;  // threads in Detach, waiting for a send to return
  std::multimap<size_t, std::unique_ptr<char[]>> pool_;
  size_t pool_bytes_ = 0;
};

// The engine TcpStart made, null before.
Engine* Started();

}  // namespace tcp
}  // namespace jaxcc

#endif  // JAXCC_CPU_TCP_ENGINE_H_
