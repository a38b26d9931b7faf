// jaxcc_local_collective on the CPU: all_reduce, reduce_scatter, all_gather,
// broadcast and ppermute among ranks that all live in this process.
//
// The ranks' calls run concurrently (XLA:CPU runs each device's program on
// its own thread) and meet once, in a rendezvous keyed like the InProcess
// transport's (run id, op id, group, instance: inprocess.h). Each publishes
// its input and output pointers; then every rank computes its own part from
// its peers' buffers directly, with no step-by-step schedule:
//   all_reduce      rank r reduces shard r of every input (shard bounds
//                   floor(j L / p)) and writes it into every rank's output;
//   reduce_scatter  rank r reduces block r of every input into its output;
//   all_gather      rank r copies every rank's input into its output;
//   broadcast       rank r copies the root's input into its output;
//   ppermute        rank r copies its source's input, or writes zeros.
// A completion barrier follows, so no buffer is released while a peer still
// reads or writes it. Sums use jaxcc_reduce's kernel in the order of the
// direct schedule (the owner's own value, then ranks r-1, r-2, ... mod p),
// so they equal the XLA executor's direct all-reduce bit for bit; max and
// min fold in rank order (0, 1, ...), which is what lax.pmax / lax.pmin do.
//
// Operands: the program-order token, x, this rank and its group (int32
// scalars). Attributes: `collective` (kCollectiveNames' index), `nranks`,
// `op_id`, `op` (jaxcc/reduce.h ReduceOp), `outer` (reduce_scatter and
// all_gather: x or y is [outer, p, block]; the other [outer, block]), `root`
// (broadcast), `sources` (ppermute: the rank each rank receives from, -1:
// none; empty otherwise) and `timeout_ms` (every wait's limit). 16-bit floats
// come as they are: XLA moves no data into or out of a custom call, so their
// bits (NaN payloads, subnormals) reach the copies unchanged.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "inprocess.h"
#include "jaxcc/reduce.h"
#include "reduce_host.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jaxcc {
namespace {

enum Collective : int64_t {
  kAllReduce = 0,
  kReduceScatter = 1,
  kAllGather = 2,
  kBroadcast = 3,
  kPpermute = 4,
};
constexpr const char* kCollectiveNames[] = {"all_reduce", "reduce_scatter", "all_gather",
                                            "broadcast", "ppermute"};

// Bytes reduced (or copied) per kernel call: a chunk stays in L2 while it is
// written to the p outputs.
constexpr size_t kChunkBytes = size_t{64} << 10;
// How long a wait spins (yielding the core) before it sleeps.
constexpr auto kSpin = std::chrono::microseconds(50);

// What every rank of one call must agree on.
struct Signature {
  int64_t collective, nranks, op, dtype, in_elems, out_elems, outer, root;
  std::vector<int64_t> sources;

