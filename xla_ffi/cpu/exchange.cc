// jaxcc_exchange_start / jaxcc_exchange_done on the CPU: a gossip exchange
// over the Tcp transport that outlives the program that starts it, and that a
// lost peer does not fail.
//
// start (operands: this rank's flat x, send_to and recv_from (int32, k slots
// each: a rank, or -1 for none), the rank (int32 scalar), and `after`, a value
// that only orders the call after what it comes from) registers what the rank
// receives, posts a copy of x (encoded with `codec`) to each send_to[j] as the
// piece of step j, and returns a handle (int32 scalar) at once: the pieces
// travel on the progress thread while the process computes. done (operands:
// m handles (int32) and an `after`) waits, for each exchange, for the piece of
// step j from each recv_from[j] and returns them as rows (m x k x n, x's
// type), with a status per slot (1: arrived, 0: none expected, -1: the peer's
// connection is lost, so its piece will not come) and, per rank, 1 if its
// process' connection is lost. Its wait is counted as blocked time
// (TcpBlockedNs). A peer silent for half the call site's period while done
// waits for it is dropped as stuck (exchange.h). A piece that does not come
// within `timeout_ms` while its peer's connection is up fails the call with a
// message naming the peer.
//
// Both are custom calls with side effects but no program-order token: XLA
// keeps them, data (the handle, `after`) orders them, and the program keeps
// XLA:CPU's asynchronous dispatch (a token makes jax run a program
// synchronously, measured 1.5x slower for the char transformer's step).
//
// The host path (exchange.h, module.cc) runs the same two halves from host
// callbacks, so programs of any backend exchange through host memory.
//
// Bytes per call: x.nbytes (encoded: its encoded size) to each send_to slot;
// one step. Sender and receiver must use the same slot j for a pair (gossip
// graphs number a phase's shifts); `digest` (from x's length, type and codec)
// makes a mismatch an error rather than a wrong answer.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "exchange.h"
#include "piece_codec.h"
#include "tcp.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jaxcc {
namespace {

struct InFlight {
  std::unique_ptr<TcpTransport> transport;
  std::unique_ptr<HostPieceCodec> codec;
  std::vector<int> recv_from;
  int rank;
  int64_t op_id;
  std::chrono::milliseconds timeout;
};

std::mutex g_mu;
uint32_t g_next_handle = 0;  // handles wrap within int32's positive range
std::map<int32_t, InFlight> g_in_flight;

std::string CheckSlots(ffi::Span<const int32_t> slots, const char* name, int64_t nranks,
                       int rank) {
  for (size_t j = 0; j < slots.size(); ++j) {
    const int32_t r = slots[j];
    if (r < -1 || r >= nranks || r == rank) {
      return std::string(name) + "[" + std::to_string(j) + "] = " + std::to_string(r) +
             " is neither -1 nor another of the " + std::to_string(nranks) + " ranks";
    }
  }
  return "";
}

}  // namespace

