// jaxcc_collective on the GPU: one custom call runs one whole collective by
// walking its Schedule (jaxcc/transport.h: RunSchedule) over the Nccl
// transport, with jaxcc_reduce's kernels for the sums, everything enqueued on
// XLA's stream.
//
// Operands and attributes are those of the CPU handler (xla_ffi/cpu/
// collective.cc, but `codec`, `dtype` and `split_send_bytes`, which only the
// Tcp transport uses) plus `comm_key`: the communicators of one (mesh, axis), made
// by jaxcc/_src/nccl_bootstrap.py, one per local device, registered under
// (comm_key, device ordinal). Each device is in exactly one instance of the
// axis, so the communicator also gives its rank: the rank and group operands
// live in device memory and are not read. `procs` and `pacing` are ignored.
//
// Per step a rank posts, in one ncclGroupStart/End, an ncclSend of every piece
// it sends (straight from its buffer) and an ncclRecv of every piece it gets
// (into one device staging area, reused by every step: stream order makes that
// safe); copies (cudaMemcpyAsync) and the reduce kernel follow on the stream.
// Pieces between one pair are posted in (src_start, dst_start, length) order
// on both sides, so NCCL matches them. libnccl.so.2 is dlopened at first use:
// the module loads without it. Communicators are nonblocking, so no host wait
// hangs: each polls ncclCommGetAsyncError up to `timeout_ms`
// (JAXCC_TIMEOUT_S), then aborts the communicator.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "jaxcc/schedule.h"
#include "jaxcc/transport.h"
#include "nccl_comms.h"
#include "reduce_cuda.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jaxcc {
namespace {

// --- libnccl, loaded at first use --------------------------------------------

struct NcclApi {
  decltype(&::ncclGetUniqueId) GetUniqueId = nullptr;
  decltype(&::ncclCommInitRankConfig) CommInitRankConfig = nullptr;
  decltype(&::ncclGroupStart) GroupStart = nullptr;
  decltype(&::ncclGroupEnd) GroupEnd = nullptr;
  decltype(&::ncclSend) Send = nullptr;
  decltype(&::ncclRecv) Recv = nullptr;
  decltype(&::ncclCommDestroy) CommDestroy = nullptr;
  decltype(&::ncclCommAbort) CommAbort = nullptr;
  decltype(&::ncclGetErrorString) GetErrorString = nullptr;
  decltype(&::ncclCommGetAsyncError) CommGetAsyncError = nullptr;
};

std::mutex load_mu;
NcclApi* api = nullptr;  // set once, under load_mu; never freed
std::string load_error;

template <typename F>
bool Resolve(void* lib, const char* name, F* fn, std::string* missing) {
  *fn = reinterpret_cast<F>(dlsym(lib, name));
  if (*fn == nullptr) *missing += std::string(missing->empty() ? "" : ", ") + name;
  return *fn != nullptr;
}

// The API, or nullptr with *err set.
const NcclApi* Api(std::string* err) {
  std::lock_guard<std::mutex> lock(load_mu);
  if (api == nullptr) *err = load_error.empty() ? "libnccl.so.2 was never loaded" : load_error;
  return api;
}

std::string NcclMessage(const NcclApi& nccl, ncclResult_t r) {
  return std::string(nccl.GetErrorString ? nccl.GetErrorString(r) : "?") + " (ncclResult " +
         std::to_string(static_cast<int>(r)) + ")";
}

std::string CudaMessage(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

// Polls comm until its pending NCCL operation has left ncclInProgress, up to
// `timeout`. Empty on success; else the caller must abort the communicator.
std::string WaitComm(const NcclApi& nccl, ncclComm_t comm, std::chrono::milliseconds timeout,
                     const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::microseconds(1);
  while (true) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = nccl.CommGetAsyncError(comm, &state);
    if (r != ncclSuccess) state = r;
    if (state == ncclSuccess) return "";
    if (state != ncclInProgress) {
      return std::string(what) + " failed: " + NcclMessage(nccl, state);
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return std::string(what) + " did not finish within " + TimeoutText(timeout) +
             " (JAXCC_TIMEOUT_S); a peer is missing or stuck";
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

// --- communicator registry -----------------------------------------------------

struct Comm {
  ncclComm_t comm = nullptr;
  int rank = 0;
  int nranks = 0;
  std::string broken;  // why it was aborted; empty while usable
  std::mutex mu;       // one collective at a time per communicator
};

std::mutex registry_mu;
std::map<std::pair<int64_t, int>, Comm*>& Registry() {  // never freed: outlives XLA's threads
  static auto* registry = new std::map<std::pair<int64_t, int>, Comm*>();
  return *registry;
}

Comm* FindComm(int64_t key, int ordinal) {
  std::lock_guard<std::mutex> lock(registry_mu);
  auto it = Registry().find({key, ordinal});
  return it == Registry().end() ? nullptr : it->second;
}

// --- the transport and the kernels -----------------------------------------------

class NcclTransport final : public Transport {
 public:
  NcclTransport(const NcclApi& nccl, Comm& comm, cudaStream_t stream, char* buf, size_t itemsize,
                char* staging, std::chrono::milliseconds timeout)
      : nccl_(nccl), comm_(comm), stream_(stream), buf_(buf), itemsize_(itemsize),
        staging_(staging), timeout_(timeout) {}

  // Bytes of staging a plan needs: the largest step's received pieces, each
  // 256-byte aligned (the reduce kernel's vector loads want 16).
  static size_t StagingBytes(const std::vector<RankStep>& plan, size_t itemsize) {
    size_t most = 0;
    for (const RankStep& step : plan) {
      size_t bytes = 0;
      for (const auto* list : {&step.copies, &step.reduces}) {
        for (const Piece& in : *list) bytes += Align(in.length * itemsize);
      }
      most = std::max(most, bytes);
    }
    return most;
  }

  std::string Publish(int64_t step, const RankStep& plan) override {
    std::vector<Piece> sends = plan.sends;
    std::sort(sends.begin(), sends.end(), PairOrder);
    received_.clear();
    for (const auto* list : {&plan.copies, &plan.reduces}) {
      for (const Piece& in : *list) received_.push_back({in, nullptr, false});
    }
    std::sort(received_.begin(), received_.end(),
              [](const Slot& a, const Slot& b) { return PairOrder(a.piece, b.piece); });
    size_t offset = 0;
    for (Slot& slot : received_) {
      slot.view = staging_ + offset;
      offset += Align(slot.piece.length * itemsize_);
    }
    std::string err = Check(nccl_.GroupStart(), "ncclGroupStart");
    if (!err.empty()) return err;
    for (const Piece& out : sends) {
      if (!err.empty()) break;
      err = Check(nccl_.Send(buf_ + out.src_start * itemsize_, out.length * itemsize_, ncclUint8,
                             out.peer, comm_.comm, stream_),
                  "ncclSend to rank " + std::to_string(out.peer));
    }
    for (const Slot& slot : received_) {
      if (!err.empty()) break;
      err = Check(nccl_.Recv(slot.view, slot.piece.length * itemsize_, ncclUint8, slot.piece.peer,
                             comm_.comm, stream_),
                  "ncclRecv from rank " + std::to_string(slot.piece.peer));
    }
    const ncclResult_t end = nccl_.GroupEnd();  // always, to close the group
    if (!err.empty()) return err;
    if (end == ncclInProgress) {
      return WaitComm(nccl_, comm_.comm, timeout_,
                      ("step " + std::to_string(step) + " send/receive").c_str());
    }
    return Check(end, "ncclGroupEnd");
  }

  std::string Receive(int64_t step, const Piece& piece, size_t, const char** view) override {
    for (Slot& slot : received_) {
      const Piece& p = slot.piece;
      if (!slot.taken && p.peer == piece.peer && p.src_start == piece.src_start &&
          p.dst_start == piece.dst_start && p.length == piece.length) {
        slot.taken = true;
        *view = slot.view;
        return "";
      }
    }
    return "no receive posted for a piece from rank " + std::to_string(piece.peer) + " in step " +
           std::to_string(step);
  }

  // Stream order: later kernels and sends run after these receives and sends.
  std::string ReceivesDone(int64_t) override { return ""; }
  std::string SendsDone(int64_t, const RankStep&) override { return ""; }

  // The peers may be mid-step: the communicator cannot be trusted again, so it
  // is marked broken and aborted (its only abort).
  void Fail(const std::string& error) override {
    comm_.broken = error;
    nccl_.CommAbort(comm_.comm);
  }

 private:
  struct Slot {
    Piece piece;
    char* view;
    bool taken;
  };

  static size_t Align(size_t bytes) { return (bytes + 255) / 256 * 256; }
  static bool PairOrder(const Piece& a, const Piece& b) {
    return std::tie(a.peer, a.src_start, a.dst_start, a.length) <
           std::tie(b.peer, b.src_start, b.dst_start, b.length);
  }
  std::string Check(ncclResult_t r, const std::string& what) {
    if (r == ncclSuccess || r == ncclInProgress) return "";
    return what + ": " + NcclMessage(nccl_, r);
  }

  const NcclApi& nccl_;
  Comm& comm_;
  cudaStream_t stream_;
  char* buf_;
  size_t itemsize_;
  char* staging_;
  std::chrono::milliseconds timeout_;
  std::vector<Slot> received_;
};

class CudaKernels final : public Kernels {
 public:
  CudaKernels(cudaStream_t stream, ffi::ScratchAllocator& scratch, ffi::DataType dtype)
      : stream_(stream), scratch_(scratch), dtype_(dtype) {}
  std::string Copy(char* dst, const char* src, size_t bytes) override {
    if (dst == src || bytes == 0) return "";
    const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_);
    return e == cudaSuccess ? "" : "cudaMemcpyAsync: " + CudaMessage(e);
  }
  std::string Reduce(const char* const* inputs, size_t k, char* out, size_t n) override {
    const std::vector<const void*> in(inputs, inputs + k);
    ffi::Error err = ReduceOnCudaStream(stream_, scratch_, dtype_, in, out, n);
    return err.success() ? "" : err.message();
  }

 private:
  cudaStream_t stream_;
  ffi::ScratchAllocator& scratch_;
  ffi::DataType dtype_;
};

// --- the handler -------------------------------------------------------------------

ffi::Error CollectiveImpl(cudaStream_t stream, ffi::ScratchAllocator scratch, int32_t ordinal,
                          ffi::Token, ffi::AnyBuffer x, ffi::Buffer<ffi::S32>,
                          ffi::Buffer<ffi::S32>, ffi::Result<ffi::Token>, ffi::Result<ffi::AnyBuffer> y,
                          ffi::Span<const int64_t> table, int64_t num_steps, int64_t nranks,
                          int64_t op_id, int64_t, std::string_view name, ffi::Span<const int64_t>,
                          ffi::Span<const int64_t>, int64_t comm_key, int64_t timeout_ms) {
  const std::string what = "jaxcc " + std::string(name) + " (op " + std::to_string(op_id) +
                           ", device " + std::to_string(ordinal) + ")";
  auto fail = [&](const std::string& msg) { return ffi::Error::Internal(what + ": " + msg); };
  std::string err;
  const NcclApi* nccl = Api(&err);
  if (nccl == nullptr) return ffi::Error(ffi::ErrorCode::kFailedPrecondition, what + ": " + err);
  Comm* comm = FindComm(comm_key, ordinal);
  if (comm == nullptr) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      what + ": no NCCL communicator for key " + std::to_string(comm_key) +
                          " on this device; jaxcc/_src/nccl_bootstrap.py creates them when the "
                          "collective is lowered");
  }
  std::lock_guard<std::mutex> lock(comm->mu);
  const std::string who = ", rank " + std::to_string(comm->rank);
  if (!comm->broken.empty()) return fail("communicator unusable" + who + ": " + comm->broken);
  if (timeout_ms <= 0) {
    return ffi::Error::InvalidArgument(what + ": timeout_ms " + std::to_string(timeout_ms) +
                                       " must be > 0");
  }
  if (comm->nranks != nranks) {
    return ffi::Error::InvalidArgument(what + ": the communicator has " +
                                       std::to_string(comm->nranks) + " ranks, the schedule " +
                                       std::to_string(nranks));
  }

  const size_t itemsize = ffi::ByteWidth(x.element_type());
  const int64_t length = static_cast<int64_t>(x.element_count());
  char* buf = static_cast<char*>(y->untyped_data());
  cudaError_t ce = cudaSuccess;
  if (buf != x.untyped_data() && length > 0) {
    ce = cudaMemcpyAsync(buf, x.untyped_data(), length * itemsize, cudaMemcpyDeviceToDevice,
                         stream);
  }
  if (ce != cudaSuccess) return fail("cudaMemcpyAsync" + who + ": " + CudaMessage(ce));

  std::vector<RankStep> plan;
  err = PlanRank(table.begin(), table.size(), num_steps, static_cast<int>(nranks), comm->rank,
                 length, &plan);
  if (!err.empty()) return ffi::Error::InvalidArgument(what + who + ": " + err);

  char* staging = nullptr;
  const size_t staging_bytes = NcclTransport::StagingBytes(plan, itemsize);
  if (staging_bytes > 0) {
    std::optional<void*> mem = scratch.Allocate(staging_bytes, 256);
    if (!mem.has_value() || *mem == nullptr) {
      return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                        what + who + ": cannot allocate " + std::to_string(staging_bytes) +
                            " bytes of receive staging");
    }
    staging = static_cast<char*>(*mem);
  }
  NcclTransport transport(*nccl, *comm, stream, buf, itemsize, staging,
                          std::chrono::milliseconds(timeout_ms));
  CudaKernels kernels(stream, scratch, x.element_type());
  err = RunSchedule(plan, transport, kernels, buf, itemsize);
  if (err.empty()) {
    ce = cudaGetLastError();
    if (ce != cudaSuccess) err = CudaMessage(ce);
  }
  if (err.empty()) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = nccl->CommGetAsyncError(comm->comm, &state);
    if (r != ncclSuccess) state = r;
    if (state != ncclSuccess && state != ncclInProgress) {
      err = "asynchronous NCCL error: " + NcclMessage(*nccl, state);
    }
  }
  if (!err.empty()) {
    transport.Fail(err);
    return fail(err.rfind("step ", 0) == 0 ? "rank " + std::to_string(comm->rank) + ", " + err
                                           : err + who);
  }
  return ffi::Error::Success();
}

}  // namespace