  bool operator==(const Signature& o) const {
    return collective == o.collective && nranks == o.nranks && op == o.op && dtype == o.dtype &&
           in_elems == o.in_elems && out_elems == o.out_elems &&
           outer == o.outer && root == o.root && sources == o.sources;
  }
  std::string Describe() const {
    return std::string(kCollectiveNames[collective]) + " of " + std::to_string(nranks) +
           " ranks, " + std::to_string(in_elems) + " -> " + std::to_string(out_elems) +
           " elements of " + DataTypeName(static_cast<ffi::DataType>(dtype)) + " (op " +
           std::to_string(op) + ", outer " + std::to_string(outer) + ", root " +
           std::to_string(root) + ")";
  }
};

// The rendezvous of one call. `arrived` and `finished` change under `mu`
// (waiters may also spin on them); a failure is set only while not every
// rank has arrived, and no rank arrives after a failure, so either all ranks
// go on to their work or none does.
struct Meeting {
  Meeting(int p, Signature s) : sig(std::move(s)), in(p), out(p), stage(p, 0) {}
  const Signature sig;
  std::vector<const char*> in;
  std::vector<char*> out;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> stage;  // per rank: 0 absent, 1 arrived, 2 finished
  std::atomic<int> arrived{0}, finished{0}, left{0};
  std::atomic<bool> failed{false};
  int sleepers = 0;
  std::string failure;
};

std::mutex g_mu;
std::map<InProcessTransport::Key, std::shared_ptr<Meeting>> g_meetings;

// Sets the call's failure, unless one is set already; m.mu is held.
void FailLocked(Meeting& m, const std::string& error) {
  if (m.failure.empty()) m.failure = error;
  m.failed.store(true);
  m.cv.notify_all();
}

// Moves `rank` to `stage` (1: arrived, its buffers published; 2: finished).
// Arriving after a failure is refused with the failure.
std::string Advance(Meeting& m, int rank, int stage) {
  std::lock_guard<std::mutex> lock(m.mu);
  if (stage == 1 && !m.failure.empty()) return m.failure;
  m.stage[rank] = stage;
  (stage == 1 ? m.arrived : m.finished).fetch_add(1, std::memory_order_release);
  if (m.sleepers) m.cv.notify_all();
  return "";
}

// Waits until every rank reached `stage` (its counter is p): spins for kSpin,
// then sleeps until the deadline. Waiting for arrivals ends early on a
// failure; waiting for the others to finish does not (they may be using this
// rank's buffers). On timeout the call fails, naming the ranks still short
// of `stage`.
std::string WaitAll(Meeting& m, int stage, int rank, std::chrono::milliseconds timeout,
                    const std::string& what) {
  const int p = static_cast<int>(m.sig.nranks);
  const std::atomic<int>& counter = stage == 1 ? m.arrived : m.finished;
  const auto start = std::chrono::steady_clock::now();
  do {
    if (counter.load(std::memory_order_acquire) >= p) return "";
    if (stage == 1 && m.failed.load()) break;
    std::this_thread::yield();
  } while (std::chrono::steady_clock::now() - start < kSpin);
  const auto deadline = start + timeout;
  std::unique_lock<std::mutex> lock(m.mu);
  ++m.sleepers;
  while (counter.load() < p && (stage == 2 || m.failure.empty())) {
    if (m.cv.wait_until(lock, deadline) == std::cv_status::timeout && counter.load() < p) {
      std::string missing;
      for (int q = 0; q < p; ++q) {
        if (m.stage[q] < stage) missing += (missing.empty() ? "" : ", ") + std::to_string(q);
      }
      FailLocked(m, what + ": rank " + std::to_string(rank) + " timed out after " +
                        std::to_string(timeout.count()) + " ms waiting for rank " + missing +
                        (stage == 1 ? " (never arrived)" : " to finish") +
                        "; JAXCC_TIMEOUT_S sets the limit");
      break;
    }
  }
  --m.sleepers;
  return counter.load() >= p ? "" : m.failure;
}

// Joins (or opens) the meeting of `key`. A rank whose call differs from the
// first rank's fails the call for everyone.
std::shared_ptr<Meeting> Join(const InProcessTransport::Key& key, const Signature& sig, int rank,
                              const std::string& what, std::string* err) {
  std::shared_ptr<Meeting> m;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    std::shared_ptr<Meeting>& slot = g_meetings[key];
    if (!slot) slot = std::make_shared<Meeting>(static_cast<int>(sig.nranks), sig);
    m = slot;
  }
  if (!(m->sig == sig)) {
    *err = what + ": rank " + std::to_string(rank) + " called " + sig.Describe() +
           " but its peers called " + m->sig.Describe() +
           "; every rank must make the same call";
    std::lock_guard<std::mutex> lock(m->mu);
    FailLocked(*m, *err);
  }
  return m;
}

// Leaves the meeting; the last rank out removes it from the table.
void Leave(const InProcessTransport::Key& key, Meeting& m) {
  if (m.left.fetch_add(1) + 1 == m.sig.nranks) {
    std::lock_guard<std::mutex> lock(g_mu);
    g_meetings.erase(key);
  }
}

