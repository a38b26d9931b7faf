// jaxcc_collective on the CPU: one custom call runs one whole collective by
// walking its Schedule over a transport, with jaxcc_reduce's kernel for the
// sums: InProcess (steps one after another, jaxcc/transport.h: RunSchedule)
// when every rank of the group lives in this process, Tcp (steps overlapped,
// jaxcc/dataflow.h: RunDataflow) when they span processes (`procs`).
//
// Operands: the program-order token (jaxcc's ordered effect: XLA threads it
// through every jaxcc collective, so they run in program order on every
// device), the rank's flat buffer (aliased with the result, so the schedule
// runs in place) and its rank and group (int32 scalars from lax.axis_index).
// Attributes `procs` (groups x nranks: the process of each rank of each group;
// empty with one process) and `pacing` (nranks x nranks bytes/s per ordered
// rank pair; empty: unpaced) and `codec` (0: raw pieces, else the codec id of
// jaxcc/codec.h every piece travels in: piece_codec.h) are for the Tcp
// transport; devices of one process read each other's memory, so InProcess
// never encodes. `dtype` (0: x's own) is the XLA FFI type of the elements
// when x holds their bits: floats travel as unsigned words, which XLA:CPU
// moves without converting them (it moves bf16 through f32, quieting NaN
// payloads and flushing subnormals). `timeout_ms` bounds every wait
// (JAXCC_TIMEOUT_S); on Tcp a peer silent (no bytes, not even the transport's
// beats) for half the call site's period, at least 0.5 s, while a wait waits
// for it fails the call as stuck, naming it (tcp.h: TcpStuckPatience).
// Pieces of at least `split_send_bytes` raw bytes may be sent split
// (piece_codec.h; JAXCC_SPLIT_SEND_BYTES, 0: never).
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "inprocess.h"
#include "jaxcc/dataflow.h"
#include "jaxcc/schedule.h"
#include "jaxcc/transport.h"
#include "piece_codec.h"
#include "reduce_host.h"
#include "tcp.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jaxcc {
namespace {

// Runs `run` unless joining failed (`err`); a failure is told to the peers.
template <typename T, typename F>
std::string RunOn(std::string err, T* transport, F run) {
  if (err.empty()) err = run(*transport);
  if (!err.empty() && transport) transport->Fail(err);
  return err;
}

// Whether every rank of the group is on this process (or there is one process).
bool AllLocal(ffi::Span<const int64_t> procs, int64_t group, int64_t nranks) {
  if (procs.size() == 0) return true;
  const int me = TcpProcess();
  for (int64_t r = 0; r < nranks; ++r) {
    if (procs[group * nranks + r] != me) return false;
  }
  return true;
}

ffi::Error CollectiveImpl(ffi::RunId run_id, ffi::Token, ffi::AnyBuffer x,
                          ffi::Buffer<ffi::S32> rank_buf, ffi::Buffer<ffi::S32> group_buf,
                          ffi::Result<ffi::Token>, ffi::Result<ffi::AnyBuffer> y,
                          ffi::Span<const int64_t> table, int64_t num_steps, int64_t nranks,
                          int64_t op_id, int64_t digest, std::string_view name,
                          ffi::Span<const int64_t> procs, ffi::Span<const int64_t> pacing,
                          int64_t codec_id, int64_t dtype_id, int64_t timeout_ms,
                          int64_t split_send_bytes) {
  const std::string what = "jaxcc " + std::string(name) + " (op " + std::to_string(op_id) + ")";
  const ffi::DataType dtype =
      dtype_id ? static_cast<ffi::DataType>(dtype_id) : x.element_type();
  if (ffi::ByteWidth(dtype) != ffi::ByteWidth(x.element_type())) {
    return ffi::Error::InvalidArgument(what + ": dtype " + std::to_string(dtype_id) +
                                       " is not as wide as the buffer's elements");
  }
  const int rank = rank_buf.typed_data()[0];
  const int64_t group = group_buf.typed_data()[0];
  const size_t itemsize = ffi::ByteWidth(x.element_type());
  const int64_t length = static_cast<int64_t>(x.element_count());
  char* buf = static_cast<char*>(y->untyped_data());
  if (buf != x.untyped_data()) std::memcpy(buf, x.untyped_data(), length * itemsize);

  std::vector<RankStep> plan;
  std::string err = PlanRank(table.begin(), table.size(), num_steps, static_cast<int>(nranks),
                             rank, length, &plan);
  if (err.empty() && procs.size() != 0 &&
      (group < 0 || static_cast<size_t>((group + 1) * nranks) > procs.size())) {
    err = "group " + std::to_string(group) + " has no row in the process map of " +
          std::to_string(procs.size()) + " entries";
  }
  if (err.empty() && pacing.size() != 0 && pacing.size() != static_cast<size_t>(nranks * nranks)) {
    err = "pacing has " + std::to_string(pacing.size()) + " rates, not one per rank pair";
  }
  if (err.empty() && (timeout_ms <= 0 || split_send_bytes < 0)) {
    err = "timeout_ms " + std::to_string(timeout_ms) + " must be > 0 and split_send_bytes " +
          std::to_string(split_send_bytes) + " >= 0";
  }
  if (!err.empty()) return ffi::Error::InvalidArgument(what + ": " + err);
  std::unique_ptr<HostPieceCodec> codec;
  ffi::Error bad = NewHostPieceCodec(what, codec_id, dtype,
                                     static_cast<uint64_t>(split_send_bytes), &codec);
  if (!bad.success()) return bad;

  const std::chrono::milliseconds timeout(timeout_ms);
  HostKernels kernels(dtype);
  if (AllLocal(procs, group, nranks)) {
    const InProcessTransport::Key key{run_id.run_id, op_id, group,
                                      InProcessTransport::NextInstance(run_id.run_id, op_id,
                                                                       group, rank)};
    std::unique_ptr<InProcessTransport> transport;
    err = InProcessTransport::Join(key, static_cast<int>(nranks), rank, buf, digest, timeout,
                                   what, &transport);
    err = RunOn(err, transport.get(), [&](InProcessTransport& t) {
      return RunSchedule(plan, t, kernels, buf, itemsize);
    });
  } else {
    // What each piece this rank receives may take on the wire.
    TcpReceives receives;
    receives.encoded = codec != nullptr;
    for (size_t s = 0; s < plan.size(); ++s) {
      for (const auto* pieces : {&plan[s].copies, &plan[s].reduces}) {
        for (const Piece& in : *pieces) {
          const size_t n = static_cast<size_t>(in.length);
          receives.bytes[{static_cast<int64_t>(s), in.peer}] =
              codec ? codec->MaxWireBytes(n) : n * itemsize;
        }
      }
    }
    const auto started = std::chrono::steady_clock::now();
    std::unique_ptr<TcpTransport> transport;
    err = TcpTransport::Create(op_id, group, static_cast<int>(nranks), rank,
                               procs.begin() + group * nranks,
                               pacing.size() ? pacing.begin() : nullptr, digest,
                               std::move(receives), &transport);
    const auto patience = TcpStuckPatience(op_id, group, rank, started);
    err = RunOn(err, transport.get(), [&](TcpTransport& t) {
      return RunDataflow(plan, length, t, kernels, codec.get(), buf, itemsize, timeout,
                         patience);
    });
    TcpAddBlocked(std::chrono::steady_clock::now() - started);
  }
  if (!err.empty()) {
    return ffi::Error::Internal(what + ", rank " + std::to_string(rank) + ": " + err);
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxcc

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxccCollective, jaxcc::CollectiveImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::RunId>()
                                  .Arg<ffi::Token>()                 // program order in
                                  .Arg<ffi::AnyBuffer>()             // x: this rank's flat buffer
                                  .Arg<ffi::Buffer<ffi::S32>>()      // rank along the axis
                                  .Arg<ffi::Buffer<ffi::S32>>()      // group: which axis instance
                                  .Ret<ffi::Token>()                 // program order out
                                  .Ret<ffi::AnyBuffer>()             // y: the result, aliases x
                                  .Attr<ffi::Span<const int64_t>>("table")
                                  .Attr<int64_t>("num_steps")
                                  .Attr<int64_t>("nranks")
                                  .Attr<int64_t>("op_id")
                                  .Attr<int64_t>("digest")
                                  .Attr<std::string_view>("name")
                                  .Attr<ffi::Span<const int64_t>>("procs")    // rank -> process
                                  .Attr<ffi::Span<const int64_t>>("pacing")   // bytes/s per pair
                                  .Attr<int64_t>("codec")    // 0: raw, else codec id
                                  .Attr<int64_t>("dtype")    // 0: x's, else the elements'
                                  .Attr<int64_t>("timeout_ms")          // every wait's limit
                                  .Attr<int64_t>("split_send_bytes"));  // 0: never split
