// Tcp transport: see tcp.h.
#include "tcp.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <new>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

#ifndef SO_MAX_PACING_RATE
#define SO_MAX_PACING_RATE 47
#endif

namespace jaxcc {
namespace {

constexpr uint32_t kMagic = 0x4d43584a;  // "JXCM"
constexpr uint32_t kData = 1;            // a piece of a step, or the last part of one
constexpr uint32_t kAbort = 2;           // a rank failed the call; the payload says why
constexpr uint32_t kPart = 3;            // a part of a piece, more to follow
// Bytes a connection may write per turn, so that a large transfer to one peer
// is striped with the transfers to the others.
constexpr size_t kStripe = size_t{1} << 20;
constexpr uint64_t kMaxMessage = uint64_t{1} << 40;
// Released staging buffers kept for reuse: large pieces skip the page faults.
constexpr size_t kPoolBytes = size_t{512} << 20;
// Abort records kept; the oldest calls' are dropped first.
constexpr size_t kAbortsKept = 4096;
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

std::string Errno(int err) { return std::strerror(err); }

// Whether two messages are for the same receiver of the same call.
bool SameReceiver(const MsgKey& a, const MsgKey& b) {
  return a.op_id == b.op_id && a.instance == b.instance && a.group == b.group && a.dst == b.dst;
}

// A receiver: a rank in one call.
using ReceiverKey = std::tuple<int64_t, int64_t, int64_t, int32_t>;  // op, instance, group, dst

}  // namespace

// The process-wide state: connections, the progress thread, staged messages.
// Everything but the receive state and the sockets' I/O is guarded by mu.
class TcpEngine {
 public:
  TcpEngine(int process, const std::vector<int>& fds, int wake_fd)
      : process(process), conns(fds.size()), wake_fd_(wake_fd) {
    for (size_t q = 0; q < fds.size(); ++q) conns[q].fd = fds[q];
  }

  void Run();
  void Wake() {
    const uint64_t one = 1;
    ssize_t n = write(wake_fd_, &one, sizeof(one));
    (void)n;
  }
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

namespace {

std::mutex g_start_mu;
std::atomic<TcpEngine*> g_engine{nullptr};

}  // namespace

Staging TcpEngine::Allocate(uint64_t bytes) {
  Staging s;
  auto it = pool_.lower_bound(bytes);
  if (it != pool_.end() && it->first <= 2 * bytes + 4096) {
    s.capacity = it->first;
    s.data = std::move(it->second);
    pool_bytes_ -= s.capacity;
    pool_.erase(it);
    return s;
  }
  s.data.reset(new (std::nothrow) char[std::max<uint64_t>(bytes, 1)]);
  if (s.data) s.capacity = std::max<uint64_t>(bytes, 1);
  return s;
}

void TcpEngine::Release(Staging buffer) {
  if (!buffer.data || buffer.capacity > kPoolBytes) return;
  while (pool_bytes_ + buffer.capacity > kPoolBytes && !pool_.empty()) {
    auto smallest = pool_.begin();
    pool_bytes_ -= smallest->first;
    pool_.erase(smallest);
  }
  pool_bytes_ += buffer.capacity;
  pool_.emplace(buffer.capacity, std::move(buffer.data));
}

void TcpEngine::Lose(int q, const std::string& why) {
  Conn& c = conns[q];
  if (!c.error.empty()) return;
  c.error = "the connection to process " + std::to_string(q) + " was lost (" + why + ")";
  if (c.fd >= 0) close(c.fd);
  c.fd = -1;
  c.queue.clear();
  Notify();
}

void TcpEngine::PostAbort(int q, const CallKey& call, int src, const std::string& text) {
  Conn& c = conns[q];
  if (!c.error.empty()) return;
  auto item = std::make_unique<SendItem>();
  item->header = {kMagic, kAbort, call.op_id, call.instance, call.group, 0, src, -1, 0,
                  text.size(), 0};
  item->owned.reset(new char[std::max<size_t>(text.size(), 1)]);
  std::memcpy(item->owned.get(), text.data(), text.size());
  item->payload = item->owned.get();
  c.queue.push_back(std::move(item));
}

void TcpEngine::Detach(const void* owner, std::unique_lock<std::mutex>& lock) {
  auto busy = [&] {
    for (const Conn& c : conns) {
      if (c.writing && !c.queue.empty() && c.queue.front()->owner == owner) return true;
    }
    return false;
  };
  ++detaching_;
  cv.wait(lock, [&] { return !busy(); });  // a send on a non-blocking socket returns at once
  --detaching_;
  for (Conn& c : conns) {
    for (auto it = c.queue.begin(); it != c.queue.end();) {
      SendItem& item = **it;
      if (item.owner != owner) {
        ++it;
      } else if (item.done == 0) {
        it = c.queue.erase(it);
      } else {  // partly on the wire: the rest must follow, from a copy
        item.owned.reset(new char[std::max<uint64_t>(item.header.length, 1)]);
        std::memcpy(item.owned.get(), item.payload, item.header.length);
        item.payload = item.owned.get();
        item.owner = nullptr;
        item.written = nullptr;
        ++it;
      }
    }
  }
}

void TcpEngine::SetPacing(int q, uint64_t rate) {
  Conn& c = conns[q];
  if (c.fd < 0 || c.pacing == rate) return;
  // Best effort: a kernel without pacing leaves the socket unpaced.
  setsockopt(c.fd, SOL_SOCKET, SO_MAX_PACING_RATE, &rate, sizeof(rate));
  c.pacing = rate;
}

void TcpEngine::Run() {
  std::vector<pollfd> fds;
  std::vector<int> peer;
  for (;;) {
    fds.assign(1, pollfd{wake_fd_, POLLIN, 0});
    peer.assign(1, -1);
    {
      std::lock_guard<std::mutex> lock(mu);
      for (size_t q = 0; q < conns.size(); ++q) {
        if (conns[q].fd < 0) continue;
        const short events = POLLIN | (conns[q].queue.empty() ? 0 : POLLOUT);
        fds.push_back(pollfd{conns[q].fd, events, 0});
        peer.push_back(static_cast<int>(q));
      }
    }
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      std::lock_guard<std::mutex> lock(mu);
      for (size_t i = 1; i < peer.size(); ++i) Lose(peer[i], "poll: " + Errno(errno));
      return;
    }
    if (fds[0].revents & POLLIN) {
      uint64_t count;
      ssize_t n = read(wake_fd_, &count, sizeof(count));
      (void)n;
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) Read(peer[i]);
      if (fds[i].revents & POLLOUT) Write(peer[i]);
    }
  }
}