// Rank r's part of the collective, reading and writing the published buffers.
ffi::Error Work(const Meeting& m, int r) {
  const Signature& s = m.sig;
  const int p = static_cast<int>(s.nranks);
  const ffi::DataType dtype = static_cast<ffi::DataType>(s.dtype);
  const size_t w = ffi::ByteWidth(dtype);
  const ReduceOp op = static_cast<ReduceOp>(s.op);
  // The reduction order: the owner first, then r-1, r-2, ... (sum); 0, 1, ... (max, min).
  std::vector<int> order(p);
  for (int j = 0; j < p; ++j) order[j] = op == ReduceOp::kSum ? ((r - j) % p + p) % p : j;
  std::vector<const void*> inputs(p);
  auto reduce = [&](size_t in_offset, char* dst, size_t n) {
    for (int j = 0; j < p; ++j) inputs[j] = m.in[order[j]] + in_offset * w;
    return ReduceOnHost(dtype, inputs.data(), p, dst, n, op);
  };
  const size_t chunk = std::max<size_t>(1, kChunkBytes / w);
  switch (s.collective) {
    case kAllReduce: {
      const size_t length = static_cast<size_t>(s.in_elems);
      const size_t lo = length * r / p, hi = length * (r + 1) / p;
      for (size_t base = lo; base < hi; base += chunk) {
        const size_t n = std::min(chunk, hi - base);
        char* mine = m.out[r] + base * w;
        ffi::Error err = reduce(base, mine, n);
        if (err.failure()) return err;
        for (int q = 0; q < p; ++q) {
          if (q != r) std::memcpy(m.out[q] + base * w, mine, n * w);
        }
      }
      return ffi::Error::Success();
    }
    case kReduceScatter: {
      const size_t outer = static_cast<size_t>(s.outer);
      const size_t block = static_cast<size_t>(s.out_elems) / outer;
      for (size_t i = 0; i < outer; ++i) {
        for (size_t base = 0; base < block; base += chunk) {
          const size_t n = std::min(chunk, block - base);
          ffi::Error err = reduce((i * p + r) * block + base, m.out[r] + (i * block + base) * w, n);
          if (err.failure()) return err;
        }
      }
      return ffi::Error::Success();
    }
    case kAllGather: {
      const size_t outer = static_cast<size_t>(s.outer);
      const size_t bytes = static_cast<size_t>(s.in_elems) / outer * w;
      for (size_t i = 0; i < outer; ++i) {
        for (int q = 0; q < p; ++q) {
          std::memcpy(m.out[r] + (i * p + q) * bytes, m.in[q] + i * bytes, bytes);
        }
      }
      return ffi::Error::Success();
    }
    case kBroadcast:
      std::memcpy(m.out[r], m.in[s.root], static_cast<size_t>(s.out_elems) * w);
      return ffi::Error::Success();
    default: {  // kPpermute
      const int64_t src = s.sources[r];
      const size_t bytes = static_cast<size_t>(s.out_elems) * w;
      if (src < 0) {
        std::memset(m.out[r], 0, bytes);
      } else {
        std::memcpy(m.out[r], m.in[src], bytes);
      }
      return ffi::Error::Success();
    }
  }
}

// Checks the attributes against the operand and result sizes; "" if they fit.
std::string CheckCall(const Signature& s, int rank) {
  const int64_t p = s.nranks;
  if (s.collective < 0 || s.collective > kPpermute) {
    return "unknown collective " + std::to_string(s.collective);
  }
  if (p < 1) return "nranks must be >= 1, got " + std::to_string(p);
  if (rank < 0 || rank >= p) {
    return "rank " + std::to_string(rank) + " is not in [0, " + std::to_string(p) + ")";
  }
  if (s.op < 0 || s.op > static_cast<int64_t>(ReduceOp::kMin)) {
    return "unknown reduction op " + std::to_string(s.op) + " (0: sum, 1: max, 2: min)";
  }
  const int64_t outer = s.outer;
  switch (s.collective) {
    case kReduceScatter:
      if (outer < 1 || s.out_elems % outer || s.in_elems != s.out_elems * p) {
        return "reduce_scatter takes [outer, p, block] to [outer, block]; got " +
               std::to_string(s.in_elems) + " -> " + std::to_string(s.out_elems) +
               " elements with outer " + std::to_string(outer);
      }
      break;
    case kAllGather:
      if (outer < 1 || s.in_elems % outer || s.out_elems != s.in_elems * p) {
        return "all_gather takes [outer, block] to [outer, p, block]; got " +
               std::to_string(s.in_elems) + " -> " + std::to_string(s.out_elems) +
               " elements with outer " + std::to_string(outer);
      }
      break;
    default:
      if (s.in_elems != s.out_elems) {
        return "the result must have the operand's size, got " + std::to_string(s.in_elems) +
               " -> " + std::to_string(s.out_elems) + " elements";
      }
  }
  if (s.collective == kBroadcast && (s.root < 0 || s.root >= p)) {
    return "root " + std::to_string(s.root) + " is not in [0, " + std::to_string(p) + ")";
  }
  if (s.collective == kPpermute) {
    if (static_cast<int64_t>(s.sources.size()) != p) {
      return "sources must name one rank (or -1) per rank, got " +
             std::to_string(s.sources.size());
    }
    for (int64_t src : s.sources) {
      if (src < -1 || src >= p) return "source " + std::to_string(src) + " is not a rank";
    }
  }
  return "";
}

