// The Tcp transport's engine (tcp_engine.h), TcpStart and TcpRejoin (tcp.h).
#include "tcp_engine.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/errqueue.h>
#include <linux/net_tstamp.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <new>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

#include "tcp.h"

#ifndef SO_MAX_PACING_RATE
#define SO_MAX_PACING_RATE 47
#endif

namespace jaxcc {
namespace tcp {
namespace {

// Bytes a connection may write per turn, so that a large transfer to one peer
// is striped with the transfers to the others.
constexpr size_t kStripe = size_t{1} << 20;
constexpr uint64_t kMaxMessage = uint64_t{1} << 40;
// Released staging buffers kept for reuse: large pieces skip the page faults.
constexpr size_t kPoolBytes = size_t{512} << 20;
// Abort records kept; the oldest calls' are dropped first.
constexpr size_t kAbortsKept = 4096;
constexpr uint64_t kHead = sizeof(WireHeader);
constexpr size_t kDrainBytes = size_t{1} << 16;  // a dropped frame is read this much at a time

std::string Errno(int err) { return std::strerror(err); }

MsgKey KeyOf(const WireHeader& h) {
  return {h.op_id, h.instance, h.group, h.dst, h.step, h.src};
}

ReceiverKey ReceiverOf(const MsgKey& k) { return {k.op_id, k.instance, k.group, k.dst}; }

bool SameCall(const MsgKey& a, const MsgKey& b) {
  return a.op_id == b.op_id && a.instance == b.instance && a.group == b.group;
}

// "op O instance I group G, step S from rank R to rank D".
std::string Describe(const MsgKey& k) {
  return "op " + std::to_string(k.op_id) + " instance " + std::to_string(k.instance) +
         " group " + std::to_string(k.group) + ", step " + std::to_string(k.step) +
         " from rank " + std::to_string(k.src) + " to rank " + std::to_string(k.dst);
}

// The start of a refusal: "process Q sent a frame (<Describe>) whose ".
std::string SentFrame(int q, const MsgKey& k) {
  return "process " + std::to_string(q) + " sent a frame (" + Describe(k) + ") whose ";
}

// A frame's MAC covers its number on the connection, its header and its payload.
void StartMac(HmacSha256& mac, uint64_t number, const WireHeader& h) {
  uint8_t n[8];
  for (int i = 0; i < 8; ++i) n[i] = static_cast<uint8_t>(number >> (8 * i));
  mac.Reset();
  mac.Update(n, sizeof(n));
  mac.Update(&h, kHead);
}

// The records' clock: CLOCK_REALTIME, the clock of the kernel's receive timestamps.
int64_t NowNs() {
  timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return int64_t{t.tv_sec} * 1000000000 + t.tv_nsec;
}

// Asks the kernel to stamp received data (best effort: without it reads are timed as they run).
void StampReceives(int fd) {
  const int flags = SOF_TIMESTAMPING_RX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE;
  setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPING, &flags, sizeof(flags));
}

// recv that also returns when the last skb it read reached the socket (the kernel's software
// timestamp; the time of the call where the kernel gives none): a late read keeps its data's time.
ssize_t RecvStamped(int fd, char* into, size_t want, int64_t* stamp_ns) {
  iovec iov{into, want};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(scm_timestamping))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = recvmsg(fd, &msg, MSG_DONTWAIT);
  *stamp_ns = 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); n > 0 && c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPING) {
      scm_timestamping ts;
      std::memcpy(&ts, CMSG_DATA(c), sizeof(ts));
      *stamp_ns = int64_t{ts.ts[0].tv_sec} * 1000000000 + ts.ts[0].tv_nsec;
    }
  }
  if (n > 0 && *stamp_ns == 0) *stamp_ns = NowNs();
  return n;
}

std::mutex g_start_mu;
std::atomic<Engine*> g_engine{nullptr};

}  // namespace

Engine* Started() { return g_engine.load(); }

Engine::Engine(int process, const std::vector<int>& fds, const std::vector<std::string>& keys,
               bool integrity, int wake_fd)
    : process(process), conns(fds.size()), integrity_(integrity),
      drain_(new char[kDrainBytes]), wake_fd_(wake_fd) {
  const int64_t now = SteadyNs();
  for (size_t q = 0; q < fds.size(); ++q) {
    conns[q].fd = fds[q];
    conns[q].heard_ns = now;
    conns[q].wrote_ns = now;
    const auto* key = reinterpret_cast<const uint8_t*>(keys[q].data());
    conns[q].send_mac = conns[q].receive_mac = HmacSha256(key, keys[q].size());
  }
}