void TcpEngine::Read(int q) {
  Conn& c = conns[q];
  const int fd = c.fd;
  for (size_t budget = 4 * kStripe; fd >= 0 && budget > 0;) {
    const bool in_header = c.header_got < sizeof(WireHeader);
    const ssize_t n =
        in_header ? recv(fd, reinterpret_cast<char*>(&c.header) + c.header_got,
                         sizeof(WireHeader) - c.header_got, MSG_DONTWAIT)
                  : recv(fd, c.incoming.data.get() + c.offset + c.payload_got,
                         std::min<uint64_t>(c.header.length - c.payload_got, budget), MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n <= 0) {
      const std::string why =
          n == 0 ? "process " + std::to_string(q) + " closed it" : "recv: " + Errno(errno);
      std::lock_guard<std::mutex> lock(mu);
      Lose(q, why);
      return;
    }
    budget -= std::min<size_t>(budget, static_cast<size_t>(n));
    if (in_header) {
      c.header_got += static_cast<size_t>(n);
      if (c.header_got < sizeof(WireHeader)) continue;
      const WireHeader& h = c.header;
      std::lock_guard<std::mutex> lock(mu);
      if (h.magic != kMagic || (h.kind != kData && h.kind != kAbort && h.kind != kPart) ||
          h.length > kMaxMessage || h.bound > kMaxMessage || h.src < 0 ||
          (h.kind != kAbort && h.dst < 0)) {
        Lose(q, "it sent a malformed message header");
        return;
      }
      c.offset = 0;
      c.payload_got = 0;
      auto earlier = h.kind == kAbort
                         ? partial.end()
                         : partial.find({h.op_id, h.instance, h.group, h.dst, h.step, h.src});
      if (earlier != partial.end()) {  // a later part: it follows the earlier ones
        c.incoming = std::move(earlier->second.buffer);
        c.offset = earlier->second.length;
        partial.erase(earlier);
      } else {
        c.incoming = Allocate(std::max(h.length, h.bound));
      }
      if (!c.incoming.data) {
        Lose(q, "out of memory for a message of " + std::to_string(h.length) + " bytes");
        return;
      }
      if (c.offset + h.length > c.incoming.capacity) {
        Lose(q, "it sent parts of a piece beyond their bound");
        return;
      }
    } else {
      c.payload_got += static_cast<uint64_t>(n);
    }
    if (c.payload_got == c.header.length) {
      Deliver(q);
      c.header_got = 0;
    }
  }
}