// --- the Python-facing functions (nccl_comms.h) ---------------------------------------

std::string NcclLoad(const std::vector<std::string>& paths) {
  std::lock_guard<std::mutex> lock(load_mu);
  if (api != nullptr) return "";
  std::vector<std::string> names{"libnccl.so.2"};
  names.insert(names.end(), paths.begin(), paths.end());
  void* lib = nullptr;
  std::string tried;
  for (const std::string& name : names) {
    lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) break;
    const char* e = dlerror();
    tried += "\n  " + name + ": " + (e ? e : "not found");
  }
  if (lib == nullptr) {
    load_error = "cannot load the NCCL library (the Nccl transport needs libnccl.so.2, e.g. from "
                 "pip install nvidia-nccl-cu13 or jax[cuda13]):" + tried;
    return load_error;
  }
  auto* a = new NcclApi();
  std::string missing;
  Resolve(lib, "ncclGetUniqueId", &a->GetUniqueId, &missing);
  Resolve(lib, "ncclCommInitRankConfig", &a->CommInitRankConfig, &missing);
  Resolve(lib, "ncclGroupStart", &a->GroupStart, &missing);
  Resolve(lib, "ncclGroupEnd", &a->GroupEnd, &missing);
  Resolve(lib, "ncclSend", &a->Send, &missing);
  Resolve(lib, "ncclRecv", &a->Recv, &missing);
  Resolve(lib, "ncclCommDestroy", &a->CommDestroy, &missing);
  Resolve(lib, "ncclCommAbort", &a->CommAbort, &missing);
  Resolve(lib, "ncclGetErrorString", &a->GetErrorString, &missing);
  Resolve(lib, "ncclCommGetAsyncError", &a->CommGetAsyncError, &missing);
  if (!missing.empty()) {
    delete a;
    load_error = "the loaded libnccl.so.2 lacks " + missing + " (NCCL >= 2.14 is needed)";
    return load_error;
  }
  api = a;
  return "";
}