void Engine::Wake() {
  const uint64_t one = 1;
  ssize_t n = write(wake_fd_, &one, sizeof(one));
  (void)n;
}

Staging Engine::Allocate(uint64_t bytes) {
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

void Engine::Release(Staging buffer) {
  if (!buffer.data || buffer.capacity > kPoolBytes) return;
  while (pool_bytes_ + buffer.capacity > kPoolBytes && !pool_.empty()) {
    auto smallest = pool_.begin();
    pool_bytes_ -= smallest->first;
    pool_.erase(smallest);
  }
  pool_bytes_ += buffer.capacity;
  pool_.emplace(buffer.capacity, std::move(buffer.data));
}

void Engine::Lose(int q, const std::string& why) {
  Conn& c = conns[q];
  if (!c.error.empty()) return;
  c.error = "the connection to process " + std::to_string(q) + " was lost (" + why + ")";
  c.lost_at = std::chrono::duration<double>(
                  std::chrono::system_clock::now().time_since_epoch()).count();
  // The progress thread closes the socket and drops its queue (CloseLost).
  if (c.fd >= 0) shutdown(c.fd, SHUT_RDWR);
  Purge(q);
  Wake();
  Notify();
}

void Engine::Record(int q, int32_t direction, const WireHeader& h, int64_t first_ns,
                    int64_t last_ns, uint64_t bytes) {
  if (h.kind == kBeat) return;  // beats are not timed
  const FrameRecord r{q, direction, h.op_id, h.instance, first_ns, last_ns, bytes};
  if (records.size() < kRecordsKept) {
    records.push_back(r);
  } else {
    records[records_total % kRecordsKept] = r;
  }
  ++records_total;
}

void Engine::Purge(int q) {
  // Pieces from q that no call has taken, and parts that cannot be completed.
  for (auto* staged : {&mailbox, &partial}) {
    for (auto it = staged->begin(); it != staged->end();) {
      if (it->second.from == q && (it->second.pending || staged == &partial)) {
        Release(std::move(it->second.buffer));
        it = staged->erase(it);
      } else {
        ++it;
      }
    }
  }
  conns[q].pending_bytes = 0;
  conns[q].parked = false;
}

void Engine::Reset(Conn& c) {
  c.header_got = 0;
  c.admitted = c.drain = c.pending = false;
  Release(std::move(c.incoming));
  c.offset = c.payload_got = c.trailer_got = 0;
}

void Engine::CloseLost() {
  for (Conn& c : conns) {
    if (c.error.empty() || c.fd < 0) continue;
    close(c.fd);
    c.fd = -1;
    c.queue.clear();
    Reset(c);
  }
}

uint64_t Engine::Rejoin(int q, int fd, const std::string& key) {
  rejoins_.push_back({q, fd, key});
  Wake();
  return rejoined + rejoins_.size();
}

void Engine::ApplyRejoins() {
  for (NewConn& n : rejoins_) {
    Conn& c = conns[n.q];
    if (c.fd >= 0) close(c.fd);
    c.fd = n.fd;
    c.error.clear();
    c.lost_at = 0;
    c.queue.clear();
    c.pacing = kUnpaced;
    Purge(n.q);
    Reset(c);
    const auto* key = reinterpret_cast<const uint8_t*>(n.key.data());
    c.send_mac = c.receive_mac = HmacSha256(key, n.key.size());
    c.sent_frames = c.received_frames = 0;
    c.heard_ns = c.wrote_ns = SteadyNs();
  }
  rejoined += rejoins_.size();
  if (!rejoins_.empty()) Notify();
  rejoins_.clear();
}

std::chrono::milliseconds Engine::Beat() {
  const int64_t now = SteadyNs();
  const int64_t period = std::chrono::nanoseconds(kBeatPeriod).count();
  int64_t next = period;
  for (Conn& c : conns) {
    if (c.fd < 0 || !c.error.empty() || !c.queue.empty()) continue;
    const int64_t due = c.wrote_ns + period - now;
    if (due > 0) {
      next = std::min(next, due);
      continue;
    }
    auto item = std::make_unique<SendItem>();
    item->header = {kMagic, kBeat, 0, 0, 0, 0, process, -1, 0, 0, 0};
    item->payload = nullptr;  // a header only
    c.queue.push_back(std::move(item));
  }
  return std::chrono::milliseconds(1 + next / 1000000);
}

void Engine::PostAbort(int q, const CallKey& call, int src, const std::string& text) {
  Conn& c = conns[q];
  if (!c.error.empty()) return;
  const std::string said = text.substr(0, kMaxAbortText);
  auto item = std::make_unique<SendItem>();
  item->header = {kMagic, kAbort, call.op_id, call.instance, call.group, 0, src, -1, 0,
                  said.size(), 0};
  item->owned.reset(new char[std::max<size_t>(said.size(), 1)]);
  std::memcpy(item->owned.get(), said.data(), said.size());
  item->payload = item->owned.get();
  c.queue.push_back(std::move(item));
}

void Engine::Detach(const void* owner, std::unique_lock<std::mutex>& lock) {
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

void Engine::SetPacing(int q, uint64_t rate) {
  Conn& c = conns[q];
  if (c.fd < 0 || c.pacing == rate) return;
  // Best effort: a kernel without pacing leaves the socket unpaced.
  setsockopt(c.fd, SOL_SOCKET, SO_MAX_PACING_RATE, &rate, sizeof(rate));
  c.pacing = rate;
}

std::string Engine::Fits(const Expected& e, int q, const MsgKey& k, uint32_t kind,
                         uint64_t total, uint64_t bound, bool later) const {
  auto sent = [&] { return SentFrame(q, k); };  // built only for a refusal
  const int p = static_cast<int>(e.procs.size());
  if (k.src < 0 || k.src >= p) {
    return sent() + "src is not one of the call's " + std::to_string(p) + " ranks";
  }
  if (e.procs[k.src] != q) {
    return sent() + "src is a rank of process " + std::to_string(e.procs[k.src]) +
           ", not of the process that sent it";
  }
  auto piece = e.receives.bytes.find({k.step, k.src});
  if (piece == e.receives.bytes.end()) {
    return sent() + "step is not one at which the schedule sends rank " + std::to_string(k.dst) +
           " a piece from rank " + std::to_string(k.src);
  }
  if (!later && e.received.count({k.step, k.src})) {
    return sent() + "step's piece came already";
  }
  if (kind == kPart && !e.receives.encoded) {
    return sent() + "kind is a part of a split piece, but the call's pieces are raw";
  }
  const uint64_t limit = piece->second;
  if (!e.receives.encoded && kind == kData && total != limit) {
    return sent() + "length " + std::to_string(total) + " is not the piece's " +
           std::to_string(limit) + " bytes";
  }
  if (total > limit || bound > limit) {
    return sent() +
           (total > limit ? "length " + std::to_string(total) : "bound " + std::to_string(bound)) +
           " is more than the " + std::to_string(limit) + " bytes the piece's encoding may take";
  }
  return "";
}

std::string Engine::Mismatch(const Expected& e, int q, int64_t digest) const {
  if (digest == e.digest) return "";
  return "process " + std::to_string(q) + " planned a different schedule than this one "
         "(digests " + std::to_string(digest) + " and " + std::to_string(e.digest) + "): the "
         "axis size, topology or arguments differ between processes; every process must pass "
         "the same ones";
}

void Engine::Refuse(int q, const MsgKey& key, const std::string& why) {
  auto receiver = expected.find(ReceiverOf(key));
  if (receiver != expected.end() && receiver->second.refused.empty()) {
    receiver->second.refused = why + "; the connection is closed";
  }
  Lose(q, why);
}

std::string Engine::Register(const ReceiverKey& receiver, Expected e) {
  Expected& mine = expected[receiver] = std::move(e);
  const auto& [op_id, instance, group, rank] = receiver;
  const int p = static_cast<int>(mine.procs.size());
  const MsgKey first{op_id, instance, group, INT32_MIN, INT64_MIN, INT32_MIN};
  struct Refusal {
    int q;
    MsgKey key;
    std::string why;
  };
  std::vector<Refusal> refusals;
  std::set<int> freed;
  for (auto* staged : {&mailbox, &partial}) {
    for (auto it = staged->lower_bound(first); it != staged->end() && SameCall(it->first, first);) {
      const MsgKey& k = it->first;
      Staged& s = it->second;
      const bool local = k.dst >= 0 && k.dst < p && mine.procs[k.dst] == process;
      if (!s.pending || (local && k.dst != rank)) {  // checked, or another rank's to check
        ++it;
        continue;
      }
      conns[s.from].pending_bytes -= std::min(conns[s.from].pending_bytes, s.buffer.capacity);
      freed.insert(s.from);
      const std::string mismatch = local ? Mismatch(mine, s.from, s.digest) : "";
      const std::string why =
          !local ? SentFrame(s.from, k) + "dst is not a rank of this process"
          : mismatch.empty() ? Fits(mine, s.from, k, staged == &partial ? kPart : kData,
                                    s.length, s.bound, false)
                             : "";
      if (!mismatch.empty() && mine.refused.empty()) mine.refused = mismatch;
      if (why.empty() && mismatch.empty()) {
        s.pending = false;
        if (staged == &mailbox) {
          arrivals[receiver].push_back({k.step, k.src});
          mine.received.insert({k.step, k.src});
        }
        ++it;
      } else {
        if (!why.empty()) refusals.push_back({s.from, k, why});
        Release(std::move(s.buffer));
        it = staged->erase(it);
      }
    }
  }
  for (int q : freed) {
    if (conns[q].parked && conns[q].pending_bytes < kPendingBytes) {
      conns[q].parked = false;
      Wake();
    }
  }
  for (const Refusal& r : refusals) Refuse(r.q, r.key, r.why);
  return !mine.refused.empty() ? mine.refused : refusals.empty() ? "" : refusals.front().why;
}

int64_t Engine::SilentNs(int q, int64_t since_ns) const {
  const Conn& c = conns[q];
  int unread = 0;
  if (c.parked || (c.fd >= 0 && ioctl(c.fd, FIONREAD, &unread) == 0 && unread > 0)) return 0;
  return std::max<int64_t>(0, SteadyNs() - std::max(c.heard_ns.load(std::memory_order_relaxed),
                                                    since_ns));
}

std::string Engine::Stray(int q) const {
  std::string listed;
  size_t frames = 0;
  for (const auto* staged : {&mailbox, &partial}) {
    for (const auto& [k, s] : *staged) {
      if (s.from != q || !s.pending) continue;
      if (frames++ < 3) listed += (listed.empty() ? "" : "; ") + Describe(k);
    }
  }
  if (frames == 0) return "";
  return "process " + std::to_string(q) + " sent " + std::to_string(frames) +
         " frame(s) for calls that have not started here (" + listed +
         (frames > 3 ? "; ..." : "") + "): an op id, instance or group this process does not run";
}

void Engine::Run() {
  std::vector<pollfd> fds;
  std::vector<int> peer;
  std::chrono::milliseconds beat;
  for (;;) {
    fds.assign(1, pollfd{wake_fd_, POLLIN, 0});
    peer.assign(1, -1);
    {
      std::lock_guard<std::mutex> lock(mu);
      ApplyRejoins();
      CloseLost();
      beat = Beat();
      for (size_t q = 0; q < conns.size(); ++q) {
        const Conn& c = conns[q];
        const short events = (c.parked ? 0 : POLLIN) | (c.queue.empty() ? 0 : POLLOUT);
        if (c.fd < 0 || events == 0) continue;
        fds.push_back(pollfd{c.fd, events, 0});
        peer.push_back(static_cast<int>(q));
      }
    }
    if (poll(fds.data(), fds.size(), static_cast<int>(beat.count())) < 0) {
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

bool Engine::Admit(int q) {
  Conn& c = conns[q];
  const WireHeader& h = c.header;
  const MsgKey key = KeyOf(h);
  auto sent = [&] { return "process " + std::to_string(q) + " sent a frame whose "; };
  auto refuse = [&](const std::string& why) {
    Refuse(q, key, why);
    return false;
  };
  if (h.magic != kMagic) {
    return refuse(sent() + "magic " + std::to_string(h.magic) + " is not jaxcc's");
  }
  if (h.kind != kData && h.kind != kAbort && h.kind != kPart && h.kind != kBeat) {
    return refuse(sent() + "kind " + std::to_string(h.kind) +
                  " is none of data, part, abort or beat");
  }
  c.drain = c.pending = false;
  c.offset = c.payload_got = c.trailer_got = 0;
  if (h.kind == kBeat) {
    if (h.length != 0) {
      return refuse(sent() + "length " + std::to_string(h.length) + " is not a beat's 0");
    }
    c.drain = true;  // nothing to deliver: its bytes were the news
  } else if (h.kind == kAbort) {
    if (h.length > kMaxAbortText) {
      return refuse(sent() + "length " + std::to_string(h.length) + " is more than an abort's " +
                    std::to_string(kMaxAbortText) + " bytes");
    }
    c.incoming = Allocate(h.length);
  } else {
    auto which = [&] { return SentFrame(q, key); };  // built only for a refusal
    if (h.length > kMaxMessage || h.bound > kMaxMessage) {
      return refuse(which() + (h.length > kMaxMessage ? "length " + std::to_string(h.length)
                                                     : "bound " + std::to_string(h.bound)) +
                    " is more than 2^40 bytes");
    }
    if (h.src < 0 || h.dst < 0) {
      return refuse(which() + (h.src < 0 ? "src" : "dst") + " is negative");
    }
    auto earlier = partial.find(key);
    const bool later = earlier != partial.end();
    if (later && earlier->second.from != q) {
      return refuse(which() + "src is a rank whose piece another process began");
    }
    if (!later && mailbox.count(key)) return refuse(which() + "step's piece came already");
    const uint64_t before = later ? earlier->second.length : 0;
    auto receiver = expected.find(ReceiverOf(key));
    const std::string mismatch =
        receiver != expected.end() ? Mismatch(receiver->second, q, h.digest) : "";
    if (!mismatch.empty()) {  // fails the call; the connection stays
      if (receiver->second.refused.empty()) receiver->second.refused = mismatch;
      Notify();
      c.drain = true;
    } else if (receiver != expected.end()) {
      const std::string bad = Fits(receiver->second, q, key, h.kind, before + h.length,
                                   later ? 0 : h.bound, later);
      if (!bad.empty()) return refuse(bad);
    } else if (aborts.count({h.op_id, h.instance, h.group})) {
      c.drain = true;  // its call failed here: read and dropped
    } else {
      // Another rank's registration of the call tells where dst is.
      auto sibling = expected.lower_bound({h.op_id, h.instance, h.group, INT32_MIN});
      if (sibling != expected.end() && std::get<0>(sibling->first) == h.op_id &&
          std::get<1>(sibling->first) == h.instance && std::get<2>(sibling->first) == h.group) {
        const std::vector<int>& procs = sibling->second.procs;
        if (h.dst >= static_cast<int>(procs.size()) || procs[h.dst] != process) {
          return refuse(which() + "dst is not a rank of this process");
        }
      }
      auto next = instances.find({h.op_id, h.group, h.dst});
      auto skip = skipped.find({h.op_id, h.group, h.dst});
      if (skip != skipped.end() && h.instance >= skip->second.first &&
          h.instance < skip->second.second) {
        c.drain = true;  // for an instance this process skipped when it rejoined
      } else if (next != instances.end() && h.instance < next->second) {
        return refuse(which() + "instance ended here already");
      } else {
        c.pending = true;
      }
    }
    if (c.drain) {
      if (later) {
        Release(std::move(earlier->second.buffer));
        partial.erase(earlier);
      }
    } else if (later) {
      if (before + h.length > earlier->second.buffer.capacity) {
        return refuse(which() + "length " + std::to_string(h.length) + " takes the parts of the "
                      "piece beyond the bound its first part gave");
      }
      c.pending = earlier->second.pending;
      c.incoming = std::move(earlier->second.buffer);
      c.offset = before;
      c.bound = earlier->second.bound;
      partial.erase(earlier);
    } else {
      const uint64_t need = std::max(h.length, h.bound);
      if (c.pending && c.pending_bytes > 0 && c.pending_bytes + need > kPendingBytes) {
        c.parked = true;  // read on once a call takes the pending frames
        return false;
      }
      c.incoming = Allocate(need);
      c.bound = need;
      if (c.pending && c.incoming.data) c.pending_bytes += c.incoming.capacity;
    }
  }
  if (!c.drain && !c.incoming.data) {
    Lose(q, "out of memory for a frame of " + std::to_string(h.length) + " bytes");
    return false;
  }
  c.admitted = true;
  if (integrity_) StartMac(c.receive_mac, c.received_frames++, h);
  return true;
}

void Engine::Read(int q) {
  Conn& c = conns[q];
  for (size_t budget = 4 * kStripe;;) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (c.fd < 0 || !c.error.empty() || c.parked) return;
      if (c.header_got == kHead && !c.admitted && !Admit(q)) return;
    }
    const uint64_t length = c.header.length;
    if (c.admitted && c.payload_got == length && (!integrity_ || c.trailer_got == kMacBytes)) {
      Finish(q);
      continue;
    }
    // A frame whose last byte came with the budget's is admitted and finished above first: the
    // socket may hold nothing more, and poll would not call this again for it.
    if (budget == 0) return;
    char* into;
    size_t want;
    if (c.header_got < kHead) {
      into = reinterpret_cast<char*>(&c.header) + c.header_got;
      want = kHead - c.header_got;
    } else if (c.payload_got < length) {
      want = static_cast<size_t>(std::min<uint64_t>(length - c.payload_got, budget));
      if (c.drain) {
        into = drain_.get();
        want = std::min(want, kDrainBytes);
      } else {
        into = c.incoming.data.get() + c.offset + c.payload_got;
      }
    } else {
      into = reinterpret_cast<char*>(c.trailer) + c.trailer_got;
      want = kMacBytes - c.trailer_got;
    }
    int64_t stamp_ns;
    const ssize_t n = RecvStamped(c.fd, into, want, &stamp_ns);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n <= 0) {
      std::string why =
          n == 0 ? "process " + std::to_string(q) + " closed it" : "recv: " + Errno(errno);
      if (c.header_got > 0) {
        why += " in the middle of a frame (" + std::to_string(c.header_got) + " of " +
               std::to_string(kHead) + " header bytes" +
               (c.admitted ? ", " + std::to_string(c.payload_got) + " of " +
                                 std::to_string(length) + " payload bytes"
                           : "") +
               ")";
      }
      std::lock_guard<std::mutex> lock(mu);
      Lose(q, why);
      return;
    }
    budget -= std::min<size_t>(budget, static_cast<size_t>(n));
    c.last_ns = stamp_ns;
    c.heard_ns.store(SteadyNs(), std::memory_order_relaxed);
    if (c.header_got < kHead) {
      if (c.header_got == 0) c.first_ns = stamp_ns;
      c.header_got += static_cast<size_t>(n);
    } else if (c.payload_got < length) {
      if (integrity_) c.receive_mac.Update(into, static_cast<size_t>(n));
      c.payload_got += static_cast<uint64_t>(n);
    } else {
      c.trailer_got += static_cast<size_t>(n);
    }
  }
}

void Engine::Finish(int q) {
  Conn& c = conns[q];
  bool verified = true;
  if (integrity_) {
    uint8_t mac[kMacBytes];
    c.receive_mac.Final(mac);
    verified = DigestsEqual(mac, c.trailer, kMacBytes);
  }
  std::lock_guard<std::mutex> lock(mu);
  Record(q, kFrameReceived, c.header, c.first_ns, c.last_ns,
         kHead + c.header.length + (integrity_ ? kMacBytes : 0));
  if (verified) {
    Deliver(q);
  } else {
    Refuse(q, KeyOf(c.header),
           SentFrame(q, KeyOf(c.header)) + "MAC does not verify under the connection's key");
  }
  Reset(c);
}

void Engine::Deliver(int q) {
  Conn& c = conns[q];
  const WireHeader& h = c.header;
  if (c.drain) return;
  if (h.kind == kAbort) {
    const CallKey call{h.op_id, h.instance, h.group};
    std::string text(c.incoming.data.get(), h.length);
    for (char& ch : text) {
      if (ch < 0x20 || ch > 0x7e) ch = '?';  // the text is the peer's: printable only
    }
    aborts.emplace(call, "process " + std::to_string(q) + " aborted the call: " + text);
    while (aborts.size() > kAbortsKept) aborts.erase(aborts.begin());
    Notify();
    return;
  }
  const MsgKey key = KeyOf(h);
  Staged piece{std::move(c.incoming), c.offset + h.length, h.digest, q, c.pending, c.bound};
  auto receiver = expected.find(ReceiverOf(key));
  if (!piece.pending && receiver == expected.end()) {  // its call ended (failed) meanwhile
    Release(std::move(piece.buffer));
    return;
  }
  if (piece.pending && receiver != expected.end()) {  // its call started while it came
    c.pending_bytes -= std::min(c.pending_bytes, piece.buffer.capacity);
    piece.pending = false;
    const std::string mismatch = Mismatch(receiver->second, q, h.digest);
    const std::string bad =
        mismatch.empty() ? Fits(receiver->second, q, key, h.kind, piece.length, piece.bound, false)
                         : "";
    if (!mismatch.empty() || !bad.empty()) {
      Release(std::move(piece.buffer));
      if (!bad.empty()) Refuse(q, key, bad);
      if (!mismatch.empty() && receiver->second.refused.empty()) {
        receiver->second.refused = mismatch;
        Notify();
      }
      return;
    }
  }
  if (h.kind == kPart) {
    partial[key] = std::move(piece);
  } else {
    Stage(key, std::move(piece));
  }
  Notify();
}

void Engine::Stage(const MsgKey& key, Staged staged) {
  const bool pending = staged.pending;
  mailbox[key] = std::move(staged);
  if (pending) return;  // told once its call starts (Register)
  const ReceiverKey receiver = ReceiverOf(key);
  arrivals[receiver].push_back({key.step, key.src});
  auto registered = expected.find(receiver);
  if (registered != expected.end()) registered->second.received.insert({key.step, key.src});
}

void Engine::Write(int q) {
  Conn& c = conns[q];
  for (size_t budget = kStripe; budget > 0;) {
    SendItem* item;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (c.fd < 0 || !c.error.empty() || c.queue.empty()) return;
      item = c.queue.front().get();
      c.writing = true;
    }
    const uint64_t length = item->header.length;
    const uint64_t framed = kHead + length;  // header and payload
    const uint64_t total = framed + (integrity_ ? kMacBytes : 0);
    if (integrity_ && item->done == 0) StartMac(c.send_mac, c.sent_frames++, item->header);
    if (item->done == 0) item->first_ns = NowNs();
    iovec iov[2];
    int parts = 0;
    if (item->done < kHead) {
      iov[parts++] = {reinterpret_cast<char*>(&item->header) + item->done, kHead - item->done};
    }
    if (item->done < framed) {
      const uint64_t from = item->done > kHead ? item->done - kHead : 0;
      const uint64_t rest = std::min<uint64_t>(length - from, budget);
      if (rest > 0) iov[parts++] = {const_cast<char*>(item->payload) + from, rest};
    } else {
      iov[parts++] = {item->mac + (item->done - framed), total - item->done};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = parts;
    const ssize_t n = sendmsg(c.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    const int err = errno;
    if (integrity_ && n > 0) {  // the payload bytes this send wrote go into the MAC
      const uint64_t before = item->done, after = before + static_cast<uint64_t>(n);
      const uint64_t from = std::clamp(before, kHead, framed) - kHead;
      const uint64_t to = std::clamp(after, kHead, framed) - kHead;
      if (to > from) c.send_mac.Update(item->payload + from, to - from);
      if (before < framed && after >= framed) c.send_mac.Final(item->mac);
    }
    std::lock_guard<std::mutex> lock(mu);
    c.writing = false;
    if (detaching_ > 0) cv.notify_all();
    if (n < 0) {
      if (err != EAGAIN && err != EWOULDBLOCK && err != EINTR) Lose(q, "send: " + Errno(err));
      return;
    }
    item->done += static_cast<uint64_t>(n);
    if (n > 0) c.wrote_ns = SteadyNs();
    budget -= std::min<size_t>(budget, static_cast<size_t>(n));
    if (item->done == total) {
      Record(q, kFrameSent, item->header, item->first_ns, NowNs(), total);
      if (item->written) ++*item->written;
      c.queue.pop_front();
      Notify();
    }
  }
}

}  // namespace tcp

std::string TcpStart(int process, const std::vector<int>& fds,
                     const std::vector<std::string>& keys, bool integrity,
                     const std::string& unconnected) {
  std::lock_guard<std::mutex> lock(tcp::g_start_mu);
  if (tcp::Started()) return "the TCP transport is already started in this process";
  if (process < 0 || static_cast<size_t>(process) >= fds.size() || keys.size() != fds.size()) {
    return "process " + std::to_string(process) + " with " + std::to_string(fds.size()) +
           " sockets and " + std::to_string(keys.size()) + " keys: need one of each per process";
  }
  for (size_t q = 0; q < fds.size(); ++q) {
    if (static_cast<int>(q) == process ? fds[q] >= 0 : fds[q] < 0 && unconnected.empty()) {
      return "need one socket per other process (or a reason it has none), got " +
             std::to_string(fds[q]) + " for process " + std::to_string(q);
    }
    if (fds[q] >= 0 && fcntl(fds[q], F_SETFL, fcntl(fds[q], F_GETFL) | O_NONBLOCK) < 0) {
      return "fcntl(O_NONBLOCK) on the socket to process " + std::to_string(q) + ": " +
             tcp::Errno(errno);
    }
    if (fds[q] >= 0) tcp::StampReceives(fds[q]);
  }
  const int wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd < 0) return "eventfd: " + tcp::Errno(errno);
  // Lives as long as the process.
  tcp::Engine* engine = new tcp::Engine(process, fds, keys, integrity, wake_fd);
  {
    std::lock_guard<std::mutex> lock(engine->mu);
    for (size_t q = 0; q < fds.size(); ++q) {
      if (static_cast<int>(q) != process && fds[q] < 0) {
        engine->Lose(static_cast<int>(q), unconnected);
      }
    }
  }
  std::thread([engine] { engine->Run(); }).detach();
  tcp::g_engine.store(engine);
  return "";
}

std::string TcpRejoin(int q, int fd, const std::string& key) {
  tcp::Engine* e = tcp::Started();
  if (!e) return "the TCP transport is not started in this process";
  if (q < 0 || q == e->process || static_cast<size_t>(q) >= e->conns.size() || fd < 0) {
    return "cannot rejoin process " + std::to_string(q) + " with socket " + std::to_string(fd);
  }
  if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0) {
    return "fcntl(O_NONBLOCK) on the new socket to process " + std::to_string(q) + ": " +
           tcp::Errno(errno);
  }
  tcp::StampReceives(fd);
  std::unique_lock<std::mutex> lock(e->mu);
  const uint64_t ticket = e->Rejoin(q, fd, key);
  // Returns once the progress thread uses the new connection: later calls send on it.
  if (!e->cv.wait_for(lock, tcp::kRejoinWait, [&] { return e->rejoined >= ticket; })) {
    return "the progress thread did not take the new connection to process " +
           std::to_string(q) + " within " + std::to_string(tcp::kRejoinWait.count()) + " s";
  }
  return "";
}

