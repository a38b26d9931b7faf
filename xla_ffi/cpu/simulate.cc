// jaxcc/sim/simulate.py in C++ (simulate.h): _hops, _dependencies and _run
// over flat arrays.
#include "simulate.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
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

// One hop of a transfer: its ports, the seconds it holds them, then its delay.
struct Leg {
  Index tx_port, rx_port;
  double tx, rx, delay;
};

// simulate.py's _hops, a transfer at a time. Ports 0..p-1 are the ranks'
// intra (or only) ports, p..2p-1 their cross-cluster ports.
class Hops {
 public:
  Hops(const SimTable& t, double itemsize, const SimNetwork& n)
      : t_(t), itemsize_(itemsize), n_(n), p_(static_cast<Index>(n.send.size)) {}
  // The hops transfer x takes: bit h for hop h.
  uint8_t Taken(int64_t x) const {
    const Route r = RouteOf(x);
    return static_cast<uint8_t>((r.cross && r.a != r.src) | 2 | (r.cross && r.b != r.dst) << 2);
  }
  Leg On(int64_t x, int hop) const {
    const Route r = RouteOf(x);
    const double size = static_cast<double>(t_(x, kLength)) * itemsize_;
    Leg leg = hop == 0   ? Intra(r.src, r.a, size)
              : hop == 2 ? Intra(r.b, r.dst, size)
              : r.cross  ? Leg{r.a + p_, r.b + p_, size / n_.inter_send[r.a],
                              size / n_.inter_recv[r.b],
                              std::max(n_.inter_latency[r.a], n_.inter_latency[r.b])}
                         : Intra(r.src, r.dst, size);
    if (n_.port_blocking_latency) {
      leg.rx += leg.delay;
      leg.delay = 0.0;
    }
    return leg;
  }

 private:
  // A transfer src -> dst; across clusters it goes a -> b between the relays.
  struct Route {
    Index src, dst, a, b;
    bool cross;
  };
  Route RouteOf(int64_t x) const {
    Route r;
    r.src = static_cast<Index>(t_(x, kSrc));
    r.dst = static_cast<Index>(t_(x, kDst));
    r.cross = n_.clusters && n_.cluster[r.src] != n_.cluster[r.dst];
    r.a = r.cross ? static_cast<Index>(n_.relay[r.src]) : r.src;
    r.b = r.cross ? static_cast<Index>(n_.relay[r.dst]) : r.dst;
    return r;
  }
  Leg Intra(Index from, Index to, double size) const {
    return {from, to, size / n_.send[from], size / n_.recv[to],
            std::max(n_.latency[from], n_.latency[to])};
  }

  const SimTable& t_;
  double itemsize_;
  const SimNetwork& n_;
  Index p_;
};

// What the event loop keeps of a transfer, in one cache line.
struct alignas(64) Transfer {
  Leg leg;                   // of the hop it is on
  Index tx_slot, rx_slot;    // its slots in the queues of that hop's ports
  Index unit;                // the unit it writes
  Index raw_need;            // the writes it waits for (read after write)
  Index war_begin, war_end;  // war_targets: the units that wait until it has been read
  uint8_t hop;               // the hop it is on
  uint8_t taken;             // the hops it takes (Hops::Taken)
  bool war_pending;          // it has not left its first tx port yet
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
  std::vector<Transfer> transfers;
  std::vector<Unit> units;
  std::vector<Index> unit_targets, war_targets;
};

// A read (by a transfer) or a write (by a unit) of a range of one rank's buffer.
struct Access {
  int64_t lo, hi;  // the range [lo, hi); then the elementary segments it covers
  Index step;      // its step's index among the table's steps (they ascend)
  Index id;        // the transfer or the unit
};

