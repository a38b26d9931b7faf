// InProcess transport: see inprocess.h.
#include "inprocess.h"

#include <map>
#include <tuple>
#include <utility>

namespace jaxcc {

struct Rendezvous {
  std::mutex mu;
  std::condition_variable cv;
  int p = 0;
  int64_t digest = 0;
  std::vector<char*> base;          // each rank's buffer
  std::vector<int64_t> published;   // last step whose pre-step state a rank published
  std::vector<int64_t> consumed;    // last step whose receives a rank finished
  int joined = 0;
  int left = 0;
  std::string failure;
};

namespace {

std::mutex g_mu;
std::map<InProcessTransport::Key, std::shared_ptr<Rendezvous>> g_table;
// Instance counters per run id; past kRunsKept run ids the least recently used
// is dropped (run ids need not increase, so the smallest may still be running).
constexpr size_t kRunsKept = 64;
struct RunCounters {
  uint64_t last_use = 0;
  std::map<std::tuple<int64_t, int64_t, int>, int64_t> next;
};
std::map<int64_t, RunCounters> g_instances;
uint64_t g_clock = 0;

}  // namespace

bool InProcessTransport::Key::operator<(const Key& o) const {
  return std::tie(run_id, op_id, group, instance) <
         std::tie(o.run_id, o.op_id, o.group, o.instance);
}

int64_t InProcessTransport::NextInstance(int64_t run_id, int64_t op_id, int64_t group,
                                         int rank) {
  std::lock_guard<std::mutex> lock(g_mu);
  RunCounters& run = g_instances[run_id];
  run.last_use = ++g_clock;
  const int64_t instance = run.next[{op_id, group, rank}]++;
  if (g_instances.size() > kRunsKept) {
    auto oldest = g_instances.begin();
    for (auto it = g_instances.begin(); it != g_instances.end(); ++it) {
      if (it->second.last_use < oldest->second.last_use) oldest = it;
    }
    g_instances.erase(oldest);
  }
  return instance;
}

std::string InProcessTransport::Join(const Key& key, int p, int rank, char* buf, int64_t digest,
                                     std::chrono::milliseconds timeout, const std::string& what,
                                     std::unique_ptr<InProcessTransport>* out) {
  std::shared_ptr<Rendezvous> r;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    std::shared_ptr<Rendezvous>& slot = g_table[key];
    if (!slot) {
      slot = std::make_shared<Rendezvous>();
      slot->p = p;
      slot->digest = digest;
      slot->base.assign(p, nullptr);
      slot->published.assign(p, -1);
      slot->consumed.assign(p, -1);
    }
    r = slot;
  }
  out->reset(new InProcessTransport(key, r, rank, timeout, what));
  std::lock_guard<std::mutex> lock(r->mu);
  ++r->joined;
  if (r->p != p || r->digest != digest) {
    std::string err = what + ": rank " + std::to_string(rank) +
                      " planned a different schedule than its peers (axis size or topology "
                      "differ between ranks); every rank must pass the same arguments";
    if (r->failure.empty()) r->failure = err;
    r->cv.notify_all();
    return err;
  }
  r->base[rank] = buf;
  return r->failure;
}

InProcessTransport::InProcessTransport(Key key, std::shared_ptr<Rendezvous> r, int rank,
                                       std::chrono::milliseconds timeout, std::string what)
    : key_(key), r_(std::move(r)), rank_(rank), timeout_(timeout), what_(std::move(what)) {}

InProcessTransport::~InProcessTransport() {
  std::lock_guard<std::mutex> table_lock(g_mu);
  std::lock_guard<std::mutex> lock(r_->mu);
  if (++r_->left == r_->p) g_table.erase(key_);
}

void InProcessTransport::Fail(const std::string& error) {
  std::lock_guard<std::mutex> lock(r_->mu);
  if (r_->failure.empty()) r_->failure = "rank " + std::to_string(rank_) + " failed: " + error;
  r_->cv.notify_all();
}

template <typename Ready>
std::string InProcessTransport::Wait(std::unique_lock<std::mutex>& lock, Ready ready, int peer,
                                     int64_t step, const char* doing) {
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (!ready()) {
    if (!r_->failure.empty()) return r_->failure;
    if (r_->cv.wait_until(lock, deadline) == std::cv_status::timeout && !ready()) {
      std::string err = what_ + ": rank " + std::to_string(rank_) + " timed out after " +
                        TimeoutText(timeout_) + " at step " + std::to_string(step) +
                        " waiting for rank " + std::to_string(peer) + " to " + doing;
      std::string absent;  // the root cause when some rank never arrived
      for (int q = 0; q < r_->p; ++q) {
        if (r_->base[q] == nullptr) absent += (absent.empty() ? " " : ", ") + std::to_string(q);
      }
      if (!absent.empty()) err += "; never joined: rank" + absent;
      err += " (JAXCC_TIMEOUT_S sets the limit)";
      r_->failure = err;
      r_->cv.notify_all();
      return err;
    }
  }
  return "";
}

std::string InProcessTransport::Publish(int64_t step, const RankStep&) {
  std::lock_guard<std::mutex> lock(r_->mu);
  r_->published[rank_] = step;
  r_->cv.notify_all();
  return r_->failure;
}

std::string InProcessTransport::Receive(int64_t step, const Piece& piece, size_t itemsize,
                                        const char** view) {
  std::unique_lock<std::mutex> lock(r_->mu);
  const int src = piece.peer;
  std::string err = Wait(lock, [&] { return r_->published[src] >= step; }, src, step,
                         "reach this step");
  if (!err.empty()) return err;
  *view = r_->base[src] + piece.src_start * itemsize;
  return "";
}

std::string InProcessTransport::ReceivesDone(int64_t step) {
  std::lock_guard<std::mutex> lock(r_->mu);
  r_->consumed[rank_] = step;
  r_->cv.notify_all();
  return r_->failure;
}

std::string InProcessTransport::SendsDone(int64_t step, const RankStep& plan) {
  std::unique_lock<std::mutex> lock(r_->mu);
  for (const Piece& out : plan.sends) {
    std::string err = Wait(lock, [&] { return r_->consumed[out.peer] >= step; }, out.peer, step,
                           "take the pieces sent to it");
    if (!err.empty()) return err;
  }
  return "";
}

}  // namespace jaxcc