void TcpEngine::Deliver(int q) {
  Conn& c = conns[q];
  const WireHeader& h = c.header;
  std::lock_guard<std::mutex> lock(mu);
  if (h.kind == kAbort) {
    const CallKey call{h.op_id, h.instance, h.group};
    aborts.emplace(call, std::string(c.incoming.data.get(), h.length));
    while (aborts.size() > kAbortsKept) aborts.erase(aborts.begin());
    Release(std::move(c.incoming));
  } else {
    const MsgKey key{h.op_id, h.instance, h.group, h.dst, h.step, h.src};
    Staged piece{std::move(c.incoming), c.offset + h.length, h.digest};
    if (h.kind == kPart) {
      partial[key] = std::move(piece);
    } else {
      Stage(key, std::move(piece));
    }
  }
  Notify();
}

void TcpEngine::Stage(const MsgKey& key, Staged staged) {
  Staged& slot = mailbox[key];
  Release(std::move(slot.buffer));  // a duplicate replaces the first (the runner fails on it)
  slot = std::move(staged);
  arrivals[{key.op_id, key.instance, key.group, key.dst}].push_back({key.step, key.src});
}

void TcpEngine::Write(int q) {
  Conn& c = conns[q];
  const int fd = c.fd;
  for (size_t budget = kStripe; budget > 0;) {
    iovec iov[2];
    int parts = 0;
    SendItem* item;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (c.fd < 0 || c.queue.empty()) return;
      item = c.queue.front().get();
      c.writing = true;
    }
    constexpr uint64_t kHead = sizeof(WireHeader);
    const uint64_t total = kHead + item->header.length;
    if (item->done < kHead) {
      iov[parts++] = {reinterpret_cast<char*>(&item->header) + item->done, kHead - item->done};
    }
    const uint64_t from = item->done > kHead ? item->done - kHead : 0;
    const uint64_t rest = std::min<uint64_t>(item->header.length - from, budget);
    if (rest > 0) iov[parts++] = {const_cast<char*>(item->payload) + from, rest};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = parts;
    const ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    const int err = errno;
    std::lock_guard<std::mutex> lock(mu);
    c.writing = false;
    if (detaching_ > 0) cv.notify_all();
    if (n < 0) {
      if (err != EAGAIN && err != EWOULDBLOCK && err != EINTR) Lose(q, "send: " + Errno(err));
      return;
    }
    item->done += static_cast<uint64_t>(n);
    budget -= std::min<size_t>(budget, static_cast<size_t>(n));
    if (item->done == total) {
      if (item->written) ++*item->written;
      c.queue.pop_front();
      Notify();
    }
  }
}

std::string TcpStart(int process, const std::vector<int>& fds) {
  std::lock_guard<std::mutex> lock(g_start_mu);
  if (g_engine.load()) return "the TCP transport is already started in this process";
  if (process < 0 || static_cast<size_t>(process) >= fds.size()) {
    return "process " + std::to_string(process) + " outside [0, " + std::to_string(fds.size()) +
           ")";
  }
  for (size_t q = 0; q < fds.size(); ++q) {
    if ((static_cast<int>(q) == process) != (fds[q] < 0)) {
      return "need one socket per other process, got " + std::to_string(fds[q]) +
             " for process " + std::to_string(q);
    }
    if (fds[q] >= 0 && fcntl(fds[q], F_SETFL, fcntl(fds[q], F_GETFL) | O_NONBLOCK) < 0) {
      return "fcntl(O_NONBLOCK) on the socket to process " + std::to_string(q) + ": " +
             Errno(errno);
    }
  }
  const int wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd < 0) return "eventfd: " + Errno(errno);
  TcpEngine* engine = new TcpEngine(process, fds, wake_fd);  // lives as long as the process
  std::thread([engine] { engine->Run(); }).detach();
  g_engine.store(engine);
  return "";
}

int TcpProcess() {
  TcpEngine* e = g_engine.load();
  return e ? e->process : -1;
}

int64_t TcpTransport::NextInstance(int64_t op_id, int64_t group, int rank) {
  TcpEngine* e = g_engine.load();
  if (!e) return 0;
  std::lock_guard<std::mutex> lock(e->mu);
  return e->instances[{op_id, group, rank}]++;
}