std::string TcpLost(int q) {
  tcp::Engine* e = tcp::Started();
  if (!e) return "the TCP transport is not started in this process";
  if (q < 0 || static_cast<size_t>(q) >= e->conns.size()) {
    return "process " + std::to_string(q) + " is not one of the " +
           std::to_string(e->conns.size()) + " processes";
  }
  std::lock_guard<std::mutex> lock(e->mu);
  return e->conns[q].error;
}

uint64_t TcpRecords(uint64_t since, std::vector<FrameRecord>* out) {
  tcp::Engine* e = tcp::Started();
  out->clear();
  if (!e) return 0;
  std::lock_guard<std::mutex> lock(e->mu);
  const uint64_t total = e->records_total;
  const uint64_t kept = e->records.size();
  for (uint64_t i = std::max(since, total - kept); i < total; ++i) {
    out->push_back(e->records[i % tcp::kRecordsKept]);
  }
  return total;
}

void TcpUnpace() {
  tcp::Engine* e = tcp::Started();
  if (!e) return;
  std::lock_guard<std::mutex> lock(e->mu);
  for (size_t q = 0; q < e->conns.size(); ++q) e->SetPacing(static_cast<int>(q), tcp::kUnpaced);
}

int TcpProcess() {
  tcp::Engine* e = tcp::Started();
  return e ? e->process : -1;
}

}  // namespace jaxcc