ffi::Error ExchangeStart(const char* data, size_t n, size_t itemsize, ffi::DataType codec_type,
                         ffi::Span<const int32_t> sends, ffi::Span<const int32_t> recvs,
                         int rank, int64_t nranks, int64_t op_id, int64_t digest,
                         ffi::Span<const int64_t> procs, int64_t codec_id, int64_t timeout_ms,
                         int32_t* handle) {
  const std::string what = "jaxcc gossip exchange (op " + std::to_string(op_id) + ")";
  std::string err;
  if (procs.size() != static_cast<size_t>(nranks) || rank < 0 || rank >= nranks) {
    err = "rank " + std::to_string(rank) + " of " + std::to_string(nranks) + " with a process " +
          "map of " + std::to_string(procs.size()) + " entries";
  }
  if (err.empty() && sends.size() != recvs.size()) {
    err = std::to_string(sends.size()) + " send_to slots and " + std::to_string(recvs.size()) +
          " recv_from slots";
  }
  if (err.empty()) err = CheckSlots(sends, "send_to", nranks, rank);
  if (err.empty()) err = CheckSlots(recvs, "recv_from", nranks, rank);
  if (err.empty() && timeout_ms <= 0) err = "timeout_ms must be > 0";
  InFlight flight{nullptr, nullptr, std::vector<int>(recvs.begin(), recvs.end()), rank, op_id,
                  std::chrono::milliseconds(timeout_ms)};
  if (!err.empty()) return ffi::Error::InvalidArgument(what + ": " + err);
  ffi::Error bad = NewHostPieceCodec(what, codec_id, codec_type, 0, &flight.codec);
  if (!bad.success()) return bad;

  TcpReceives receives;
  receives.encoded = flight.codec != nullptr;
  for (size_t j = 0; j < recvs.size(); ++j) {
    if (recvs[j] >= 0) {
      receives.bytes[{static_cast<int64_t>(j), recvs[j]}] =
          flight.codec ? flight.codec->MaxWireBytes(n) : n * itemsize;
    }
  }
  err = TcpTransport::Create(op_id, 0, static_cast<int>(nranks), rank, procs.begin(), nullptr,
                             digest, std::move(receives), &flight.transport);
  for (size_t j = 0; err.empty() && j < sends.size(); ++j) {
    const int peer = sends[j];
    if (peer < 0) continue;
    if (!flight.transport->Lost(peer).empty()) continue;  // its piece would not arrive
    uint64_t bytes = n * itemsize;
    std::unique_ptr<char[]> copy;
    if (flight.codec) {
      copy.reset(new char[flight.codec->MaxBytes(n)]);
      err = flight.codec->Encode(data, n, copy.get(), &bytes);
      if (!err.empty()) break;
    } else {
      copy.reset(new char[bytes > 0 ? bytes : 1]);
      std::memcpy(copy.get(), data, bytes);
    }
    const char* payload = copy.get();
    // A connection lost meanwhile refuses the piece: the peer is lost, not the call.
    flight.transport->Post(static_cast<int64_t>(j), peer, payload, bytes, std::move(copy));
  }
  if (!err.empty()) {
    if (flight.transport) flight.transport->Fail(err);
    return ffi::Error::Internal(what + ", rank " + std::to_string(rank) + ": " + err);
  }
  std::lock_guard<std::mutex> lock(g_mu);
  const int32_t h = static_cast<int32_t>(g_next_handle++ & 0x7fffffffu);
  g_in_flight.emplace(h, std::move(flight));
  *handle = h;
  return ffi::Error::Success();
}