std::string TcpTransport::Create(const Call& call, int p, int rank, const int64_t* procs,
                                 const int64_t* pacing, int64_t digest,
                                 std::unique_ptr<TcpTransport>* out) {
  TcpEngine* e = g_engine.load();
  if (!e) {
    return "the TCP transport is not started in this process (jaxcc starts it when it lowers a "
           "native collective whose ranks span processes)";
  }
  const int nproc = static_cast<int>(e->conns.size());
  for (int r = 0; r < p; ++r) {
    if (procs[r] < 0 || procs[r] >= nproc) {
      return "rank " + std::to_string(r) + " is on process " + std::to_string(procs[r]) +
             ", outside [0, " + std::to_string(nproc) + ")";
    }
  }
  out->reset(new TcpTransport(e, call, p, rank, procs, digest));
  // The pacing of each connection: the sum over the rank pairs it carries.
  std::vector<uint64_t> rate(nproc, 0);
  for (int src = 0; pacing && src < p; ++src) {
    for (int dst = 0; dst < p; ++dst) {
      if (procs[src] == e->process && procs[dst] != e->process) {
        rate[procs[dst]] += static_cast<uint64_t>(std::max<int64_t>(pacing[src * p + dst], 0));
      }
    }
  }
  std::lock_guard<std::mutex> lock(e->mu);
  for (int r = 0; r < p; ++r) {
    const int q = static_cast<int>(procs[r]);
    if (q != e->process) e->SetPacing(q, rate[q] > 0 ? rate[q] : kUnpaced);
  }
  return "";
}

TcpTransport::TcpTransport(TcpEngine* engine, const Call& call, int p, int rank,
                           const int64_t* procs, int64_t digest)
    : e_(engine), call_(call), rank_(rank), procs_(procs, procs + p), digest_(digest),
      written_(p, 0) {}

TcpTransport::~TcpTransport() {
  std::unique_lock<std::mutex> lock(e_->mu);
  e_->Detach(this, lock);
  // Pieces of this call still staged for this rank (the call failed) are dropped.
  const MsgKey first{call_.op_id, call_.instance, call_.group, rank_, INT64_MIN, INT32_MIN};
  for (auto* staged : {&e_->mailbox, &e_->partial}) {
    for (auto it = staged->lower_bound(first);
         it != staged->end() && SameReceiver(it->first, first);) {
      e_->Release(std::move(it->second.buffer));
      it = staged->erase(it);
    }
  }
  e_->arrivals.erase({call_.op_id, call_.instance, call_.group, rank_});
}

std::string TcpTransport::Peer(int rank) const {
  return "rank " + std::to_string(rank) + " (process " + std::to_string(procs_[rank]) + ")";
}

void TcpTransport::Fail(const std::string& error) {
  std::lock_guard<std::mutex> lock(e_->mu);
  const CallKey call{call_.op_id, call_.instance, call_.group};
  const std::string text = Peer(rank_) + " failed: " + error;
  if (!e_->aborts.emplace(call, text).second) return;  // failed already: told by another rank
  std::set<int> told;
  for (int q : procs_) {
    if (q != e_->process && told.insert(q).second) e_->PostAbort(q, call, rank_, text);
  }
  e_->Notify();
  e_->Wake();
}

std::string TcpTransport::Post(int64_t step, int peer, const char* data, uint64_t bytes,
                               std::unique_ptr<char[]> owned) {
  const MsgKey key{call_.op_id, call_.instance, call_.group, peer, step, rank_};
  const int q = procs_[peer];
  std::unique_lock<std::mutex> lock(e_->mu);
  auto abort = e_->aborts.find({call_.op_id, call_.instance, call_.group});
  if (abort != e_->aborts.end()) return abort->second;
  if (q == e_->process) {  // a rank of this process: staged at once
    Staged staged{Staging{}, bytes, digest_};
    if (owned) {
      staged.buffer.data = std::move(owned);
      staged.buffer.capacity = bytes;
    } else {
      staged.buffer = e_->Allocate(bytes);
      if (!staged.buffer.data) {
        return "out of memory staging " + std::to_string(bytes) + " bytes for " + Peer(peer);
      }
      lock.unlock();
      std::memcpy(staged.buffer.data.get(), data, bytes);
      lock.lock();
      ++written_[peer];
    }
    e_->Stage(key, std::move(staged));
    e_->Notify();
    return "";
  }
  Conn& c = e_->conns[q];
  if (!c.error.empty()) return "cannot send to " + Peer(peer) + ": " + c.error;
  auto item = std::make_unique<SendItem>();
  item->header = {kMagic, kData, call_.op_id, call_.instance, call_.group, step,
                  rank_, peer, digest_, bytes, 0};
  item->payload = data;
  if (owned) {
    item->owned = std::move(owned);
  } else {
    item->owner = this;
    item->written = &written_[peer];
  }
  c.queue.push_back(std::move(item));
  e_->Wake();
  return "";
}