ffi::Error LocalCollectiveImpl(ffi::RunId run_id, ffi::Token, ffi::AnyBuffer x,
                               ffi::Buffer<ffi::S32> rank_buf, ffi::Buffer<ffi::S32> group_buf,
                               ffi::Result<ffi::Token>, ffi::Result<ffi::AnyBuffer> y,
                               int64_t collective, int64_t nranks, int64_t op_id, int64_t op,
                               int64_t outer, int64_t root,
                               ffi::Span<const int64_t> sources, int64_t timeout_ms) {
  const std::string name =
      collective >= 0 && collective <= kPpermute ? kCollectiveNames[collective] : "collective";
  const std::string what = "jaxcc." + name + " (in-process, op " + std::to_string(op_id) + ")";
  const int rank = rank_buf.typed_data()[0];
  const int64_t group = group_buf.typed_data()[0];
  if (y->element_type() != x.element_type()) {
    return ffi::Error::InvalidArgument(what + ": the result must have the operand's dtype");
  }
  Signature sig{collective,
                nranks,
                op,
                static_cast<int64_t>(x.element_type()),
                static_cast<int64_t>(x.element_count()),
                static_cast<int64_t>(y->element_count()),
                outer,
                root,
                std::vector<int64_t>(sources.begin(), sources.end())};
  std::string err = CheckCall(sig, rank);
  if (err.empty() && timeout_ms <= 0) err = "timeout_ms must be > 0";
  if (!err.empty()) return ffi::Error::InvalidArgument(what + ", rank " + std::to_string(rank) +
                                                       ": " + err);
  const std::chrono::milliseconds timeout(timeout_ms);

  const InProcessTransport::Key key{
      run_id.run_id, op_id, group,
      InProcessTransport::NextInstance(run_id.run_id, op_id, group, rank)};
  std::shared_ptr<Meeting> m = Join(key, sig, rank, what, &err);
  if (err.empty()) {
    m->in[rank] = static_cast<const char*>(x.untyped_data());
    m->out[rank] = static_cast<char*>(y->untyped_data());
    err = Advance(*m, rank, 1);
  }
  if (err.empty()) err = WaitAll(*m, 1, rank, timeout, what);
  if (err.empty()) {
    ffi::Error work = Work(*m, rank);
    if (work.failure()) err = what + ", rank " + std::to_string(rank) + ": " + work.message();
    Advance(*m, rank, 2);
    const std::string done = WaitAll(*m, 2, rank, timeout, what);
    if (err.empty()) err = done;
  }
  Leave(key, *m);
  if (!err.empty()) return ffi::Error::Internal(err);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxcc

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxccLocalCollective, jaxcc::LocalCollectiveImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::RunId>()
                                  .Arg<ffi::Token>()                 // program order in
                                  .Arg<ffi::AnyBuffer>()             // x: this rank's operand
                                  .Arg<ffi::Buffer<ffi::S32>>()      // rank along the axis
                                  .Arg<ffi::Buffer<ffi::S32>>()      // group: which axis instance
                                  .Ret<ffi::Token>()                 // program order out
                                  .Ret<ffi::AnyBuffer>()             // y: the result
                                  .Attr<int64_t>("collective")       // kCollectiveNames' index
                                  .Attr<int64_t>("nranks")
                                  .Attr<int64_t>("op_id")
                                  .Attr<int64_t>("op")               // ReduceOp
                                  .Attr<int64_t>("outer")
                                  .Attr<int64_t>("root")
                                  .Attr<ffi::Span<const int64_t>>("sources")
                                  .Attr<int64_t>("timeout_ms"));