namespace {

// Finishes one exchange into `out` (its k rows) and `st` (its k statuses). A
// peer whose process sends no byte for `patience` (none if zero) from
// `entered` on, while its piece is missing, is stuck: its connection is
// dropped and its slot lost.
std::string Finish(InFlight& flight, char* out, size_t row_bytes, size_t itemsize, int32_t* st,
                   std::chrono::nanoseconds patience,
                   std::chrono::steady_clock::time_point entered) {
  TcpTransport& t = *flight.transport;
  const size_t k = flight.recv_from.size();
  std::memset(out, 0, k * row_bytes);
  size_t waiting = 0;
  for (size_t j = 0; j < k; ++j) {
    st[j] = flight.recv_from[j] >= 0 ? 2 : 0;  // 2: not yet arrived
    waiting += st[j] == 2;
  }
  std::string err;
  const auto deadline = std::chrono::steady_clock::now() + flight.timeout;
  std::vector<Arrival> arrived;
  std::vector<int64_t> written;
  while (err.empty() && waiting > 0) {
    uint64_t events = 0;
    arrived.clear();
    err = t.Sync(&arrived, &written, &events);
    for (const Arrival& a : arrived) {
      const size_t j = static_cast<size_t>(a.step);
      if (!err.empty() || j >= k || st[j] != 2 || flight.recv_from[j] != a.src) continue;
      const char* data;
      uint64_t bytes;
      err = t.View(a.step, a.src, &data, &bytes);
      if (err.empty() && flight.codec) {
        err = flight.codec->Decode(data, bytes, out + j * row_bytes, row_bytes / itemsize);
      } else if (err.empty() && bytes != row_bytes) {
        err = t.Peer(a.src) + " sent " + std::to_string(bytes) + " bytes, not " +
              std::to_string(row_bytes);
      } else if (err.empty()) {
        std::memcpy(out + j * row_bytes, data, bytes);
      }
      t.Release(a.step, a.src);
      st[j] = 1;
      --waiting;
    }
    for (size_t j = 0; err.empty() && j < k; ++j) {
      if (st[j] == 2 && !t.Lost(flight.recv_from[j]).empty()) {
        st[j] = -1;  // its piece will not come: a lost message, not an error
        --waiting;
      }
    }
    auto wake = deadline;
    for (size_t j = 0; err.empty() && patience.count() > 0 && j < k; ++j) {
      if (st[j] != 2) continue;
      const auto silent = t.Silent(flight.recv_from[j], entered);
      if (silent < patience) {
        wake = std::min(wake, std::chrono::steady_clock::now() + (patience - silent));
        continue;
      }
      const auto ms = [](std::chrono::nanoseconds d) {
        return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) +
               " ms";
      };
      t.Drop(flight.recv_from[j], t.Peer(flight.recv_from[j]) + " sent nothing for " +
                                      ms(silent) + " while gossip exchange op " +
                                      std::to_string(flight.op_id) + " waited for its piece: " +
                                      "stuck past " + ms(patience) + ", half the exchange's " +
                                      "period; dropped");
      st[j] = -1;
      --waiting;
    }
    if (!err.empty() || waiting == 0) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      for (size_t j = 0; j < k && err.empty(); ++j) {
        if (st[j] != 2) continue;
        const std::string stray = t.Stray(flight.recv_from[j]);
        err = "timed out after " + std::to_string(flight.timeout.count()) + " ms waiting for " +
              t.Peer(flight.recv_from[j]) + " (JAXCC_TIMEOUT_S sets the limit)" +
              (stray.empty() ? "" : "; it sent " + stray);
      }
      break;
    }
    t.Wait(events, wake);
  }
  if (!err.empty()) t.Fail(err);
  return err;
}

}  // namespace

ffi::Error ExchangeDone(ffi::Span<const int32_t> handles, char* out, size_t out_bytes,
                        size_t itemsize, int32_t* status, size_t status_count, int32_t* lost,
                        size_t nlost) {
  const auto start = std::chrono::steady_clock::now();
  const size_t m = handles.size();
  std::vector<InFlight> flights(m);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (size_t i = 0; i < m; ++i) {
      auto it = g_in_flight.find(handles[i]);
      if (it == g_in_flight.end()) {
        return ffi::Error::InvalidArgument("jaxcc gossip exchange: no exchange in flight has "
                                           "handle " + std::to_string(handles[i]));
      }
      flights[i] = std::move(it->second);
      g_in_flight.erase(it);
    }
  }
  // The call site is the done's first exchange; its period runs from done to done.
  const std::chrono::nanoseconds patience =
      m ? TcpStuckPatience(flights[0].op_id, 0, flights[0].rank, start)
        : std::chrono::nanoseconds(0);
  const size_t k = m ? flights[0].recv_from.size() : 0;
  if (m && status_count != m * k) {
    return ffi::Error::InvalidArgument("jaxcc gossip exchange: " + std::to_string(m) +
                                       " exchanges of " + std::to_string(k) + " slots for " +
                                       std::to_string(status_count) + " statuses");
  }
  const size_t row_bytes = m && k ? out_bytes / (m * k) : 0;
  std::string err;
  for (size_t i = 0; i < m && err.empty(); ++i) {
    err = Finish(flights[i], out + i * k * row_bytes, row_bytes, itemsize, status + i * k,
                 patience, start);
    if (!err.empty()) {
      err = "jaxcc gossip exchange (op " + std::to_string(flights[i].op_id) + "): " + err;
    }
  }
  TcpAddBlocked(std::chrono::steady_clock::now() - start);
  if (!err.empty()) return ffi::Error::Internal(err);
  for (size_t r = 0; r < nlost; ++r) {
    lost[r] = m && !flights[0].transport->Lost(static_cast<int>(r)).empty() ? 1 : 0;
  }
  return ffi::Error::Success();
}