// Per rank its reads (by the transfers from it) and writes (by the units into
// it), each in step order: rank r's reads are reads[read_begin[r]:read_begin[r +
// 1]]. Makes the units in row order; a REDUCE row joins the unit of its group,
// whose first row stands for it.
void Accesses(const SimTable& t, size_t ranks, Graph* g, std::vector<Access>* reads,
              std::vector<size_t>* read_begin, std::vector<Access>* writes,
              std::vector<size_t>* write_begin) {
  const size_t num = static_cast<size_t>(t.rows);
  std::vector<Index> group_unit(ranks, -1), group_step(ranks, -1);
  read_begin->assign(ranks + 1, 0);
  write_begin->assign(ranks + 1, 0);
  g->transfers.resize(num);
  g->units.reserve(num);
  Index step = 0;
  for (size_t x = 0; x < num; ++x) {
    step += x && t(x, kStep) != t(x - 1, kStep);
    const int64_t dst = t(x, kDst);
    ++(*read_begin)[t(x, kSrc) + 1];
    Index& unit = g->transfers[x].unit;
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
    ++(*write_begin)[dst + 1];
  }
  for (size_t r = 0; r < ranks; ++r) {
    (*read_begin)[r + 1] += (*read_begin)[r];
    (*write_begin)[r + 1] += (*write_begin)[r];
  }
  reads->resize(num);
  writes->resize(g->units.size());
  std::vector<size_t> read_at(read_begin->begin(), read_begin->end() - 1);
  std::vector<size_t> write_at(write_begin->begin(), write_begin->end() - 1);
  step = 0;
  for (size_t x = 0, units = 0; x < num; ++x) {
    step += x && t(x, kStep) != t(x - 1, kStep);
    const int64_t n = t(x, kLength);
    (*reads)[read_at[t(x, kSrc)]++] = {t(x, kSrcStart), t(x, kSrcStart) + n, step,
                                       static_cast<Index>(x)};
    const Index unit = g->transfers[x].unit;
    if (static_cast<size_t>(unit) == units) {  // the unit's first row
      (*writes)[write_at[t(x, kDst)]++] = {t(x, kDstStart), t(x, kDstStart) + n, step, unit};
      ++units;
    }
  }
}

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
  std::vector<Index> id_;                          // per index of Add: its number
};

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

