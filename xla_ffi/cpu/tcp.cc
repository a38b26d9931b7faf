// Tcp transport (tcp.h): one call's pieces, posted to and taken from the
// engine (tcp_engine.h).
#include "tcp.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tcp_engine.h"

namespace jaxcc {

using tcp::CallKey;
using tcp::Conn;
using tcp::kData;
using tcp::kMagic;
using tcp::kPart;
using tcp::kUnpaced;
using tcp::MsgKey;
using tcp::SameReceiver;
using tcp::SendItem;
using tcp::Staged;
using tcp::Staging;

std::string TcpTransport::Create(int64_t op_id, int64_t group, int p, int rank,
                                 const int64_t* procs, const int64_t* pacing, int64_t digest,
                                 TcpReceives receives, std::unique_ptr<TcpTransport>* out) {
  tcp::Engine* e = tcp::Started();
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
  if (procs[rank] != e->process) {
    return "rank " + std::to_string(rank) + " is on process " + std::to_string(procs[rank]) +
           ", not on this one (" + std::to_string(e->process) + ")";
  }
  // The pacing of each connection: the sum over the rank pairs it carries.
  std::vector<uint64_t> rate(nproc, 0);
  for (int src = 0; pacing && src < p; ++src) {
    for (int dst = 0; dst < p; ++dst) {
      if (procs[src] == e->process && procs[dst] != e->process) {
        rate[procs[dst]] += static_cast<uint64_t>(std::max<int64_t>(pacing[src * p + dst], 0));
      }
    }
  }
  std::vector<int> ranks_procs(procs, procs + p);
  std::lock_guard<std::mutex> lock(e->mu);
  const Call call{op_id, e->instances[{op_id, group, rank}]++, group};
  out->reset(new TcpTransport(e, call, rank, ranks_procs, digest));
  for (int r = 0; r < p; ++r) {
    const int q = static_cast<int>(procs[r]);
    if (q != e->process) e->SetPacing(q, rate[q] > 0 ? rate[q] : kUnpaced);
  }
  return e->Register({op_id, call.instance, group, rank},
                     tcp::Expected{std::move(ranks_procs), digest, std::move(receives), {}, {}});
}

TcpTransport::TcpTransport(tcp::Engine* engine, const Call& call, int rank, std::vector<int> procs,
                           int64_t digest)
    : e_(engine), call_(call), rank_(rank), procs_(std::move(procs)), digest_(digest),
      written_(procs_.size(), 0) {}

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
  e_->expected.erase({call_.op_id, call_.instance, call_.group, rank_});
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
  const tcp::ReceiverKey me{call_.op_id, call_.instance, call_.group, rank_};
  auto registered = e_->expected.find(me);
  if (registered != e_->expected.end() && !registered->second.refused.empty()) {
    return registered->second.refused;
  }
  auto mine = e_->arrivals.find(me);
  if (mine != e_->arrivals.end()) {
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

std::chrono::nanoseconds TcpTransport::Silent(int rank,
                                              std::chrono::steady_clock::time_point since) {
  const int q = procs_[rank];
  if (q == e_->process) return std::chrono::nanoseconds(0);
  std::lock_guard<std::mutex> lock(e_->mu);
  return std::chrono::nanoseconds(e_->SilentNs(
      q, std::chrono::duration_cast<std::chrono::nanoseconds>(since.time_since_epoch()).count()));
}

void TcpTransport::Drop(int rank, const std::string& why) {
  std::lock_guard<std::mutex> lock(e_->mu);
  const int q = procs_[rank];
  if (q != e_->process) e_->Lose(q, why);
}

std::string TcpTransport::Stray(int rank) {
  std::lock_guard<std::mutex> lock(e_->mu);
  const int q = procs_[rank];
  return q == e_->process ? "" : e_->Stray(q);
}

namespace {

std::atomic<uint64_t> g_blocked_ns{0};

// The engine and q, or why q is no other process of it.
std::string OtherProcess(int q, tcp::Engine** e) {
  *e = tcp::Started();
  if (!*e) return "the TCP transport is not started in this process";
  if (q < 0 || q == (*e)->process || static_cast<size_t>(q) >= (*e)->conns.size()) {
    return "process " + std::to_string(q) + " is not another of the " +
           std::to_string((*e)->conns.size()) + " processes";
  }
  return "";
}

}  // namespace

double TcpLostAt(int q) {
  tcp::Engine* e;
  if (!OtherProcess(q, &e).empty()) return 0;
  std::lock_guard<std::mutex> lock(e->mu);
  return e->conns[q].lost_at;
}

double TcpSilentS(int q) {
  tcp::Engine* e;
  if (!OtherProcess(q, &e).empty()) return 0;
  std::lock_guard<std::mutex> lock(e->mu);
  return e->conns[q].error.empty() ? e->SilentNs(q, 0) * 1e-9 : 0;
}

TcpInstanceCounts TcpInstances() {
  TcpInstanceCounts out;
  tcp::Engine* e = tcp::Started();
  if (!e) return out;
  std::lock_guard<std::mutex> lock(e->mu);
  for (const auto& [key, next] : e->instances) {
    out.emplace_back(std::get<0>(key), std::get<1>(key), std::get<2>(key), next);
  }
  return out;
}

std::string TcpSetInstances(const TcpInstanceCounts& counts) {
  tcp::Engine* e = tcp::Started();
  if (!e) return "the TCP transport is not started in this process";
  std::lock_guard<std::mutex> lock(e->mu);
  for (const auto& [op_id, group, rank, next] : counts) {
    if (op_id <= 0 || next < 0) {
      return "instance count " + std::to_string(next) + " of op " + std::to_string(op_id) +
             " is not one a call site has";
    }
    int64_t& count = e->instances[{op_id, group, rank}];
    if (next > count) e->skipped[{op_id, group, rank}] = {count, next};
    count = next;
  }
  return "";
}

std::string TcpSendBytes(int q, int64_t tag, const std::string& data) {
  tcp::Engine* e;
  std::string err = OtherProcess(q, &e);
  if (!err.empty()) return err;
  std::lock_guard<std::mutex> lock(e->mu);
  Conn& c = e->conns[q];
  if (!c.error.empty()) return "cannot send to process " + std::to_string(q) + ": " + c.error;
  auto item = std::make_unique<SendItem>();
  item->header = {kMagic, kData, tcp::kHostOp, tag, 0, 0, e->process, q, 0, data.size(), 0};
  item->owned.reset(new char[std::max<size_t>(data.size(), 1)]);
  std::memcpy(item->owned.get(), data.data(), data.size());
  item->payload = item->owned.get();
  c.queue.push_back(std::move(item));
  e->Wake();
  return "";
}

std::string TcpRecvBytes(int q, int64_t tag, uint64_t max_bytes,
                         std::chrono::milliseconds timeout, std::string* out) {
  tcp::Engine* e;
  std::string err = OtherProcess(q, &e);
  if (!err.empty()) return err;
  const int nproc = static_cast<int>(e->conns.size());
  std::vector<int> procs(nproc);
  for (int r = 0; r < nproc; ++r) procs[r] = r;  // host messages name processes as ranks
  TcpReceives receives;
  receives.encoded = true;  // any length up to max_bytes
  receives.bytes[{0, q}] = max_bytes;
  const tcp::ReceiverKey me{tcp::kHostOp, tag, 0, e->process};
  const MsgKey key{tcp::kHostOp, tag, 0, e->process, 0, q};
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::unique_lock<std::mutex> lock(e->mu);
  err = e->Register(me, tcp::Expected{procs, 0, std::move(receives), {}, {}});
  const std::string from = "process " + std::to_string(q) + "'s message " + std::to_string(tag);
  while (err.empty()) {
    auto it = e->mailbox.find(key);
    if (it != e->mailbox.end()) {
      out->assign(it->second.buffer.data.get(), it->second.length);
      e->Release(std::move(it->second.buffer));
      e->mailbox.erase(it);
      break;
    }
    const tcp::Expected& expected = e->expected[me];
    if (!expected.refused.empty()) {
      err = expected.refused;
    } else if (!e->conns[q].error.empty()) {
      err = "no " + from + ": " + e->conns[q].error;
    } else if (e->cv.wait_until(lock, deadline) == std::cv_status::timeout &&
               !e->mailbox.count(key)) {
      err = "timed out after " + std::to_string(timeout.count()) + " ms waiting for " + from;
    }
  }
  e->expected.erase(me);
  e->arrivals.erase(me);
  return err;
}

std::string TcpFlush(std::chrono::milliseconds timeout) {
  tcp::Engine* e = tcp::Started();
  if (!e) return "";
  std::unique_lock<std::mutex> lock(e->mu);
  int busy = -1;
  auto drained = [&] {
    for (size_t q = 0; q < e->conns.size(); ++q) {
      const Conn& c = e->conns[q];
      if (c.error.empty() && !c.queue.empty()) {
        busy = static_cast<int>(q);
        return false;
      }
    }
    return true;
  };
  if (e->cv.wait_for(lock, timeout, drained)) return "";
  return "timed out after " + std::to_string(timeout.count()) + " ms with " +
         std::to_string(e->conns[busy].queue.size()) + " frames queued for process " +
         std::to_string(busy);
}

std::chrono::nanoseconds TcpStuckPatience(int64_t op_id, int64_t group, int rank,
                                          std::chrono::steady_clock::time_point start) {
  static std::mutex mu;
  static std::map<std::tuple<int64_t, int64_t, int>, std::chrono::steady_clock::time_point> last;
  std::lock_guard<std::mutex> lock(mu);
  auto [it, first] = last.try_emplace({op_id, group, rank}, start);
  if (first) return std::chrono::nanoseconds(0);
  const auto period = start - it->second;
  it->second = start;
  return std::max<std::chrono::nanoseconds>(kMinPatience, period / 2);
}

void TcpAddBlocked(std::chrono::steady_clock::duration d) {
  g_blocked_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
}

uint64_t TcpBlockedNs() { return g_blocked_ns.load(); }

}  // namespace jaxcc