std::string NcclUniqueId(std::string* id) {
  std::string err;
  const NcclApi* nccl = Api(&err);
  if (nccl == nullptr) return err;
  ncclUniqueId uid;
  const ncclResult_t r = nccl->GetUniqueId(&uid);
  if (r != ncclSuccess) return "ncclGetUniqueId: " + NcclMessage(*nccl, r);
  id->assign(uid.internal, sizeof(uid.internal));
  return "";
}

std::string NcclInit(const std::vector<NcclInitEntry>& entries, double timeout_s) {
  std::string err;
  const NcclApi* nccl = Api(&err);
  if (nccl == nullptr) return err;
  std::vector<const NcclInitEntry*> todo;
  for (const NcclInitEntry& e : entries) {
    if (e.unique_id.size() != sizeof(ncclUniqueId)) {
      return "unique id of " + std::to_string(e.unique_id.size()) + " bytes, not " +
             std::to_string(sizeof(ncclUniqueId));
    }
    if (e.rank < 0 || e.rank >= e.nranks) {
      return "rank " + std::to_string(e.rank) + " outside [0, " + std::to_string(e.nranks) + ")";
    }
    if (FindComm(e.key, e.ordinal) == nullptr) todo.push_back(&e);
  }
  if (todo.empty()) return "";
  const std::chrono::milliseconds timeout(static_cast<int64_t>(std::ceil(timeout_s * 1000)));
  int previous = 0;
  cudaError_t ce = cudaGetDevice(&previous);
  if (ce != cudaSuccess) return "cudaGetDevice: " + CudaMessage(ce);
  std::vector<ncclComm_t> comms(todo.size(), nullptr);
  ncclResult_t r = nccl->GroupStart();
  if (r != ncclSuccess) return "ncclGroupStart: " + NcclMessage(*nccl, r);
  for (size_t i = 0; i < todo.size() && err.empty(); ++i) {
    const NcclInitEntry& e = *todo[i];
    ce = cudaSetDevice(e.ordinal);
    if (ce != cudaSuccess) {
      err = "cudaSetDevice(" + std::to_string(e.ordinal) + "): " + CudaMessage(ce);
      break;
    }
    ncclUniqueId uid;
    std::memcpy(uid.internal, e.unique_id.data(), sizeof(uid.internal));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // every host wait polls, with a timeout
    r = nccl->CommInitRankConfig(&comms[i], e.nranks, uid, e.rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      err = "ncclCommInitRankConfig (rank " + std::to_string(e.rank) + " of " +
            std::to_string(e.nranks) + ", device " + std::to_string(e.ordinal) +
            "): " + NcclMessage(*nccl, r);
    }
  }
  r = nccl->GroupEnd();
  if (err.empty() && r != ncclSuccess && r != ncclInProgress) {
    err = "ncclGroupEnd: " + NcclMessage(*nccl, r);
  }
  for (size_t i = 0; i < todo.size(); ++i) {
    if (comms[i] == nullptr) continue;
    const std::string what = "creating the NCCL communicator of rank " +
                             std::to_string(todo[i]->rank) + " of " +
                             std::to_string(todo[i]->nranks) + " on device " +
                             std::to_string(todo[i]->ordinal);
    if (!err.empty()) {
      nccl->CommAbort(comms[i]);
      continue;
    }
    err = WaitComm(*nccl, comms[i], timeout, what.c_str());
    if (!err.empty()) {
      for (size_t j = i; j < todo.size(); ++j) {
        if (comms[j] != nullptr) nccl->CommAbort(comms[j]);
      }
      break;
    }
  }
  cudaSetDevice(previous);
  if (!err.empty()) return err;
  std::lock_guard<std::mutex> lock(registry_mu);
  for (size_t i = 0; i < todo.size(); ++i) {
    Comm*& slot = Registry()[{todo[i]->key, todo[i]->ordinal}];
    if (slot == nullptr) slot = new Comm();
    slot->comm = comms[i];
    slot->rank = todo[i]->rank;
    slot->nranks = todo[i]->nranks;
    slot->broken.clear();
  }
  return "";
}

}  // namespace jaxcc

// Not command-buffer compatible: it issues NCCL calls and may block the host.
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxccCollectiveCuda, jaxcc::CollectiveImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::ScratchAllocator>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::Token>()                 // program order in
                                  .Arg<ffi::AnyBuffer>()             // x: this rank's flat buffer
                                  .Arg<ffi::Buffer<ffi::S32>>()      // rank (unused: the comm's)
                                  .Arg<ffi::Buffer<ffi::S32>>()      // group (unused: the comm's)
                                  .Ret<ffi::Token>()                 // program order out
                                  .Ret<ffi::AnyBuffer>()             // y: the result, aliases x
                                  .Attr<ffi::Span<const int64_t>>("table")
                                  .Attr<int64_t>("num_steps")
                                  .Attr<int64_t>("nranks")
                                  .Attr<int64_t>("op_id")
                                  .Attr<int64_t>("digest")
                                  .Attr<std::string_view>("name")
                                  .Attr<ffi::Span<const int64_t>>("procs")     // ignored
                                  .Attr<ffi::Span<const int64_t>>("pacing")    // ignored
                                  .Attr<int64_t>("comm_key")
                                  .Attr<int64_t>("timeout_ms"));     // every wait's limit