// simulate.py's _dependencies: per rank, its reads and writes in program order
// over the elementary segments of its buffer. A read waits for the last write
// of each segment (read after write); a write for the last write (write after
// write) and for the reads since (write after read).
std::string Dependencies(const SimTable& t, int64_t nranks, Graph* g) {
  const size_t ranks = static_cast<size_t>(nranks);
  std::vector<Access> reads, writes;
  std::vector<size_t> read_begin, write_begin;
  Accesses(t, ranks, g, &reads, &read_begin, &writes, &write_begin);
  Cuts cuts;
  // Per segment: the last write and the reads since (a list in `readers`).
  std::vector<Index> last_write, first_reader;
  struct Reader {
    Index read, next;
  };
  std::vector<Reader> readers;
  // The rank's edges and in-degrees over its own indices of reads and writes;
  // marks keep each edge once (the last target that took an edge from a node).
  Edges raw, waw, war;  // write -> read, write -> write, read -> write
  std::vector<Index> raw_need, need, raw_mark, waw_mark, war_mark;
  std::vector<Index> raw_at, waw_at, war_at;  // per node: its edges, then where they go
  int64_t pieces = 0;  // (access, segment) pairs of every rank so far
  for (size_t r = 0; r < ranks; ++r) {
    Access* const read = reads.data() + read_begin[r];
    Access* const write = writes.data() + write_begin[r];
    const Index num_reads = static_cast<Index>(read_begin[r + 1] - read_begin[r]);
    const Index num_writes = static_cast<Index>(write_begin[r + 1] - write_begin[r]);
    auto each_access = [&](auto f) {
      std::for_each(read, read + num_reads, f);
      std::for_each(write, write + num_writes, f);
    };
    cuts.Clear();
    each_access([&](Access& a) {
      a.lo = cuts.Add(a.lo);
      a.hi = cuts.Add(a.hi);
    });
    cuts.Number();
    each_access([&](Access& a) {
      a.lo = cuts.Id(a.lo);
      a.hi = cuts.Id(a.hi);
      pieces += a.hi - a.lo;
    });
    if (pieces > kMaxIndex) {
      return "the schedule's ranges cut the buffers into more than " +
             std::to_string(kMaxIndex) + " pieces";
    }
    last_write.assign(cuts.Count(), -1);
    first_reader.assign(cuts.Count(), -1);
    readers.clear();
    raw.clear();
    waw.clear();
    war.clear();
    raw_need.assign(num_reads, 0);
    war_mark.assign(num_reads, -1);
    need.assign(num_writes, 0);
    raw_mark.assign(num_writes, -1);
    waw_mark.assign(num_writes, -1);
    // Program order: by step, the reads of a step before its writes.
    for (Index i = 0, j = 0; i < num_reads || j < num_writes;) {
      if (j == num_writes || (i < num_reads && read[i].step <= write[j].step)) {
        for (int64_t s = read[i].lo; s < read[i].hi; ++s) {
          const Index w = last_write[s];
          if (w >= 0 && raw_mark[w] != i) {
            raw_mark[w] = i;
            raw.emplace_back(w, i);
            ++raw_need[i];
          }
          readers.push_back({i, first_reader[s]});
          first_reader[s] = static_cast<Index>(readers.size() - 1);
        }
        ++i;
      } else {
        for (int64_t s = write[j].lo; s < write[j].hi; ++s) {
          const Index w = last_write[s];
          if (w >= 0 && waw_mark[w] != j) {
            waw_mark[w] = j;
            waw.emplace_back(w, j);
            ++need[j];
          }
          for (Index k = first_reader[s]; k >= 0; k = readers[k].next) {
            const Index x = readers[k].read;
            if (war_mark[x] != j) {
              war_mark[x] = j;
              war.emplace_back(x, j);
              ++need[j];
            }
          }
          first_reader[s] = -1;
          last_write[s] = j;
        }
        ++j;
      }
    }
    // The rank's lists: per write its readers then its overwriters, per read its writers.
    Count(raw, num_writes, &raw_at);
    Count(waw, num_writes, &waw_at);
    Count(war, num_reads, &war_at);
    Index at = static_cast<Index>(g->unit_targets.size());
    for (Index j = 0; j < num_writes; ++j) {
      Unit& u = g->units[write[j].id];
      u.need += need[j];
      u.begin = at;
      u.split = at += raw_at[j];
      u.end = at += waw_at[j];
      raw_at[j] = u.begin;
      waw_at[j] = u.split;
    }
    g->unit_targets.resize(static_cast<size_t>(at));
    at = static_cast<Index>(g->war_targets.size());
    for (Index i = 0; i < num_reads; ++i) {
      Transfer& x = g->transfers[read[i].id];
      x.raw_need = raw_need[i];
      x.war_begin = at;
      x.war_end = at += war_at[i];
      war_at[i] = x.war_begin;
    }
    g->war_targets.resize(static_cast<size_t>(at));
    Place(raw, [&](Index i) { return read[i].id; }, &raw_at, &g->unit_targets);
    Place(waw, [&](Index j) { return write[j].id; }, &waw_at, &g->unit_targets);
    Place(war, [&](Index j) { return write[j].id; }, &war_at, &g->war_targets);
  }
  return "";
}

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
  explicit PortQueues(Index ports) : members_(ports), levels_(ports) {}
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
  bool Empty(Index port) const {
    const Levels& l = levels_[port];
    return !l.count || !words_[l.offset[l.count - 1]];
  }
  void Push(Index port, Index slot) {
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
};

