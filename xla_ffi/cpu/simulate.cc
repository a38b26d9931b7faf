// jaxcc/sim/simulate.py in C++ (simulate.h): _hops, _dependencies and _run
// over flat arrays.
#include "simulate.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "jaxcc/schedule.h"

namespace jaxcc {
namespace {

using Index = int32_t;  // of a transfer, unit, segment, port, edge or event
constexpr int64_t kMaxIndex = std::numeric_limits<Index>::max();
// A transfer's hops: to its relay, across clusters (or its only hop), from the relay.
constexpr int kHops = 3;
// From this many transfers on, two threads share the work before the event loop.
constexpr int64_t kParallelRows = 1 << 14;

// A std::vector whose resize leaves trivial values uninitialised, for large
// arrays whose every value is written before it is read.
template <typename T>
struct NoInit : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = NoInit<U>;
  };
  template <typename U>
  void construct(U* p) {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
template <typename T>
using Array = std::vector<T, NoInit<T>>;

// simulate.py's _hops, a transfer at a time. Ports 0..p-1 are the ranks'
// intra (or only) ports, p..2p-1 their cross-cluster ports; a hop holds its
// tx port for the message cost plus size / send bandwidth and its rx port for
// the message cost plus size / receive bandwidth, and its delay is the larger
// latency of the two ports.
class Hops {
 public:
  Hops(const SimTable& t, double itemsize, const SimNetwork& n)
      : t_(t), itemsize_(itemsize), n_(n), p_(static_cast<Index>(n.send.size)) {
    for (Index r = 0; r < 2 * p_; ++r) {
      const bool intra = r < p_ || !n.clusters;
      const int64_t q = r % p_;
      send_.push_back(intra ? n.send[q] : n.inter_send[q]);
      recv_.push_back(intra ? n.recv[q] : n.inter_recv[q]);
      latency_.push_back(intra ? n.latency[q] : n.inter_latency[q]);
      cost_.push_back(n.message_cost[q]);
    }
  }
  // The hops transfer x takes (bit h for hop h), and the ports of each.
  uint8_t Ports(int64_t x, std::pair<Index, Index> (&ports)[kHops]) const {
    const Index src = static_cast<Index>(t_(x, kSrc)), dst = static_cast<Index>(t_(x, kDst));
    const bool cross = n_.clusters && n_.cluster[src] != n_.cluster[dst];
    // Across clusters: src -> a (its relay) -> b (dst's relay) -> dst.
    const Index a = cross ? static_cast<Index>(n_.relay[src]) : src;
    const Index b = cross ? static_cast<Index>(n_.relay[dst]) : dst;
    ports[0] = {src, a};
    ports[1] = cross ? std::pair<Index, Index>{a + p_, b + p_} : std::pair<Index, Index>{src, dst};
    ports[2] = {b, dst};
    return static_cast<uint8_t>((cross && a != src) | 2 | (cross && b != dst) << 2);
  }
  double Size(int64_t x) const { return static_cast<double>(t_(x, kLength)) * itemsize_; }
  double Tx(Index tx_port, double size) const {
    return cost_[tx_port] + size / send_[tx_port];
  }
  double Rx(Index tx_port, Index rx_port, double size) const {
    const double rx = cost_[rx_port] + size / recv_[rx_port];
    return n_.port_blocking_latency ? rx + Latency(tx_port, rx_port) : rx;
  }
  double Delay(Index tx_port, Index rx_port) const {
    return n_.port_blocking_latency ? 0.0 : Latency(tx_port, rx_port);
  }

 private:
  double Latency(Index tx_port, Index rx_port) const {
    return std::max(latency_[tx_port], latency_[rx_port]);
  }

  const SimTable& t_;
  double itemsize_;
  const SimNetwork& n_;
  Index p_;
  std::vector<double> send_, recv_, latency_, cost_;  // per port
};

// Sorts `v`, which consists of few ascending runs, by merging the runs.
template <typename T>
void SortRuns(std::vector<T>* v, std::vector<T>* scratch) {
  std::vector<size_t> runs{0};  // where each run begins
  for (size_t i = 1; i < v->size(); ++i) {
    if ((*v)[i] < (*v)[i - 1]) runs.push_back(i);
  }
  runs.push_back(v->size());
  while (runs.size() > 2) {
    scratch->resize(v->size());
    std::vector<size_t> merged{0};
    for (size_t k = 0; k + 1 < runs.size(); k += 2) {
      const size_t end = runs[std::min(k + 2, runs.size() - 1)];
      std::merge(v->begin() + runs[k], v->begin() + runs[k + 1], v->begin() + runs[k + 1],
                 v->begin() + end, scratch->begin() + runs[k]);
      merged.push_back(end);
    }
    v->swap(*scratch);
    runs.swap(merged);
  }
}

// The distinct boundaries of one rank's ranges, numbered in ascending order:
// elementary segment k lies between boundaries k and k + 1. An open-addressing
// hash set; a slot stamped with an older generation is free, so Clear is O(1).
class Cuts {
 public:
  void Clear() {
    ++generation_;
    values_.clear();
  }
  // The index of `value` in the order of Add (Id numbers it once Number has run).
  Index Add(int64_t value) {
    if (2 * (values_.size() + 1) > slots_.size()) Grow();
    const size_t mask = slots_.size() - 1;
    // At most half the slots are taken: the probe ends.
    for (size_t i = Hash(value);; i = (i + 1) & mask) {
      Slot& slot = slots_[i];
      if (slot.generation != generation_) {
        slot = {value, static_cast<Index>(values_.size()), generation_};
        values_.emplace_back(value, slot.added);
        return slot.added;
      }
      if (slot.value == value) return slot.added;
    }
  }
  void Number() {
    SortRuns(&values_, &scratch_);
    id_.resize(values_.size());
    for (size_t k = 0; k < values_.size(); ++k) id_[values_[k].second] = static_cast<Index>(k);
  }
  Index Id(int64_t added) const { return id_[static_cast<size_t>(added)]; }
  size_t Count() const { return values_.size(); }

 private:
  struct Slot {
    int64_t value;
    Index added;
    uint32_t generation;
  };
  size_t Hash(int64_t value) const {
    return static_cast<size_t>((static_cast<uint64_t>(value) * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  void Grow() {
    const size_t capacity = std::max<size_t>(64, 2 * slots_.size());
    shift_ = 64;
    for (size_t c = capacity; c > 1; c >>= 1) --shift_;
    slots_.assign(capacity, Slot{0, 0, 0});
    for (const auto& [value, added] : values_) {
      size_t i = Hash(value);
      while (slots_[i].generation == generation_) i = (i + 1) & (capacity - 1);
      slots_[i] = {value, added, generation_};
    }
  }

  int shift_ = 64;
  uint32_t generation_ = 1;
  std::vector<Slot> slots_;
  std::vector<std::pair<int64_t, Index>> values_, scratch_;  // (value, index of Add)
  std::vector<Index> id_;  // per index of Add: its number
};

// The pending events, an instant at a time: Take starts the earliest time,
// and Next gives its events in ascending code, those pushed for that time
// meanwhile included (as a heap of (time, code) pairs gives them). A heap of
// buckets of codes of one time each: an event of the time of the last bucket
// pushed joins it, and the buckets of one time merge when it is taken.
class Events {
 public:
  bool Empty() const { return heap_.empty() && at_ == instant_.size(); }
  void Push(double time, Index code) {
    if (at_ < instant_.size() && time == now_) {
      instant_.insert(std::upper_bound(instant_.begin() + at_, instant_.end(), code), code);
      return;
    }
    ++pending_;
    if (open_ < heap_.size() && time == heap_[open_].time) {
      codes_.push_back(code);
      ++heap_[open_].end;
      return;
    }
    if (codes_.size() >= 2 * pending_ + 4096) Compact();
    codes_.push_back(code);
    const Index end = static_cast<Index>(codes_.size());
    open_ = SiftUp({time, end - 1, end});
  }
  // Starts the earliest pending time (not Empty) and returns it.
  double Take() {
    now_ = heap_[0].time;
    instant_.clear();
    at_ = 0;
    while (!heap_.empty() && heap_[0].time == now_) {
      const Bucket& b = heap_[0];
      instant_.insert(instant_.end(), codes_.begin() + b.begin, codes_.begin() + b.end);
      const Bucket last = heap_.back();
      heap_.pop_back();
      if (!heap_.empty()) SiftDown(last);
    }
    pending_ -= instant_.size();
    open_ = heap_.size();  // none: the buckets have moved
    std::sort(instant_.begin(), instant_.end());
    return now_;
  }
  // The next event of the instant taken; false once it has none left.
  bool Next(Index* code) {
    if (at_ == instant_.size()) return false;
    *code = instant_[at_++];
    return true;
  }

 private:
  struct Bucket {
    double time;
    Index begin, end;  // its codes in codes_
  };
  // Adds `b`; returns where it is.
  size_t SiftUp(Bucket b) {
    size_t hole = heap_.size();
    heap_.push_back(b);
    for (; hole && b.time < heap_[(hole - 1) / 2].time; hole = (hole - 1) / 2) {
      heap_[hole] = heap_[(hole - 1) / 2];
    }
    heap_[hole] = b;
    return hole;
  }
  // Places `b` in the hole at the root.
  void SiftDown(Bucket b) {
    const size_t n = heap_.size();
    size_t hole = 0;
    for (size_t child = 1; child < n; child = 2 * hole + 1) {
      child += child + 1 < n && heap_[child + 1].time < heap_[child].time;
      if (!(heap_[child].time < b.time)) break;
      heap_[hole] = heap_[child];
      hole = child;
    }
    heap_[hole] = b;
  }
  // Drops the codes of the buckets taken.
  void Compact() {
    std::vector<Index> live;
    live.reserve(pending_);
    for (Bucket& b : heap_) {
      const Index begin = static_cast<Index>(live.size());
      live.insert(live.end(), codes_.begin() + b.begin, codes_.begin() + b.end);
      b = {b.time, begin, static_cast<Index>(live.size())};
    }
    codes_.swap(live);
  }

  std::vector<Bucket> heap_;
  std::vector<Index> codes_;
  size_t pending_ = 0;          // codes in heap_'s buckets
  size_t open_ = 0;             // where the last bucket pushed is in heap_ (size: none)
  double now_ = 0.0;            // the instant taken
  std::vector<Index> instant_;  // its codes, ascending
  size_t at_ = 0;               // the next of them
};

// The transfers waiting for each port. The transfers that may ever wait for a
// port are its members, numbered in ascending order (a member's slot); the
// waiting ones are bits over the slots, with a summary level per 64 words, so
// the smallest is found with one bit scan per level.
class PortQueues {
 public:
  explicit PortQueues(Index ports) : members_(ports), levels_(ports), waiting_(ports, 0) {}
  Index Ports() const { return static_cast<Index>(members_.size()); }
  // Makes transfer x (larger than the members so far) a member of `port`; returns its slot.
  Index Add(Index port, Index x) {
    members_[port].push_back(x);
    return static_cast<Index>(members_[port].size() - 1);
  }
  // Makes the queues, empty, once every member is added.
  void Start() {
    size_t words = 0;
    for (size_t r = 0; r < members_.size(); ++r) {
      Levels& l = levels_[r];
      size_t n = members_[r].size();
      if (!n) continue;
      do {
        n = (n + 63) / 64;
        l.offset[l.count++] = words;
        words += n;
      } while (n > 1);
    }
    words_.assign(words, 0);
  }
  bool Empty(Index port) const { return !waiting_[port]; }
  void Push(Index port, Index slot) {
    ++waiting_[port];
    const Levels& l = levels_[port];
    size_t i = static_cast<size_t>(slot);
    for (int k = 0; k < l.count; ++k, i >>= 6) {
      uint64_t& w = words_[l.offset[k] + (i >> 6)];
      const bool summarised = w != 0;
      w |= uint64_t{1} << (i & 63);
      if (summarised) break;
    }
  }
  // The smallest transfer waiting for `port` (not Empty), which stops waiting.
  Index Pop(Index port) {
    --waiting_[port];
    const Levels& l = levels_[port];
    size_t i = 0;
    for (int k = l.count; k-- > 0;) {
      i = i << 6 | static_cast<size_t>(__builtin_ctzll(words_[l.offset[k] + i]));
    }
    const Index x = members_[port][i];
    for (int k = 0; k < l.count; ++k, i >>= 6) {
      uint64_t& w = words_[l.offset[k] + (i >> 6)];
      w &= ~(uint64_t{1} << (i & 63));
      if (w) break;
    }
    return x;
  }

 private:
  struct Levels {
    int count = 0;
    size_t offset[6];  // 64^6 slots > kMaxIndex
  };
  std::vector<std::vector<Index>> members_;
  std::vector<Levels> levels_;
  std::vector<uint64_t> words_;
  std::vector<Index> waiting_;  // per port
};

// A transfer on the hop it is on: its size, its ports and its slots in their queues.
struct Leg {
  double size;
  Index tx_port, rx_port;
  Index tx_slot, rx_slot;
};

// Which hops a transfer takes (bit h for hop h) and the one it is on.
struct Route {
  uint8_t taken, hop;
};

// simulate.py's _hops for every transfer: its leg and route, the queues of
// the ports, and per transfer its slots on its second and third hops.
struct Paths {
  explicit Paths(Index ports) : tx_queue(ports), rx_queue(ports) {}
  Array<Leg> legs;
  Array<Route> routes;
  PortQueues tx_queue, rx_queue;
  std::vector<std::pair<Index, Index>> later_slots[kHops - 1];
};

// What a transfer waits for and what waits for it.
struct Need {
  Index unit;                // the unit it writes
  Index raw_need;            // the writes it waits for (read after write)
  Index war_begin, war_end;  // war_targets: the units that wait until it has been read
};

// A write: one COPY transfer, or the REDUCE transfers of one step into one rank.
struct Unit {
  Index need;  // the events it waits for
  // unit_targets[begin:split]: the transfers that read what it writes;
  // unit_targets[split:end]: the units that overwrite it.
  Index begin, split, end;
};

// simulate.py's _dependencies.
struct Graph {
  Array<Need> needs;  // per transfer
  std::vector<Unit> units;
  std::vector<Index> unit_targets, war_targets;
};

// A read (by a transfer) or a write (by a unit) of a range of one rank's buffer.
struct Access {
  int64_t lo, hi;  // the range [lo, hi); then the elementary segments it covers
  Index step;      // its step's index among the table's steps (they ascend)
  Index id;        // the transfer or the unit
};

// The reads and writes of every rank: rank r's reads are
// reads[read_begin[r]:read_begin[r + 1]], each in step order, and so for writes.
struct Accesses {
  Array<Access> reads, writes;
  std::vector<size_t> read_begin, write_begin;
};

// Makes the units in row order (a REDUCE row joins the unit of its group,
// whose first row stands for it) and every rank's accesses: its reads by the
// transfers from it, its writes by the units into it.
void MakeUnits(const SimTable& t, size_t ranks, Graph* g, Accesses* a) {
  const size_t num = static_cast<size_t>(t.rows);
  std::vector<Index> group_unit(ranks, -1), group_step(ranks, -1);
  a->read_begin.assign(ranks + 1, 0);
  a->write_begin.assign(ranks + 1, 0);
  g->needs.resize(num);
  g->units.reserve(num);
  Index step = 0;
  for (size_t x = 0; x < num; ++x) {
    step += x && t(x, kStep) != t(x - 1, kStep);
    const int64_t dst = t(x, kDst);
    ++a->read_begin[t(x, kSrc) + 1];
    Index& unit = g->needs[x].unit;
    const bool reduce = t(x, kOp) == kReduce;
    if (reduce && group_step[dst] == step) {
      unit = group_unit[dst];
      ++g->units[unit].need;
      continue;
    }
    unit = static_cast<Index>(g->units.size());
    if (reduce) {
      group_step[dst] = step;
      group_unit[dst] = unit;
    }
    g->units.push_back({1, 0, 0, 0});
    ++a->write_begin[dst + 1];
  }
  for (size_t r = 0; r < ranks; ++r) {
    a->read_begin[r + 1] += a->read_begin[r];
    a->write_begin[r + 1] += a->write_begin[r];
  }
  a->reads.resize(num);
  a->writes.resize(g->units.size());
  std::vector<size_t> read_at(a->read_begin.begin(), a->read_begin.end() - 1);
  std::vector<size_t> write_at(a->write_begin.begin(), a->write_begin.end() - 1);
  step = 0;
  for (size_t x = 0, units = 0; x < num; ++x) {
    step += x && t(x, kStep) != t(x - 1, kStep);
    const int64_t n = t(x, kLength);
    a->reads[read_at[t(x, kSrc)]++] = {t(x, kSrcStart), t(x, kSrcStart) + n, step,
                                       static_cast<Index>(x)};
    const Index unit = g->needs[x].unit;
    if (static_cast<size_t>(unit) == units) {  // the unit's first row
      a->writes[write_at[t(x, kDst)]++] = {t(x, kDstStart), t(x, kDstStart) + n, step, unit};
      ++units;
    }
  }
}

using Edges = std::vector<std::pair<Index, Index>>;

// Per node in [0, nodes): how many edges (from, to) leave it.
void Count(const Edges& edges, size_t nodes, std::vector<Index>* count) {
  count->assign(nodes, 0);
  for (const auto& e : edges) ++(*count)[static_cast<size_t>(e.first)];
}

// Places the targets of `edges`, each mapped by `target`, from where `at` says
// per node, which it moves on.
template <typename Target>
void Place(const Edges& edges, Target target, std::vector<Index>* at, std::vector<Index>* out) {
  for (const auto& e : edges) (*out)[(*at)[e.first]++] = target(e.second);
}

// simulate.py's _dependencies for the ranks one thread takes: per rank, its
// reads and writes in program order over the elementary segments of its
// buffer. A read waits for the last write of each segment (read after write);
// a write for the last write (write after write) and for the reads since
// (write after read). The lists go to this thread's unit_targets and
// war_targets.
class RankDependencies {
 public:
  explicit RankDependencies(Graph* g) : g_(g) {}
  // A rank's accesses; false if the pieces of this thread's ranks are too many.
  bool Add(Access* read, Index num_reads, Access* write, Index num_writes);
  std::vector<Index>& unit_targets() { return unit_targets_; }
  std::vector<Index>& war_targets() { return war_targets_; }

 private:
  struct Reader {
    Index read, next;
  };
  Graph* g_;
  Cuts cuts_;
  // Per segment: the last write and the reads since (a list in readers_).
  std::vector<Index> last_write_, first_reader_;
  std::vector<Reader> readers_;
  // The rank's edges and in-degrees over its own indices of reads and writes;
  // marks keep each edge once (the last target that took an edge from a node).
  Edges raw_, waw_, war_;  // write -> read, write -> write, read -> write
  std::vector<Index> raw_need_, need_, raw_mark_, waw_mark_, war_mark_;
  std::vector<Index> raw_at_, waw_at_, war_at_;  // per node: its edges, then where they go
  std::vector<Index> unit_targets_, war_targets_;
  int64_t pieces_ = 0;  // (access, segment) pairs of its ranks so far
};

bool RankDependencies::Add(Access* read, Index num_reads, Access* write, Index num_writes) {
  auto each_access = [&](auto f) {
    std::for_each(read, read + num_reads, f);
    std::for_each(write, write + num_writes, f);
  };
  cuts_.Clear();
  int64_t lo = -1, hi = -1;  // the last range added (often the next one's too)
  Index lo_added = 0, hi_added = 0;
  each_access([&](Access& a) {
    if (a.lo != lo || a.hi != hi) {
      lo = a.lo;
      hi = a.hi;
      lo_added = cuts_.Add(lo);
      hi_added = cuts_.Add(hi);
    }
    a.lo = lo_added;
    a.hi = hi_added;
  });
  cuts_.Number();
  each_access([&](Access& a) {
    a.lo = cuts_.Id(a.lo);
    a.hi = cuts_.Id(a.hi);
    pieces_ += a.hi - a.lo;
  });
  if (pieces_ > kMaxIndex) return false;
  last_write_.assign(cuts_.Count(), -1);
  first_reader_.assign(cuts_.Count(), -1);
  readers_.clear();
  raw_.clear();
  waw_.clear();
  war_.clear();
  raw_need_.assign(num_reads, 0);
  war_mark_.assign(num_reads, -1);
  need_.assign(num_writes, 0);
  raw_mark_.assign(num_writes, -1);
  waw_mark_.assign(num_writes, -1);
  // Program order: by step, the reads of a step before its writes.
  for (Index i = 0, j = 0; i < num_reads || j < num_writes;) {
    if (j == num_writes || (i < num_reads && read[i].step <= write[j].step)) {
      for (int64_t s = read[i].lo; s < read[i].hi; ++s) {
        const Index w = last_write_[s];
        if (w >= 0 && raw_mark_[w] != i) {
          raw_mark_[w] = i;
          raw_.emplace_back(w, i);
          ++raw_need_[i];
        }
        readers_.push_back({i, first_reader_[s]});
        first_reader_[s] = static_cast<Index>(readers_.size() - 1);
      }
      ++i;
    } else {
      for (int64_t s = write[j].lo; s < write[j].hi; ++s) {
        const Index w = last_write_[s];
        if (w >= 0 && waw_mark_[w] != j) {
          waw_mark_[w] = j;
          waw_.emplace_back(w, j);
          ++need_[j];
        }
        for (Index k = first_reader_[s]; k >= 0; k = readers_[k].next) {
          const Index x = readers_[k].read;
          if (war_mark_[x] != j) {
            war_mark_[x] = j;
            war_.emplace_back(x, j);
            ++need_[j];
          }
        }
        first_reader_[s] = -1;
        last_write_[s] = j;
      }
      ++j;
    }
  }
  // The rank's lists: per write its readers then its overwriters, per read its writers.
  Count(raw_, num_writes, &raw_at_);
  Count(waw_, num_writes, &waw_at_);
  Count(war_, num_reads, &war_at_);
  Index at = static_cast<Index>(unit_targets_.size());
  for (Index j = 0; j < num_writes; ++j) {
    Unit& u = g_->units[write[j].id];
    u.need += need_[j];
    u.begin = at;
    u.split = at += raw_at_[j];
    u.end = at += waw_at_[j];
    raw_at_[j] = u.begin;
    waw_at_[j] = u.split;
  }
  unit_targets_.resize(static_cast<size_t>(at));
  at = static_cast<Index>(war_targets_.size());
  for (Index i = 0; i < num_reads; ++i) {
    Need& n = g_->needs[read[i].id];
    n.raw_need = raw_need_[i];
    n.war_begin = at;
    n.war_end = at += war_at_[i];
    war_at_[i] = n.war_begin;
  }
  war_targets_.resize(static_cast<size_t>(at));
  Place(raw_, [&](Index i) { return read[i].id; }, &raw_at_, &unit_targets_);
  Place(waw_, [&](Index j) { return write[j].id; }, &waw_at_, &unit_targets_);
  Place(war_, [&](Index j) { return write[j].id; }, &war_at_, &war_targets_);
  return true;
}

// Runs a() here and b() on a second thread (one after the other unless
// `parallel`); rethrows what either threw.
template <typename A, typename B>
void InParallel(bool parallel, A a, B b) {
  if (!parallel) {
    a();
    b();
    return;
  }
  std::exception_ptr b_error;
  std::thread thread([&] {
    try {
      b();
    } catch (...) {
      b_error = std::current_exception();
    }
  });
  std::exception_ptr a_error;
  try {
    a();
  } catch (...) {
    a_error = std::current_exception();
  }
  thread.join();
  if (a_error) std::rethrow_exception(a_error);
  if (b_error) std::rethrow_exception(b_error);
}

// simulate.py's _dependencies over the ranks' accesses, the ranks shared by
// two threads if `parallel`.
std::string Dependencies(bool parallel, Accesses* a, Graph* g) {
  const size_t ranks = a->read_begin.size() - 1;
  std::vector<RankDependencies> threads(2, RankDependencies(g));
  std::vector<uint8_t> thread_of(ranks);  // the thread that took each rank
  std::atomic<size_t> next{0};
  std::atomic<bool> too_many{false};
  auto work = [&](uint8_t k) {
    for (size_t r; !too_many && (r = next++) < ranks;) {
      thread_of[r] = k;
      const size_t reads = a->read_begin[r], writes = a->write_begin[r];
      if (!threads[k].Add(a->reads.data() + reads,
                          static_cast<Index>(a->read_begin[r + 1] - reads),
                          a->writes.data() + writes,
                          static_cast<Index>(a->write_begin[r + 1] - writes))) {
        too_many = true;
      }
    }
  };
  InParallel(parallel, [&] { work(0); }, [&] { work(1); });
  const size_t unit_base = threads[0].unit_targets().size();
  const size_t war_base = threads[0].war_targets().size();
  if (too_many || unit_base + threads[1].unit_targets().size() > kMaxIndex ||
      war_base + threads[1].war_targets().size() > kMaxIndex) {
    return "the schedule's ranges cut the buffers into more than " + std::to_string(kMaxIndex) +
           " pieces";
  }
  // The lists of the second thread after those of the first.
  g->unit_targets = std::move(threads[0].unit_targets());
  g->unit_targets.insert(g->unit_targets.end(), threads[1].unit_targets().begin(),
                         threads[1].unit_targets().end());
  g->war_targets = std::move(threads[0].war_targets());
  g->war_targets.insert(g->war_targets.end(), threads[1].war_targets().begin(),
                        threads[1].war_targets().end());
  for (size_t r = 0; r < ranks; ++r) {
    if (!thread_of[r]) continue;
    for (size_t k = a->write_begin[r]; k < a->write_begin[r + 1]; ++k) {
      Unit& u = g->units[a->writes[k].id];
      u.begin += static_cast<Index>(unit_base);
      u.split += static_cast<Index>(unit_base);
      u.end += static_cast<Index>(unit_base);
    }
    for (size_t k = a->read_begin[r]; k < a->read_begin[r + 1]; ++k) {
      Need& n = g->needs[a->reads[k].id];
      n.war_begin += static_cast<Index>(war_base);
      n.war_end += static_cast<Index>(war_base);
    }
  }
  return "";
}

// simulate.py's _hops for every transfer: its route, its first hop's leg,
// each hop as a member of its ports' queues, and the sums that simulate.py's
// np.bincount calls make, in the same order (per hop over the transfers, then
// the hops added up).
void MakePaths(const SimTable& t, const Hops& hops, Paths* paths, SimResult* out) {
  const size_t ports = out->tx_busy.size();
  std::vector<double> tx_busy(kHops * ports, 0.0), rx_busy(kHops * ports, 0.0);
  paths->legs.resize(static_cast<size_t>(t.rows));
  paths->routes.resize(static_cast<size_t>(t.rows));
  std::pair<Index, Index> hop_ports[kHops];
  for (Index x = 0; x < t.rows; ++x) {
    Leg& leg = paths->legs[x];
    const uint8_t taken = hops.Ports(x, hop_ports);
    const uint8_t first = static_cast<uint8_t>(__builtin_ctz(taken));
    paths->routes[x] = {taken, first};
    leg.size = hops.Size(x);
    for (unsigned hops_left = taken; hops_left; hops_left &= hops_left - 1) {
      const int h = __builtin_ctz(hops_left);
      const auto [tx_port, rx_port] = hop_ports[h];
      tx_busy[h * ports + tx_port] += hops.Tx(tx_port, leg.size);
      rx_busy[h * ports + rx_port] += hops.Rx(tx_port, rx_port, leg.size);
      const Index tx_slot = paths->tx_queue.Add(tx_port, x);
      const Index rx_slot = paths->rx_queue.Add(rx_port, x);
      if (h == first) {
        leg.tx_port = tx_port;
        leg.rx_port = rx_port;
        leg.tx_slot = tx_slot;
        leg.rx_slot = rx_slot;
      } else {
        std::vector<std::pair<Index, Index>>& slots = paths->later_slots[h - 1];
        if (slots.empty()) slots.resize(static_cast<size_t>(t.rows));
        slots[x] = {tx_slot, rx_slot};
      }
    }
    out->bytes_sent[t(x, kSrc)] += leg.size;
    out->bytes_received[t(x, kDst)] += leg.size;
  }
  for (int h = 0; h < kHops; ++h) {
    for (size_t r = 0; r < ports; ++r) {
      out->tx_busy[r] += tx_busy[h * ports + r];
      out->rx_busy[r] += rx_busy[h * ports + r];
    }
  }
  paths->tx_queue.Start();
  paths->rx_queue.Start();
}

// simulate.py's _run: the event loop; returns the completion time and the
// units never applied.
std::pair<double, int64_t> Run(const Hops& hops, Paths& paths, Graph& g) {
  Array<Leg>& legs = paths.legs;
  Array<Route>& routes = paths.routes;
  PortQueues &tx_queue = paths.tx_queue, &rx_queue = paths.rx_queue;
  Array<Need>& needs = g.needs;
  std::vector<Unit>& units = g.units;
  const Index ports = tx_queue.Ports();
  const Index num = static_cast<Index>(legs.size());
  const Index num2 = 2 * num, num3 = 3 * num;  // Check: 4 num fits
  std::vector<uint8_t> tx_idle(ports, 1), rx_idle(ports, 1);
  // Idle ports that may start a message now.
  std::vector<Index> tx_dirty, rx_dirty;
  for (Index r = 0; r < ports; ++r) tx_dirty.push_back(r);
  // Code x: tx end, num + x: rx end, 2 num + x: delivery, 3 num + x: arrival at a relay.
  Events events;
  std::vector<Index> stack;    // units whose dependencies are all met
  auto ready = [&](Index x) {  // the transfer waits for its tx port
    const Leg& leg = legs[x];
    tx_queue.Push(leg.tx_port, leg.tx_slot);
    if (tx_idle[leg.tx_port]) tx_dirty.push_back(leg.tx_port);
  };
  for (Index x = 0; x < num; ++x) {
    if (!needs[x].raw_need) tx_queue.Push(legs[x].tx_port, legs[x].tx_slot);
  }
  auto next_hop = [&](Index x) {  // at a relay: on to the next hop it takes
    Route& route = routes[x];
    const unsigned later = route.taken >> (route.hop + 1) << (route.hop + 1);
    route.hop = static_cast<uint8_t>(__builtin_ctz(later));
    std::pair<Index, Index> hop_ports[kHops];
    hops.Ports(x, hop_ports);
    Leg& leg = legs[x];
    std::tie(leg.tx_port, leg.rx_port) = hop_ports[route.hop];
    std::tie(leg.tx_slot, leg.rx_slot) = paths.later_slots[route.hop - 1][x];
    ready(x);
  };
  auto deliver = [&](Index u) {
    if (!--units[u].need) stack.push_back(u);
  };
  double now = 0.0, last = 0.0;
  int64_t pending = static_cast<int64_t>(units.size());
  while (true) {
    // Every event at `now` has been handled: the free ports with work start.
    for (Index r : tx_dirty) {
      if (tx_idle[r] && !tx_queue.Empty(r)) {
        const Index x = tx_queue.Pop(r);
        tx_idle[r] = 0;
        events.Push(now + hops.Tx(r, legs[x].size), x);
      }
    }
    tx_dirty.clear();
    for (Index r : rx_dirty) {
      if (rx_idle[r] && !rx_queue.Empty(r)) {
        const Index x = rx_queue.Pop(r);
        rx_idle[r] = 0;
        events.Push(now + hops.Rx(legs[x].tx_port, r, legs[x].size), num + x);
      }
    }
    rx_dirty.clear();
    if (events.Empty()) break;
    now = events.Take();
    for (Index code; events.Next(&code);) {
      if (code < num) {  // left the tx port: waits for the rx port
        const Leg& leg = legs[code];
        tx_idle[leg.tx_port] = 1;
        tx_dirty.push_back(leg.tx_port);
        rx_queue.Push(leg.rx_port, leg.rx_slot);
        if (rx_idle[leg.rx_port]) rx_dirty.push_back(leg.rx_port);
        const Route& route = routes[code];
        if (route.hop == __builtin_ctz(route.taken)) {  // the source's range is free once read
          const Need& n = needs[code];
          for (Index k = n.war_begin; k < n.war_end; ++k) deliver(g.war_targets[k]);
        }
      } else if (code < num2) {  // left the rx port: delivered (or at the relay)
        const Index x = code - num;
        const Leg& leg = legs[x];
        rx_idle[leg.rx_port] = 1;
        rx_dirty.push_back(leg.rx_port);
        const Route& route = routes[x];
        const bool relayed = route.taken >> (route.hop + 1);
        const double delay = hops.Delay(leg.tx_port, leg.rx_port);
        if (delay != 0.0) {
          events.Push(now + delay, code + (relayed ? num2 : num));
        } else if (relayed) {
          next_hop(x);
        } else {
          deliver(needs[x].unit);
        }
      } else if (code >= num3) {
        next_hop(code - num3);
      } else {
        deliver(needs[code - num2].unit);
      }
      while (!stack.empty()) {  // apply writes; release their readers and later writers
        const Unit& u = units[stack.back()];
        stack.pop_back();
        --pending;
        last = now;
        for (Index k = u.begin; k < u.split; ++k) {
          const Index x = g.unit_targets[k];
          if (!--needs[x].raw_need) ready(x);
        }
        for (Index k = u.split; k < u.end; ++k) deliver(g.unit_targets[k]);
      }
    }
  }
  return {last, pending};
}

std::string Check(const SimTable& t, double itemsize, int64_t nranks, int64_t length,
                  int64_t num_steps, const SimNetwork& n) {
  if (t.rows > kMaxIndex / 4) return "the table has too many rows: " + std::to_string(t.rows);
  if (nranks < 1 || nranks > kMaxIndex / 2 || length < 0 || num_steps < 0 ||
      !(itemsize > 0 && std::isfinite(itemsize))) {
    return "needs nranks >= 1, length >= 0, num_steps >= 0 and a finite itemsize > 0, got "
           "nranks " + std::to_string(nranks) + ", length " + std::to_string(length) +
           ", num_steps " + std::to_string(num_steps) + ", itemsize " + std::to_string(itemsize);
  }
  auto at = [](const char* what, int64_t x) { return what + std::to_string(x); };
  for (int64_t x = 0; x < t.rows; ++x) {
    const int64_t step = t(x, kStep), src = t(x, kSrc), dst = t(x, kDst), len = t(x, kLength);
    if (step < 0 || step >= num_steps || (x && step < t(x - 1, kStep))) {
      return at("row ", x) + ": step " + std::to_string(step) + " outside [0, " +
             std::to_string(num_steps) + ") or below the previous row's (the table must be "
             "sorted by step)";
    }
    if (src < 0 || src >= nranks || dst < 0 || dst >= nranks) {
      return at("row ", x) + ": rank outside [0, " + std::to_string(nranks) + ")";
    }
    if (len < 0 || t(x, kSrcStart) < 0 || t(x, kSrcStart) > length - len ||
        t(x, kDstStart) < 0 || t(x, kDstStart) > length - len) {
      return at("row ", x) + ": range outside the buffer of " + std::to_string(length) +
             " elements";
    }
    if (t(x, kOp) != kCopy && t(x, kOp) != kReduce) {
      return at("row ", x) + ": op is neither copy nor reduce";
    }
  }
  // The ports of the Topology's rules, so that every time is a number >= 0.
  auto bandwidth = [](double b) { return b > 0 && std::isfinite(b); };
  auto latency = [](double s) { return s >= 0 && std::isfinite(s); };
  for (const Span<double>* a : {&n.send, &n.recv, &n.latency, &n.message_cost}) {
    if (a->size != nranks) return "needs per-rank ports for " + std::to_string(nranks) + " ranks";
  }
  for (int64_t r = 0; r < nranks; ++r) {
    if (!bandwidth(n.send[r]) || !bandwidth(n.recv[r]) || !latency(n.latency[r]) ||
        !latency(n.message_cost[r])) {
      return at("rank ", r) +
             ": needs finite bandwidths > 0, a finite latency >= 0 and a finite message cost >= 0";
    }
  }
  if (!n.clusters) return "";
  for (const int64_t size : {n.cluster.size, n.relay.size, n.inter_send.size, n.inter_recv.size,
                             n.inter_latency.size}) {
    if (size != nranks) {
      return "needs per-rank cross-cluster ports for " + std::to_string(nranks) + " ranks";
    }
  }
  bool several = false;  // clusters: then transfers between them go through the relays
  for (int64_t r = 0; r < nranks; ++r) several = several || n.cluster[r] != n.cluster[0];
  for (int64_t r = 0; r < nranks; ++r) {
    const int64_t relay = n.relay[r];
    if (relay < 0 || relay >= nranks || n.cluster[relay] != n.cluster[r] ||
        !latency(n.inter_latency[r])) {
      return at("rank ", r) + ": needs a relay in its cluster and a finite inter latency >= 0";
    }
    if (several && (!bandwidth(n.inter_send[relay]) || !bandwidth(n.inter_recv[relay]))) {
      return at("rank ", r) + ": its relay needs finite cross-cluster bandwidths > 0";
    }
  }
  return "";
}

}  // namespace

std::string Simulate(const SimTable& table, double itemsize, int64_t nranks, int64_t length,
                     int64_t num_steps, const SimNetwork& network, SimResult* out) {
  const std::string err = Check(table, itemsize, nranks, length, num_steps, network);
  if (!err.empty()) return err;
  out->tx_busy.assign(static_cast<size_t>(2 * nranks), 0.0);
  out->rx_busy.assign(static_cast<size_t>(2 * nranks), 0.0);
  out->bytes_sent.assign(static_cast<size_t>(nranks), 0.0);
  out->bytes_received.assign(static_cast<size_t>(nranks), 0.0);
  const Hops hops(table, itemsize, network);
  Paths paths(static_cast<Index>(2 * nranks));
  Graph graph;
  Accesses accesses;
  const bool parallel = table.rows >= kParallelRows;
  InParallel(
      parallel, [&] { MakeUnits(table, static_cast<size_t>(nranks), &graph, &accesses); },
      [&] { MakePaths(table, hops, &paths, out); });
  const std::string too_many = Dependencies(parallel, &accesses, &graph);
  if (!too_many.empty()) return too_many;
  accesses = {};
  std::tie(out->time, out->unapplied) = Run(hops, paths, graph);
  return "";
}

}  // namespace jaxcc