std::string TcpTransport::PostPart(int64_t step, int peer, std::unique_ptr<char[]> data,
                                   uint64_t bytes, uint64_t bound, bool last) {
  const MsgKey key{call_.op_id, call_.instance, call_.group, peer, step, rank_};
  const int q = procs_[peer];
  std::unique_lock<std::mutex> lock(e_->mu);
  auto abort = e_->aborts.find({call_.op_id, call_.instance, call_.group});
  if (abort != e_->aborts.end()) return abort->second;
  if (q == e_->process) {  // a rank of this process: the parts are joined at once
    Staged piece{Staging{}, 0, digest_};
    auto earlier = e_->partial.find(key);
    if (earlier != e_->partial.end()) {
      piece = std::move(earlier->second);
      e_->partial.erase(earlier);
    } else {
      piece.buffer = e_->Allocate(std::max(bytes, bound));
    }
    if (!piece.buffer.data || piece.length + bytes > piece.buffer.capacity) {
      return "cannot stage " + std::to_string(bytes) + " more bytes of a piece for " + Peer(peer);
    }
    lock.unlock();  // only this rank writes the piece
    std::memcpy(piece.buffer.data.get() + piece.length, data.get(), bytes);
    lock.lock();
    piece.length += bytes;
    if (last) {
      e_->Stage(key, std::move(piece));
      e_->Notify();
    } else {
      e_->partial[key] = std::move(piece);
    }
    return "";
  }
  Conn& c = e_->conns[q];
  if (!c.error.empty()) return "cannot send to " + Peer(peer) + ": " + c.error;
  auto item = std::make_unique<SendItem>();
  item->header = {kMagic, last ? kData : kPart, call_.op_id, call_.instance, call_.group, step,
                  rank_, peer, digest_, bytes, bound};
  item->payload = data.get();
  item->owned = std::move(data);
  c.queue.push_back(std::move(item));
  e_->Wake();
  return "";
}

std::string TcpTransport::Sync(std::vector<Arrival>* arrived, std::vector<int64_t>* written,
                               uint64_t* events) {
  std::lock_guard<std::mutex> lock(e_->mu);
  auto abort = e_->aborts.find({call_.op_id, call_.instance, call_.group});
  if (abort != e_->aborts.end()) return abort->second;
  auto mine = e_->arrivals.find({call_.op_id, call_.instance, call_.group, rank_});
  if (mine != e_->arrivals.end()) {
    for (const Arrival& a : mine->second) {
      // A piece from a rank that planned another schedule fails the call.
      auto it = e_->mailbox.find({call_.op_id, call_.instance, call_.group, rank_, a.step, a.src});
      if (it != e_->mailbox.end() && it->second.digest != digest_) {
        return Peer(a.src) + " planned a different schedule than " + Peer(rank_) +
               " (digests " + std::to_string(it->second.digest) + " and " +
               std::to_string(digest_) + "): the axis size, topology or arguments differ "
               "between processes; every process must pass the same ones";
      }
    }
    arrived->insert(arrived->end(), mine->second.begin(), mine->second.end());
    e_->arrivals.erase(mine);
  }
  *written = written_;
  *events = e_->events;
  return "";
}

std::string TcpTransport::View(int64_t step, int src, const char** data, uint64_t* bytes) {
  std::lock_guard<std::mutex> lock(e_->mu);
  auto it = e_->mailbox.find({call_.op_id, call_.instance, call_.group, rank_, step, src});
  if (it == e_->mailbox.end()) {
    return "the piece of " + Peer(src) + " at step " + std::to_string(step) + " is gone";
  }
  *data = it->second.buffer.data.get();
  *bytes = it->second.length;
  return "";
}

void TcpTransport::Release(int64_t step, int src) {
  std::lock_guard<std::mutex> lock(e_->mu);
  auto it = e_->mailbox.find({call_.op_id, call_.instance, call_.group, rank_, step, src});
  if (it == e_->mailbox.end()) return;
  e_->Release(std::move(it->second.buffer));
  e_->mailbox.erase(it);
}

void TcpTransport::Wait(uint64_t events, std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(e_->mu);
  e_->cv.wait_until(lock, deadline, [&] { return e_->events != events; });
}

std::string TcpTransport::Lost(int rank) {
  std::lock_guard<std::mutex> lock(e_->mu);
  const int q = procs_[rank];
  return q == e_->process ? "" : e_->conns[q].error;
}

}  // namespace jaxcc
