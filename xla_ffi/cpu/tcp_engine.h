// The Tcp transport's engine: the process-wide connections to the other
// processes, the progress thread that owns their sockets, and the messages
// staged for this process' ranks (tcp.h describes the protocol). TcpStart
// makes the one engine; every TcpTransport runs on it.
#ifndef JAXCC_CPU_TCP_ENGINE_H_
#define JAXCC_CPU_TCP_ENGINE_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "jaxcc/dataflow.h"

namespace jaxcc {
namespace tcp {

constexpr uint32_t kMagic = 0x4d43584a;  // "JXCM"
constexpr uint32_t kData = 1;            // a piece of a step, or the last part of one
constexpr uint32_t kAbort = 2;           // a rank failed the call; the payload says why
constexpr uint32_t kPart = 3;            // a part of a piece, more to follow
constexpr uint64_t kUnpaced = ~uint64_t{0};

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
};

struct SendItem {
  WireHeader header;
  const char* payload;
  uint64_t done = 0;                // bytes of header and payload written
  std::unique_ptr<char[]> owned;    // the payload, once it no longer lives in a caller's buffer
  const void* owner = nullptr;      // the transport whose buffer holds the payload
  int64_t* written = nullptr;       // its count of pieces to the receiver that left the buffer
};

struct Conn {
  int fd = -1;
  std::deque<std::unique_ptr<SendItem>> queue;
  bool writing = false;  // the progress thread is in a send of the queue's head
  std::string error;     // why the connection was lost; empty while it is up
  uint64_t pacing = kUnpaced;
  // Receive state, touched by the progress thread only.
  WireHeader header{};
  size_t header_got = 0;
  Staging incoming;
  uint64_t offset = 0;  // bytes of the piece's earlier parts in `incoming`
  uint64_t payload_got = 0;
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
  Engine(int process, const std::vector<int>& fds, int wake_fd)
      : process(process), conns(fds.size()), wake_fd_(wake_fd) {
    for (size_t q = 0; q < fds.size(); ++q) conns[q].fd = fds[q];
  }

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
  std::map<CallKey, std::string> aborts;
  std::map<std::tuple<int64_t, int64_t, int>, int64_t> instances;

 private:
  void Read(int q);
  void Write(int q);
  void Deliver(int q);

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
