// The dataflow runner (jaxcc/dataflow.h): a rank's units, their
// dependencies, and the loop that runs them as their data arrives.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <iterator>
#include <map>
#include <memory>
#include <queue>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "jaxcc/dataflow.h"
#include "jaxcc/schedule.h"
#include "jaxcc/transport.h"

namespace jaxcc {
namespace {

struct Unit {
  int64_t step;
  enum Kind { kSend, kCopy, kReduce } kind;  // a copy or a reduce is an apply
  std::vector<Piece> pieces;  // one for sends and copies; canonical order for a reduce
  int unmet = 0;              // units it waits for that are not done
  int missing = 0;            // pieces not yet arrived (applies)
  std::vector<int> next;      // units that wait for this one
};

// For every range of the buffer: the last unit that wrote it and the sends
// that read it since. Ranges split where pieces begin and end.
class RangeHistory {
 public:
  explicit RangeHistory(int64_t length) : length_(length) {
    segs_.emplace(0, Seg{length, -1, {}});
  }
  // The units that `unit`, reading [lo, hi), waits for; records the read.
  void Read(int64_t lo, int64_t hi, int unit, std::vector<int>* deps) {
    for (auto it = Split(lo), end = Split(hi); it != end; ++it) {
      if (it->second.writer >= 0) deps->push_back(it->second.writer);
      it->second.readers.push_back(unit);
    }
  }
  // The units that `unit`, writing [lo, hi), waits for; records the write.
  void Write(int64_t lo, int64_t hi, int unit, std::vector<int>* deps) {
    for (auto it = Split(lo), end = Split(hi); it != end; ++it) {
      if (it->second.writer >= 0) deps->push_back(it->second.writer);
      deps->insert(deps->end(), it->second.readers.begin(), it->second.readers.end());
      it->second.writer = unit;
      it->second.readers.clear();
    }
  }

 private:
  struct Seg {
    int64_t end;
    int writer;
    std::vector<int> readers;
  };
  using Iter = std::map<int64_t, Seg>::iterator;
  // The segment that starts at x, splitting the one that contains it.
  Iter Split(int64_t x) {
    if (x >= length_) return segs_.end();
    Iter it = std::prev(segs_.upper_bound(x));
    if (it->first == x) return it;
    Seg right{it->second.end, it->second.writer, it->second.readers};
    it->second.end = x;
    return segs_.emplace_hint(std::next(it), x, std::move(right));
  }