// Every transfer's hops: the first as its leg, each as a member of its ports'
// queues (the slots of a hop after the first in `later_slots`), and the sums
// that simulate.py's np.bincount calls make, in the same order (per hop over
// the transfers, then the hops added up).
void Legs(const SimTable& t, double itemsize, const Hops& hops, Graph* g, PortQueues* tx_queue,
          PortQueues* rx_queue, std::vector<std::pair<Index, Index>> (&later_slots)[kHops - 1],
          SimResult* out) {
  const size_t ports = out->tx_busy.size();
  std::vector<double> tx_busy(kHops * ports, 0.0), rx_busy(kHops * ports, 0.0);
  for (Index x = 0; x < t.rows; ++x) {
    Transfer& tr = g->transfers[x];
    tr.taken = hops.Taken(x);
    tr.hop = static_cast<uint8_t>(__builtin_ctz(tr.taken));
    tr.war_pending = true;
    for (int h = tr.hop; h < kHops; ++h) {
      if (!(tr.taken >> h & 1)) continue;
      const Leg leg = hops.On(x, h);
      tx_busy[h * ports + leg.tx_port] += leg.tx;
      rx_busy[h * ports + leg.rx_port] += leg.rx;
      const Index tx_slot = tx_queue->Add(leg.tx_port, x);
      const Index rx_slot = rx_queue->Add(leg.rx_port, x);
      if (h == tr.hop) {
        tr.leg = leg;
        tr.tx_slot = tx_slot;
        tr.rx_slot = rx_slot;
      } else {
        std::vector<std::pair<Index, Index>>& slots = later_slots[h - 1];
        if (slots.empty()) slots.resize(static_cast<size_t>(t.rows));
        slots[x] = {tx_slot, rx_slot};
      }
    }
    const double size = static_cast<double>(t(x, kLength)) * itemsize;
    out->bytes_sent[t(x, kSrc)] += size;
    out->bytes_received[t(x, kDst)] += size;
  }
  for (int h = 0; h < kHops; ++h) {
    for (size_t r = 0; r < ports; ++r) {
      out->tx_busy[r] += tx_busy[h * ports + r];
      out->rx_busy[r] += rx_busy[h * ports + r];
    }
  }
}

