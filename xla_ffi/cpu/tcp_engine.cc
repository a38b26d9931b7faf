// The Tcp transport's engine (tcp_engine.h) and TcpStart (tcp.h).
#include "tcp_engine.h"

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

std::string Errno(int err) { return std::strerror(err); }

std::mutex g_start_mu;
std::atomic<Engine*> g_engine{nullptr};

}  // namespace

Engine* Started() { return g_engine.load(); }

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
  if (c.fd >= 0) close(c.fd);
  c.fd = -1;
  c.queue.clear();
  Notify();
}

void Engine::PostAbort(int q, const CallKey& call, int src, const std::string& text) {
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

void Engine::Run() {
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

void Engine::Read(int q) {
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

void Engine::Deliver(int q) {
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

void Engine::Stage(const MsgKey& key, Staged staged) {
  Staged& slot = mailbox[key];
  Release(std::move(slot.buffer));  // a duplicate replaces the first (the runner fails on it)
  slot = std::move(staged);
  arrivals[{key.op_id, key.instance, key.group, key.dst}].push_back({key.step, key.src});
}

void Engine::Write(int q) {
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

}  // namespace tcp

std::string TcpStart(int process, const std::vector<int>& fds) {
  std::lock_guard<std::mutex> lock(tcp::g_start_mu);
  if (tcp::Started()) return "the TCP transport is already started in this process";
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
             tcp::Errno(errno);
    }
  }
  const int wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd < 0) return "eventfd: " + tcp::Errno(errno);
  tcp::Engine* engine = new tcp::Engine(process, fds, wake_fd);  // lives as long as the process
  std::thread([engine] { engine->Run(); }).detach();
  tcp::g_engine.store(engine);
  return "";
}

int TcpProcess() {
  tcp::Engine* e = tcp::Started();
  return e ? e->process : -1;
}

}  // namespace jaxcc