  int64_t length_;
  std::map<int64_t, Seg> segs_;
};

// This rank's units in program order, with their dependencies.
std::vector<Unit> BuildUnits(const std::vector<RankStep>& plan, int64_t length) {
  std::vector<Unit> units;
  RangeHistory history(length);
  std::vector<int> deps;
  auto add = [&](Unit unit, int64_t lo, int64_t hi) {
    const int id = static_cast<int>(units.size());
    if (unit.kind == Unit::kSend) {
      history.Read(lo, hi, id, &deps);
    } else {
      history.Write(lo, hi, id, &deps);
    }
    std::sort(deps.begin(), deps.end());
    deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
    unit.unmet = static_cast<int>(deps.size());
    for (int d : deps) units[d].next.push_back(id);
    deps.clear();
    units.push_back(std::move(unit));
  };
  for (size_t t = 0; t < plan.size(); ++t) {
    const int64_t s = static_cast<int64_t>(t);
    for (const Piece& out : plan[t].sends) {
      add(Unit{s, Unit::kSend, {out}, 0, 0, {}}, out.src_start, out.src_start + out.length);
    }
    for (const Piece& in : plan[t].copies) {
      add(Unit{s, Unit::kCopy, {in}, 0, 1, {}}, in.dst_start, in.dst_start + in.length);
    }
    const std::vector<Piece>& red = plan[t].reduces;
    if (!red.empty()) {
      add(Unit{s, Unit::kReduce, red, 0, static_cast<int>(red.size()), {}}, red[0].dst_start,
          red[0].dst_start + red[0].length);
    }
  }
  return units;
}

}  // namespace


std::string RunDataflow(const std::vector<RankStep>& plan, int64_t length,
                        AsyncTransport& transport, Kernels& kernels, PieceCodec* codec,
                        char* buf, size_t itemsize, std::chrono::milliseconds timeout,
                        std::chrono::nanoseconds patience) {
  using Clock = std::chrono::steady_clock;
  std::vector<Unit> units = BuildUnits(plan, length);
  std::map<std::pair<int64_t, int>, int> apply_of;  // (step, src) -> unit
  for (size_t u = 0; u < units.size(); ++u) {
    if (units[u].kind == Unit::kSend) continue;
    for (const Piece& in : units[u].pieces) apply_of[{units[u].step, in.peer}] = static_cast<int>(u);
  }
  // Ready units, lowest step first (then program order).
  std::priority_queue<std::pair<int64_t, int>, std::vector<std::pair<int64_t, int>>,
                      std::greater<>> ready;
  std::map<int, std::deque<std::pair<int64_t, int>>> in_flight;  // peer -> (seq, unit)
  std::vector<int64_t> posted, written;
  std::set<std::pair<int64_t, int>> arrived_at;  // (step, src) of the pieces that came
  std::vector<Arrival> arrived;
  std::vector<const char*> inputs;
  std::vector<uint64_t> sizes;
  // Encodings made for sends by the apply they forward (send unit -> bytes).
  std::map<int, std::pair<std::unique_ptr<char[]>, uint64_t>> made;
  size_t done = 0, first_pending = 0;
  std::vector<char> finished(units.size(), 0);

  auto finish = [&](int u) {
    finished[u] = 1;
    ++done;
    for (int v : units[u].next) {
      if (--units[v].unmet == 0 && units[v].missing == 0) ready.emplace(units[v].step, v);
    }
  };
  // The sends that read exactly the range apply `u` writes and wait for
  // nothing else: they send what `u` leaves there.
  auto forwards = [&](int u) {
    std::vector<int> sends;
    const Piece& w = units[u].pieces[0];
    for (int v : units[u].next) {
      const Unit& s = units[v];
      if (s.kind == Unit::kSend && s.unmet == 1 && s.pieces[0].src_start == w.dst_start &&
          s.pieces[0].length == w.length) {
        sends.push_back(v);
      }
    }
    return sends;
  };
  auto hand = [&](const std::vector<int>& sends, std::unique_ptr<char[]> data, uint64_t bytes) {
    for (size_t i = 1; i < sends.size(); ++i) {
      std::unique_ptr<char[]> copy(new char[bytes]);
      std::memcpy(copy.get(), data.get(), bytes);
      made[sends[i]] = {std::move(copy), bytes};
    }
    if (!sends.empty()) made[sends[0]] = {std::move(data), bytes};
  };
  auto send = [&](int u) -> std::string {
    Unit& unit = units[u];
    const Piece& out = unit.pieces[0];
    const char* from = buf + out.src_start * itemsize;
    if (!codec) {
      const size_t peer = static_cast<size_t>(out.peer);
      if (posted.size() <= peer) posted.resize(peer + 1, 0);
      in_flight[out.peer].emplace_back(posted[peer]++, u);
      return transport.Post(unit.step, out.peer, from, out.length * itemsize, nullptr);
    }
    std::string err;
    auto it = made.find(u);
    if (it != made.end()) {
      const char* data = it->second.first.get();
      err = transport.Post(unit.step, out.peer, data, it->second.second,
                           std::move(it->second.first));
      made.erase(it);
    } else if (codec->Splits(from, out.length)) {
      err = codec->SendSplit(from, out.length, [&](std::unique_ptr<char[]> data, uint64_t bytes,
                                                   uint64_t bound, bool last) {
        return transport.PostPart(unit.step, out.peer, std::move(data), bytes, bound, last);
      });
    } else {
      std::unique_ptr<char[]> owned(new char[codec->MaxBytes(out.length)]);
      char* enc = owned.get();
      uint64_t bytes = 0;
      err = codec->Encode(from, out.length, enc, &bytes);
      if (err.empty()) err = transport.Post(unit.step, out.peer, enc, bytes, std::move(owned));
    }
    if (err.empty()) finish(u);
    return err;
  };
  auto apply = [&](int u) -> std::string {
    Unit& unit = units[u];
    const bool reduce = unit.kind == Unit::kReduce;
    char* own = buf + unit.pieces[0].dst_start * itemsize;
    const size_t n = static_cast<size_t>(unit.pieces[0].length);
    inputs.clear();
    sizes.clear();
    if (reduce && !codec) inputs.push_back(own);
    std::string err;
    for (const Piece& in : unit.pieces) {
      const char* data = nullptr;
      uint64_t bytes = 0;
      err = transport.View(unit.step, in.peer, &data, &bytes);
      if (err.empty() && !codec && bytes != n * itemsize) {
        err = transport.Peer(in.peer) + " sent " + std::to_string(bytes) + " bytes, expected " +
              std::to_string(n * itemsize);
      }
      if (!err.empty()) return err;
      inputs.push_back(data);
      sizes.push_back(bytes);
    }
    size_t bad = unit.pieces.size();
    if (!codec) {
      err = reduce ? kernels.Reduce(inputs.data(), inputs.size(), own, n)
                   : kernels.Copy(own, inputs[0], n * itemsize);
    } else if (reduce) {
      const std::vector<int> sends = forwards(u);
      std::unique_ptr<char[]> sum;
      uint64_t sum_bytes = 0;
      if (!sends.empty()) sum.reset(new char[codec->MaxBytes(n)]);
      err = codec->DecodeReduce(inputs.data(), sizes.data(), inputs.size(), own, n, kernels,
                                sum.get(), &sum_bytes, &bad);
      if (err.empty()) hand(sends, std::move(sum), sum_bytes);
    } else {
      bad = 0;
      err = codec->Decode(inputs[0], sizes[0], own, n);
      const std::vector<int> sends = forwards(u);
      if (err.empty() && !sends.empty()) {
        std::unique_ptr<char[]> copy(new char[sizes[0]]);
        std::memcpy(copy.get(), inputs[0], sizes[0]);
        hand(sends, std::move(copy), sizes[0]);
      }
    }
    if (!err.empty() && bad < unit.pieces.size()) {
      err = "the piece from " + transport.Peer(unit.pieces[bad].peer) + " does not decode: " + err;
    }
    for (const Piece& in : unit.pieces) transport.Release(unit.step, in.peer);
    if (err.empty()) finish(u);
    return err;
  };
  auto run = [&](int u) { return units[u].kind == Unit::kSend ? send(u) : apply(u); };

  for (size_t u = 0; u < units.size(); ++u) {
    if (units[u].unmet == 0 && units[u].missing == 0) ready.emplace(units[u].step, u);
  }
  auto deadline = Clock::now() + timeout;
  auto moved_at = Clock::now();  // when the call last moved: silence counts from then at most
  while (done < units.size()) {
    bool moved = false;
    while (!ready.empty()) {
      const int u = ready.top().second;
      ready.pop();
      std::string err = run(u);
      if (!err.empty()) return "step " + std::to_string(units[u].step) + ": " + err;
      moved = true;
    }
    uint64_t events = 0;
    arrived.clear();
    std::string err = transport.Sync(&arrived, &written, &events);
    if (!err.empty()) return err;
    for (const Arrival& a : arrived) {
      auto it = apply_of.find({a.step, a.src});
      if (it == apply_of.end() || !arrived_at.emplace(a.step, a.src).second) {
        return transport.Peer(a.src) + " sent a piece at step " + std::to_string(a.step) +
               " that the schedule does not have (or twice)";
      }
      Unit& unit = units[it->second];
      if (--unit.missing == 0 && unit.unmet == 0) ready.emplace(unit.step, it->second);
      moved = true;
    }
    for (auto& [peer, queue] : in_flight) {
      const int64_t left = static_cast<size_t>(peer) < written.size() ? written[peer] : 0;
      for (; !queue.empty() && queue.front().first < left; queue.pop_front()) {
        finish(queue.front().second);
        moved = true;
      }
    }
    if (!ready.empty() || done == units.size()) continue;
    while (first_pending < units.size() && finished[first_pending]) ++first_pending;
    // Every earlier unit is done, so this one waits for the network only: for
    // its pieces (an apply) or for its bytes to leave (a send).
    const Unit& stuck = units[first_pending];
    int peer = stuck.pieces[0].peer;
    for (const Piece& in : stuck.pieces) {
      if (stuck.kind != Unit::kSend && !arrived_at.count({stuck.step, in.peer})) {
        peer = in.peer;
        break;
      }
    }
    const std::string lost = transport.Lost(peer);
    const bool sending = stuck.kind == Unit::kSend;
    const std::string doing = sending ? "sending to " + transport.Peer(peer) :
                                           "waiting for the piece of " + transport.Peer(peer);
    if (!lost.empty()) return "step " + std::to_string(stuck.step) + ": lost " +
                              transport.Peer(peer) + " while " + doing + ": " + lost;
    // What the peer sent that no call here takes, for a failure's message.
    auto stray = [&] {
      const std::string s = transport.Stray(peer);
      return s.empty() ? s : "; " + s;
    };
    const auto now = Clock::now();
    auto wake = deadline;
    if (moved) {
      deadline = wake = now + timeout;
      moved_at = now;
    } else if (now >= deadline) {
      return "step " + std::to_string(stuck.step) + ": timed out after " +
             TimeoutText(timeout) + " " + doing +
             (sending ? ", which does not take it" : "") + " (JAXCC_TIMEOUT_S sets the limit)" +
             stray();
    }
    if (patience.count() > 0) {
      const auto silent = transport.Silent(peer, moved_at);
      if (silent >= patience) {
        using std::chrono::duration_cast;
        using std::chrono::milliseconds;
        return "step " + std::to_string(stuck.step) + ": stuck " + doing +
               ", whose process sent nothing for " +
               TimeoutText(duration_cast<milliseconds>(silent)) +
               " (stopped, or its link cut; the patience is " +
               TimeoutText(duration_cast<milliseconds>(patience)) +
               ": half this call site's period, at least 0.5 s)" + stray();
      }
      wake = std::min(wake, now + (patience - silent));
    }
    transport.Wait(events, wake);
  }
  return "";
}

}  // namespace jaxcc