// simulate.py's _run: the event loop; returns the completion time and the
// units never applied.
std::pair<double, int64_t> Run(const SimTable& t, double itemsize, const Hops& hops, Graph& g,
                               SimResult* out) {
  std::vector<Transfer>& transfers = g.transfers;
  std::vector<Unit>& units = g.units;
  const Index ports = static_cast<Index>(out->tx_busy.size());
  PortQueues tx_queue(ports), rx_queue(ports);
  // Per transfer its slots on its second and third hops.
  std::vector<std::pair<Index, Index>> later_slots[kHops - 1];
  Legs(t, itemsize, hops, &g, &tx_queue, &rx_queue, later_slots, out);
  tx_queue.Start();
  rx_queue.Start();
  const Index num = static_cast<Index>(transfers.size());
  const Index num2 = 2 * num, num3 = 3 * num;  // Check: 4 num fits
  std::vector<uint8_t> tx_idle(ports, 1), rx_idle(ports, 1);
  // Idle ports that may start a message now.
  std::vector<Index> tx_dirty, rx_dirty;
  for (Index r = 0; r < ports; ++r) tx_dirty.push_back(r);
  // Code x: tx end, num + x: rx end, 2 num + x: delivery, 3 num + x: arrival at a relay.
  Events events;
  std::vector<Index> stack;    // units whose dependencies are all met
  auto ready = [&](Index x) {  // the transfer waits for its tx port
    const Transfer& tr = transfers[x];
    tx_queue.Push(tr.leg.tx_port, tr.tx_slot);
    if (tx_idle[tr.leg.tx_port]) tx_dirty.push_back(tr.leg.tx_port);
  };
  for (Index x = 0; x < num; ++x) {
    const Transfer& tr = transfers[x];
    if (!tr.raw_need) tx_queue.Push(tr.leg.tx_port, tr.tx_slot);
  }
  auto next_hop = [&](Index x) {  // at a relay: on to the next hop it takes
    Transfer& tr = transfers[x];
    tr.hop = static_cast<uint8_t>(__builtin_ctz(tr.taken >> (tr.hop + 1) << (tr.hop + 1)));
    tr.leg = hops.On(x, tr.hop);
    tr.tx_slot = later_slots[tr.hop - 1][x].first;
    tr.rx_slot = later_slots[tr.hop - 1][x].second;
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
        events.Push(now + transfers[x].leg.tx, x);
      }
    }
    tx_dirty.clear();
    for (Index r : rx_dirty) {
      if (rx_idle[r] && !rx_queue.Empty(r)) {
        const Index x = rx_queue.Pop(r);
        rx_idle[r] = 0;
        events.Push(now + transfers[x].leg.rx, num + x);
      }
    }
    rx_dirty.clear();
    if (events.Empty()) break;
    now = events.Take();
    for (Index code; events.Next(&code);) {
      if (code < num) {  // left the tx port: waits for the rx port
        Transfer& tr = transfers[code];
        tx_idle[tr.leg.tx_port] = 1;
        tx_dirty.push_back(tr.leg.tx_port);
        rx_queue.Push(tr.leg.rx_port, tr.rx_slot);
        if (rx_idle[tr.leg.rx_port]) rx_dirty.push_back(tr.leg.rx_port);
        if (tr.war_pending) {  // the source's range is free once read
          tr.war_pending = false;
          for (Index k = tr.war_begin; k < tr.war_end; ++k) deliver(g.war_targets[k]);
        }
      } else if (code < num2) {  // left the rx port: delivered (or at the relay)
        const Index x = code - num;
        const Transfer& tr = transfers[x];
        rx_idle[tr.leg.rx_port] = 1;
        rx_dirty.push_back(tr.leg.rx_port);
        const bool relayed = tr.taken >> (tr.hop + 1);
        if (tr.leg.delay != 0.0) {
          events.Push(now + tr.leg.delay, code + (relayed ? num2 : num));
        } else if (relayed) {
          next_hop(x);
        } else {
          deliver(tr.unit);
        }
      } else if (code >= num3) {
        next_hop(code - num3);
      } else {
        deliver(transfers[code - num2].unit);
      }
      while (!stack.empty()) {  // apply writes; release their readers and later writers
        const Unit& u = units[stack.back()];
        stack.pop_back();
        --pending;
        last = now;
        for (Index k = u.begin; k < u.split; ++k) {
          const Index x = g.unit_targets[k];
          if (!--transfers[x].raw_need) ready(x);
        }
        for (Index k = u.split; k < u.end; ++k) deliver(g.unit_targets[k]);
      }
    }
  }
  return {last, pending};
}

std::string Check(const SimTable& t, double itemsize, int64_t nranks, int64_t length,
                  int64_t num_steps, const SimNetwork& n) {
  if (t.columns != kColumns) {
    return "the table has " + std::to_string(t.columns) + " columns, not " +
           std::to_string(kColumns);
  }
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
  for (const Strided<double>* a : {&n.send, &n.recv, &n.latency}) {
    if (a->size != nranks) return "needs per-rank ports for " + std::to_string(nranks) + " ranks";
  }
  for (int64_t r = 0; r < nranks; ++r) {
    if (!bandwidth(n.send[r]) || !bandwidth(n.recv[r]) || !latency(n.latency[r])) {
      return at("rank ", r) + ": needs finite bandwidths > 0 and a finite latency >= 0";
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
  std::string err = Check(table, itemsize, nranks, length, num_steps, network);
  if (!err.empty()) return err;
  Graph graph;
  err = Dependencies(table, nranks, &graph);
  if (!err.empty()) return err;
  out->tx_busy.assign(static_cast<size_t>(2 * nranks), 0.0);
  out->rx_busy.assign(static_cast<size_t>(2 * nranks), 0.0);
  out->bytes_sent.assign(static_cast<size_t>(nranks), 0.0);
  out->bytes_received.assign(static_cast<size_t>(nranks), 0.0);
  const Hops hops(table, itemsize, network);
  std::tie(out->time, out->unapplied) = Run(table, itemsize, hops, graph, out);
  return "";
}

}  // namespace jaxcc