namespace {

ffi::Error StartImpl(ffi::AnyBuffer x, ffi::Buffer<ffi::S32> send_to,
                     ffi::Buffer<ffi::S32> recv_from, ffi::Buffer<ffi::S32> rank,
                     ffi::AnyBuffer, ffi::Result<ffi::Buffer<ffi::S32>> handle,
                     int64_t nranks, int64_t op_id, int64_t digest,
                     ffi::Span<const int64_t> procs, int64_t codec_id, int64_t dtype_id,
                     int64_t timeout_ms) {
  return ExchangeStart(
      static_cast<const char*>(x.untyped_data()), x.element_count(),
      ffi::ByteWidth(x.element_type()),
      dtype_id ? static_cast<ffi::DataType>(dtype_id) : x.element_type(),
      ffi::Span<const int32_t>(send_to.typed_data(), send_to.element_count()),
      ffi::Span<const int32_t>(recv_from.typed_data(), recv_from.element_count()),
      rank.typed_data()[0], nranks, op_id, digest, procs, codec_id, timeout_ms,
      handle->typed_data());
}

ffi::Error DoneImpl(ffi::Buffer<ffi::S32> handles, ffi::AnyBuffer,
                    ffi::Result<ffi::AnyBuffer> received,
                    ffi::Result<ffi::Buffer<ffi::S32>> status,
                    ffi::Result<ffi::Buffer<ffi::S32>> lost) {
  return ExchangeDone(ffi::Span<const int32_t>(handles.typed_data(), handles.element_count()),
                      static_cast<char*>(received->untyped_data()), received->size_bytes(),
                      ffi::ByteWidth(received->element_type()), status->typed_data(),
                      status->element_count(), lost->typed_data(), lost->element_count());
}

}  // namespace
}  // namespace jaxcc

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxccExchangeStart, jaxcc::StartImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()           // x: this rank's flat vector
                                  .Arg<ffi::Buffer<ffi::S32>>()    // send_to (k)
                                  .Arg<ffi::Buffer<ffi::S32>>()    // recv_from (k)
                                  .Arg<ffi::Buffer<ffi::S32>>()    // rank along the axis
                                  .Arg<ffi::AnyBuffer>()           // after: ordering only
                                  .Ret<ffi::Buffer<ffi::S32>>()    // handle
                                  .Attr<int64_t>("nranks")
                                  .Attr<int64_t>("op_id")
                                  .Attr<int64_t>("digest")
                                  .Attr<ffi::Span<const int64_t>>("procs")  // rank -> process
                                  .Attr<int64_t>("codec")   // 0: raw, else codec id
                                  .Attr<int64_t>("dtype")   // 0: x's, else the elements'
                                  .Attr<int64_t>("timeout_ms"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxccExchangeDone, jaxcc::DoneImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S32>>()    // handles (m)
                                  .Arg<ffi::AnyBuffer>()           // after: ordering only
                                  .Ret<ffi::AnyBuffer>()           // received (m x k x n)
                                  .Ret<ffi::Buffer<ffi::S32>>()    // status (m x k)
                                  .Ret<ffi::Buffer<ffi::S32>>());  // lost (nranks)
