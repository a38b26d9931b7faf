// jaxcc_collective on the GPU: one custom call runs one whole collective by
// walking its Schedule (jaxcc/transport.h: RunSchedule) over the Nccl
// transport, with jaxcc_reduce's kernels for the sums, everything enqueued on
// XLA's stream.
//
// Operands and attributes are those of the CPU handler (xla_ffi/cpu/
// collective.cc, but `dtype` and `split_send_bytes`, which only the Tcp
// transport uses) plus `comm_key`: the communicators of one (mesh, axis), made
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
// on both sides, so NCCL matches them.
//
// With `codec` (1 fixed, 2 entropy; bf16, f16, f32) pieces travel encoded at
// their real sizes, in the coded steps of jaxcc/piece_layout.h (CodedRunner):
// each send encoded on the device or forwarded as the bytes the previous step
// left, the segment sizes sent first, then the bytes; copies decode into place
// and the reduce runs the fused hop (piece_codec_cuda.h), which also encodes
// the sum when the next step forwards it. The same bits as the raw path. libnccl.so.2 is dlopened at first use:
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
#include <functional>
#include <optional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "jaxcc/schedule.h"
#include "jaxcc/transport.h"
#include "jaxcc/codec_ffi.h"
#include "jaxcc/piece_layout.h"
#include "nccl_comms.h"
#include "piece_codec_cuda.h"
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

// "" for a call that succeeded or is in progress (nonblocking communicators);
// else `what` and NCCL's message.
std::string NcclCheck(const NcclApi& nccl, ncclResult_t r, const std::string& what) {
  if (r == ncclSuccess || r == ncclInProgress) return "";
  return what + ": " + NcclMessage(nccl, r);
}

// The state of comm's pending operations: ncclSuccess, ncclInProgress or the
// error that broke it.
ncclResult_t AsyncState(const NcclApi& nccl, ncclComm_t comm) {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t r = nccl.CommGetAsyncError(comm, &state);
  return r != ncclSuccess ? r : state;
}

// Polls `done` (nullopt: not yet; else the outcome, empty on success) with
// backoff, up to `timeout`; then an error naming `what`. On an error the
// caller must abort the communicator.
template <typename Done>
std::string Poll(std::chrono::milliseconds timeout, const std::string& what, Done done) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::microseconds(1);
  while (true) {
    if (std::optional<std::string> outcome = done()) return *outcome;
    if (std::chrono::steady_clock::now() > deadline) {
      return what + " did not finish within " + TimeoutText(timeout) +
             " (JAXCC_TIMEOUT_S); a peer is missing or stuck";
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

// Waits until comm's pending NCCL operation has left ncclInProgress.
std::string WaitComm(const NcclApi& nccl, ncclComm_t comm, std::chrono::milliseconds timeout,
                     const std::string& what) {
  return Poll(timeout, what, [&]() -> std::optional<std::string> {
    const ncclResult_t state = AsyncState(nccl, comm);
    if (state == ncclInProgress) return std::nullopt;
    return state == ncclSuccess ? "" : what + " failed: " + NcclMessage(nccl, state);
  });
}

// Waits for the work enqueued on `stream` so far, failing early if comm breaks.
std::string WaitStream(const NcclApi& nccl, ncclComm_t comm, cudaStream_t stream,
                       std::chrono::milliseconds timeout, const std::string& what) {
  return Poll(timeout, what, [&]() -> std::optional<std::string> {
    const cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess) return "";
    if (e != cudaErrorNotReady) return what + ": " + CudaMessage(e);
    const ncclResult_t state = AsyncState(nccl, comm);
    if (state != ncclSuccess && state != ncclInProgress) {
      return what + " failed: " + NcclMessage(nccl, state);
    }
    return std::nullopt;
  });
}

// One NCCL group: `post` enqueues its sends and receives; the group is closed
// in any case and waited for while in progress.
std::string Group(const NcclApi& nccl, ncclComm_t comm, std::chrono::milliseconds timeout,
                  const std::function<std::string()>& post, const std::string& what) {
  std::string err = NcclCheck(nccl, nccl.GroupStart(), "ncclGroupStart");
  if (!err.empty()) return err;
  err = post();
  const ncclResult_t end = nccl.GroupEnd();  // always, to close the group
  if (!err.empty()) return err;
  if (end == ncclInProgress) return WaitComm(nccl, comm, timeout, what);
  return NcclCheck(nccl, end, "ncclGroupEnd");
}

// --- communicator registry -----------------------------------------------------

struct Comm {
  ncclComm_t comm = nullptr;
  int rank = 0;
  int nranks = 0;
  std::string broken;  // why it was aborted; empty while usable
  std::mutex mu;       // one collective at a time per communicator
  // Pinned host memory of the coded steps: the last buffer is the one in use,
  // grown by doubling; none is freed (cudaFreeHost may wait for the device).
  std::vector<void*> pinned;
  size_t pinned_bytes = 0;
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

// A call failed with the peers possibly mid-step: the communicator cannot be
// trusted again, so it is marked broken and aborted (its only abort).
void Abort(const NcclApi& nccl, Comm& comm, const std::string& error) {
  comm.broken = error;
  nccl.CommAbort(comm.comm);
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
        for (const Piece& in : *list) bytes += piece::Align(in.length * itemsize);
      }
      most = std::max(most, bytes);
    }
    return most;
  }

  std::string Publish(int64_t step, const RankStep& plan) override {
    std::vector<Piece> sends = plan.sends;
    std::sort(sends.begin(), sends.end(), piece::PairOrder);
    received_.clear();
    for (const auto* list : {&plan.copies, &plan.reduces}) {
      for (const Piece& in : *list) received_.push_back({in, nullptr, false});
    }
    std::sort(received_.begin(), received_.end(),
              [](const Slot& a, const Slot& b) { return piece::PairOrder(a.piece, b.piece); });
    size_t offset = 0;
    for (Slot& slot : received_) {
      slot.view = staging_ + offset;
      offset += piece::Align(slot.piece.length * itemsize_);
    }
    return Group(nccl_, comm_.comm, timeout_, [&]() -> std::string {
      for (const Piece& out : sends) {
        std::string err = NcclCheck(nccl_, nccl_.Send(buf_ + out.src_start * itemsize_,
                                                      out.length * itemsize_, ncclUint8,
                                                      out.peer, comm_.comm, stream_),
                                    "ncclSend to rank " + std::to_string(out.peer));
        if (!err.empty()) return err;
      }
      for (const Slot& slot : received_) {
        std::string err = NcclCheck(nccl_, nccl_.Recv(slot.view, slot.piece.length * itemsize_,
                                                      ncclUint8, slot.piece.peer, comm_.comm,
                                                      stream_),
                                    "ncclRecv from rank " + std::to_string(slot.piece.peer));
        if (!err.empty()) return err;
      }
      return "";
    }, "step " + std::to_string(step) + " send/receive");
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

  void Fail(const std::string& error) override { Abort(nccl_, comm_, error); }

 private:
  struct Slot {
    Piece piece;
    char* view;
    bool taken;
  };

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

// --- coded pieces (jaxcc/piece_layout.h: the steps) ------------------------------

// Runs a rank's coded steps: every piece travels encoded at its real size
// (the step order of jaxcc/piece_layout.h), on one scratch allocation made
// for the largest step. Host waits per step: once for the encoded sizes (and
// the previous step's decoding status), once for the sizes received.
class CodedRunner {
 public:
  CodedRunner(const NcclApi& nccl, Comm& comm, cudaStream_t stream,
              ffi::ScratchAllocator& scratch, codec::CodecId c, codec::DTypeId d, char* buf,
              std::chrono::milliseconds timeout)
      : nccl_(nccl), comm_(comm), stream_(stream), scratch_(scratch), c_(c), d_(d), buf_(buf),
        itemsize_(codec::Info(d).elem_bytes), timeout_(timeout) {}

  std::string Run(const std::vector<RankStep>& plan) {
    coded_ = piece::PlanCoded(plan, c_, d_);
    std::string err = Allocate(plan);
    for (size_t t = 0; t < plan.size() && err.empty(); ++t) {
      err = Step(plan, t);
      if (!err.empty()) err = "step " + std::to_string(t) + ": " + err;
    }
    if (err.empty() && !plan.empty()) {
      const size_t last = plan.size() - 1;
      err = Statuses(last, "waiting for the pieces of the last step from " +
                               Ranks(coded_.steps[last].recvs));
    }
    return err;
  }

 private:
  // Offsets into one allocation, each 256-byte aligned.
  std::string Allocate(const std::vector<RankStep>& plan) {
    size_t most_sends = 0, most_recvs = 0;
    uint64_t work = 0;
    for (size_t t = 0; t < plan.size(); ++t) {
      const piece::CodedStep& step = coded_.steps[t];
      most_sends = std::max(most_sends, step.sends.size());
      most_recvs = std::max(most_recvs, step.recvs.size());
      for (const piece::CodedSend& out : step.sends) {
        work = std::max(work, piece::HopWorkLayout(c_, d_, out.piece.length, 0, false, true).bytes);
      }
      for (const piece::CodedRecv& in : step.recvs) {
        if (!in.reduce) {
          work = std::max(work, piece::HopWorkLayout(c_, d_, in.piece.length, 1, false, false).bytes);
        }
      }
      const std::vector<Piece>& red = plan[t].reduces;
      if (!red.empty()) {
        work = std::max(work, piece::HopWorkLayout(c_, d_, red[0].length, red.size(), true,
                                                   step.keeps_sum).bytes);
      }
    }
    const uint64_t words = coded_.words;
    const uint64_t sum_segments = piece::Segments(coded_.reduce_length);
    piece::Areas device;
    const uint64_t send_area = device.Take(coded_.send_bytes);
    const uint64_t send_sizes = device.Take(4 * words);
    const uint64_t send_offsets = device.Take(8 * (words + most_sends));
    uint64_t staging[2], sums[2], recv_sizes[2], sum_sizes[2], recv_offsets[2], sum_offsets[2],
        status[2];
    for (int p = 0; p < 2; ++p) {
      staging[p] = device.Take(coded_.staging_bytes);
      sums[p] = device.Take(coded_.sum_bytes);
      recv_sizes[p] = device.Take(4 * words);
      sum_sizes[p] = device.Take(4 * sum_segments);
      recv_offsets[p] = device.Take(8 * (words + most_recvs));
      sum_offsets[p] = device.Take(8 * (sum_segments + 1));
      status[p] = device.Take(4 * most_recvs);
    }
    const uint64_t work_at = device.Take(work);
    std::optional<void*> mem = scratch_.Allocate(std::max<uint64_t>(device.bytes, 256), 256);
    if (!mem.has_value() || *mem == nullptr) {
      return "cannot allocate " + std::to_string(device.bytes) + " bytes for the coded pieces";
    }
    // Host arrays the stream copies to and from: pinned, so no copy waits for the stream.
    piece::Areas host;
    const uint64_t host_sizes = host.Take(4 * words);
    const uint64_t host_status = host.Take(4 * most_recvs);
    const uint64_t host_offsets = host.Take(8 * (words + most_recvs));
    const uint64_t records = host.Take(sizeof(piece::HopInput) * most_recvs);
    if (comm_.pinned_bytes < host.bytes) {
      const size_t bytes = std::max<size_t>(host.bytes, 2 * comm_.pinned_bytes);
      void* buffer = nullptr;
      const cudaError_t e = cudaMallocHost(&buffer, bytes);
      if (e != cudaSuccess) return "cudaMallocHost(" + std::to_string(bytes) + "): " + CudaMessage(e);
      comm_.pinned.push_back(buffer);
      comm_.pinned_bytes = bytes;
    }
    auto* pinned = static_cast<uint8_t*>(comm_.pinned.back());
    host_sizes_ = reinterpret_cast<uint32_t*>(pinned + host_sizes);
    host_status_ = reinterpret_cast<uint32_t*>(pinned + host_status);
    host_offsets_ = reinterpret_cast<uint64_t*>(pinned + host_offsets);
    records_ = reinterpret_cast<piece::HopInput*>(pinned + records);
    auto* base = static_cast<uint8_t*>(*mem);
    send_area_ = base + send_area;
    send_sizes_ = reinterpret_cast<uint32_t*>(base + send_sizes);
    send_offsets_ = reinterpret_cast<uint64_t*>(base + send_offsets);
    for (int p = 0; p < 2; ++p) {
      staging_[p] = base + staging[p];
      sums_[p] = base + sums[p];
      recv_sizes_[p] = reinterpret_cast<uint32_t*>(base + recv_sizes[p]);
      sum_sizes_[p] = reinterpret_cast<uint32_t*>(base + sum_sizes[p]);
      recv_offsets_[p] = reinterpret_cast<uint64_t*>(base + recv_offsets[p]);
      sum_offsets_[p] = reinterpret_cast<uint64_t*>(base + sum_offsets[p]);
      status_[p] = reinterpret_cast<uint32_t*>(base + status[p]);
    }
    work_ = base + work_at;
    return "";
  }

  std::string Cuda(cudaError_t e, const char* what) {
    return e == cudaSuccess ? "" : std::string(what) + ": " + CudaMessage(e);
  }
  std::string Nccl(ncclResult_t r, const std::string& what) { return NcclCheck(nccl_, r, what); }
  // "rank 1, rank 3": the ranks a step receives from.
  static std::string Ranks(const std::vector<piece::CodedRecv>& recvs) {
    std::set<int> peers;
    for (const piece::CodedRecv& in : recvs) peers.insert(in.piece.peer);
    std::string out;
    for (int r : peers) out += (out.empty() ? "rank " : ", rank ") + std::to_string(r);
    return out;
  }
  char* At(int64_t element) const { return buf_ + element * itemsize_; }

  // Waits for the stream and fails on a piece of step t that did not decode.
  std::string Statuses(size_t t, const std::string& what) {
    const piece::CodedStep& step = coded_.steps[t];
    const size_t n = step.recvs.size();
    std::string err;
    if (n) {
      err = Cuda(cudaMemcpyAsync(host_status_, status_[t % 2], 4 * n,
                                 cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
    }
    if (err.empty()) err = WaitStream(nccl_, comm_.comm, stream_, timeout_, what);
    for (size_t i = 0; i < n && err.empty(); ++i) {
      if (host_status_[i] != 0) {
        err = "the piece rank " + std::to_string(step.recvs[i].piece.peer) + " sent in step " +
              std::to_string(t) + " does not decode: " + piece::StatusMessage(host_status_[i]);
      }
    }
    return err;
  }

  std::string Step(const std::vector<RankStep>& plan, size_t t) {
    const int p = static_cast<int>(t % 2), q = 1 - p;
    const piece::CodedStep& step = coded_.steps[t];
    const std::string rank = std::to_string(comm_.rank);
    std::string err;
    if (!step.recvs.empty()) {
      err = Cuda(cudaMemsetAsync(status_[p], 0, 4 * step.recvs.size(), stream_), "cudaMemsetAsync");
    }
    // 1. Encode, or take what the previous step left.
    std::vector<const uint8_t*> data(step.sends.size());
    for (size_t j = 0; j < step.sends.size() && err.empty(); ++j) {
      const piece::CodedSend& out = step.sends[j];
      const uint64_t words = piece::Segments(out.piece.length);
      uint32_t* sizes = send_sizes_ + out.word;
      if (out.forwards >= 0) {
        const piece::CodedRecv& in = coded_.steps[t - 1].recvs[out.forwards];
        data[j] = staging_[q] + in.offset;
        err = Cuda(cudaMemcpyAsync(sizes, recv_sizes_[q] + in.word, 4 * words,
                                   cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync");
      } else if (out.forwards_sum) {
        data[j] = sums_[q];
        err = Cuda(cudaMemcpyAsync(sizes, sum_sizes_[q], 4 * words, cudaMemcpyDeviceToDevice,
                                   stream_), "cudaMemcpyAsync");
      } else {
        uint8_t* enc = send_area_ + out.offset;
        data[j] = enc;
        ffi::Error e = piece::HopOnStream("encode", stream_, scratch_, c_, d_, nullptr, nullptr,
                                          0, false, At(out.piece.src_start), out.piece.length,
                                          work_, enc, sizes, send_offsets_ + out.word + j);
        if (e.failure()) err = e.message();
      }
    }
    if (err.empty() && step.send_words) {
      err = Cuda(cudaMemcpyAsync(host_sizes_, send_sizes_, 4 * step.send_words,
                                 cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
    }
    if (err.empty() && t > 0) {
      const std::vector<piece::CodedRecv>& prev = coded_.steps[t - 1].recvs;
      err = Statuses(t - 1, prev.empty() ? std::string("encoding")
                                         : "waiting for the pieces of step " +
                                               std::to_string(t - 1) + " from " + Ranks(prev));
    } else if (err.empty()) {
      err = WaitStream(nccl_, comm_.comm, stream_, timeout_, "encoding");
    }
    if (!err.empty()) return err;
    std::vector<uint64_t> send_bytes(step.sends.size());
    for (size_t j = 0; j < step.sends.size(); ++j) {
      const piece::CodedSend& out = step.sends[j];
      for (uint64_t w = 0; w < piece::Segments(out.piece.length); ++w) {
        send_bytes[j] += host_sizes_[out.word + w];
      }
    }
    // 2. The sizes, one u32 per segment, in pair order.
    err = Group(nccl_, comm_.comm, timeout_, [&]() -> std::string {
      for (const piece::CodedSend& out : step.sends) {
        std::string e = Nccl(nccl_.Send(send_sizes_ + out.word, 4 * piece::Segments(out.piece.length),
                                        ncclUint8, out.piece.peer, comm_.comm, stream_),
                             "ncclSend of the sizes to rank " + std::to_string(out.piece.peer));
        if (!e.empty()) return e;
      }
      for (const piece::CodedRecv& in : step.recvs) {
        std::string e = Nccl(nccl_.Recv(recv_sizes_[p] + in.word, 4 * piece::Segments(in.piece.length),
                                        ncclUint8, in.piece.peer, comm_.comm, stream_),
                             "ncclRecv of the sizes from rank " + std::to_string(in.piece.peer));
        if (!e.empty()) return e;
      }
      return "";
    }, "the sizes exchange");
    if (err.empty() && step.recv_words) {
      err = Cuda(cudaMemcpyAsync(host_sizes_, recv_sizes_[p], 4 * step.recv_words,
                                 cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
    }
    if (err.empty() && !step.recvs.empty()) {
      err = WaitStream(nccl_, comm_.comm, stream_, timeout_,
                       "waiting for the sizes from " + Ranks(step.recvs));
    }
    if (!err.empty()) return err;
    std::vector<uint64_t> recv_bytes(step.recvs.size());
    for (size_t i = 0; i < step.recvs.size(); ++i) {
      const piece::CodedRecv& in = step.recvs[i];
      const uint64_t cap = piece::MaxPieceBytes(c_, d_, in.piece.length);
      const std::string bad = piece::SegmentOffsets(c_, d_, in.piece.length,
                                                    host_sizes_ + in.word, cap,
                                                    host_offsets_ + in.word + i,
                                                    &recv_bytes[i]);
      if (!bad.empty()) return "the piece from rank " + std::to_string(in.piece.peer) + ": " + bad;
      host_offsets_[in.word + i + piece::Segments(in.piece.length)] = recv_bytes[i];
    }
    if (!step.recvs.empty()) {
      err = Cuda(cudaMemcpyAsync(recv_offsets_[p], host_offsets_,
                                 8 * (step.recv_words + step.recvs.size()),
                                 cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
      if (!err.empty()) return err;
    }
    // 3. The encoded bytes.
    err = Group(nccl_, comm_.comm, timeout_, [&]() -> std::string {
      for (size_t j = 0; j < step.sends.size(); ++j) {
        const piece::CodedSend& out = step.sends[j];
        std::string e = Nccl(nccl_.Send(data[j], send_bytes[j], ncclUint8, out.piece.peer,
                                        comm_.comm, stream_),
                             "ncclSend to rank " + std::to_string(out.piece.peer));
        if (!e.empty()) return e;
      }
      for (size_t i = 0; i < step.recvs.size(); ++i) {
        const piece::CodedRecv& in = step.recvs[i];
        std::string e = Nccl(nccl_.Recv(staging_[p] + in.offset, recv_bytes[i], ncclUint8,
                                        in.piece.peer, comm_.comm, stream_),
                             "ncclRecv from rank " + std::to_string(in.piece.peer));
        if (!e.empty()) return e;
      }
      return "";
    }, "the send/receive of rank " + rank);
    if (!err.empty()) return err;
    // 4. Copies decode into place; the reduce sums its pieces in the canonical order.
    auto input = [&](size_t i) {
      const piece::CodedRecv& in = step.recvs[i];
      return piece::HopInput{staging_[p] + in.offset, recv_offsets_[p] + in.word + i, nullptr,
                             status_[p] + i};
    };
    size_t used = 0;  // records_ taken by this step's hops
    for (size_t i = 0; i < step.recvs.size(); ++i) {
      const piece::CodedRecv& in = step.recvs[i];
      if (in.reduce) continue;
      const piece::HopInput record = input(i);
      ffi::Error e = piece::HopOnStream("decode", stream_, scratch_, c_, d_, &record,
                                        records_ + used++, 1, false, At(in.piece.dst_start),
                                        in.piece.length, work_, nullptr, nullptr, nullptr);
      if (e.failure()) return e.message();
    }
    const std::vector<Piece>& red = plan[t].reduces;
    if (!red.empty()) {
      std::vector<piece::HopInput> records;
      for (const Piece& term : red) {
        for (size_t i = 0; i < step.recvs.size(); ++i) {
          const Piece& in = step.recvs[i].piece;
          if (step.recvs[i].reduce && in.peer == term.peer && in.src_start == term.src_start) {
            records.push_back(input(i));
            break;
          }
        }
      }
      ffi::Error e = piece::HopOnStream(
          "reduce", stream_, scratch_, c_, d_, records.data(), records_ + used,
          static_cast<uint32_t>(records.size()), true, At(red[0].dst_start), red[0].length,
          work_, step.keeps_sum ? sums_[p] : nullptr, sum_sizes_[p], sum_offsets_[p]);
      if (e.failure()) return e.message();
    }
    return "";
  }

  const NcclApi& nccl_;
  Comm& comm_;
  cudaStream_t stream_;
  ffi::ScratchAllocator& scratch_;
  codec::CodecId c_;
  codec::DTypeId d_;
  char* buf_;
  size_t itemsize_;
  std::chrono::milliseconds timeout_;
  piece::CodedPlan coded_;
  uint8_t* send_area_ = nullptr;
  uint32_t* send_sizes_ = nullptr;
  uint64_t* send_offsets_ = nullptr;
  uint8_t* staging_[2] = {nullptr, nullptr};
  uint8_t* sums_[2] = {nullptr, nullptr};
  uint32_t* recv_sizes_[2] = {nullptr, nullptr};
  uint32_t* sum_sizes_[2] = {nullptr, nullptr};
  uint64_t* recv_offsets_[2] = {nullptr, nullptr};
  uint64_t* sum_offsets_[2] = {nullptr, nullptr};
  uint32_t* status_[2] = {nullptr, nullptr};
  uint8_t* work_ = nullptr;
  uint32_t* host_sizes_ = nullptr;   // pinned: a step's sizes, sent or received
  uint32_t* host_status_ = nullptr;  // pinned: a step's decoding status, per recv
  uint64_t* host_offsets_ = nullptr;  // pinned: its received segments' starts
  piece::HopInput* records_ = nullptr;  // pinned: the device records of its hops
};

// --- the handler -------------------------------------------------------------------

ffi::Error CollectiveImpl(cudaStream_t stream, ffi::ScratchAllocator scratch, int32_t ordinal,
                          ffi::Token, ffi::AnyBuffer x, ffi::Buffer<ffi::S32>,
                          ffi::Buffer<ffi::S32>, ffi::Result<ffi::Token>, ffi::Result<ffi::AnyBuffer> y,
                          ffi::Span<const int64_t> table, int64_t num_steps, int64_t nranks,
                          int64_t op_id, int64_t, std::string_view name, ffi::Span<const int64_t>,
                          ffi::Span<const int64_t>, int64_t comm_key, int64_t codec,
                          int64_t timeout_ms) {
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

  if (codec != 0) {
    codec::DTypeId d;
    ffi::Error bad = codec::CheckDType(what, x.element_type(), &d);
    if (bad.failure()) return bad;
    if (codec != codec::kFixed && codec != codec::kEntropy) {
      return ffi::Error::InvalidArgument(what + ": unknown codec id " + std::to_string(codec));
    }
    CodedRunner runner(*nccl, *comm, stream, scratch, static_cast<codec::CodecId>(codec), d, buf,
                       std::chrono::milliseconds(timeout_ms));
    err = runner.Run(plan);
  } else {
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
  }
  if (err.empty()) {
    ce = cudaGetLastError();
    if (ce != cudaSuccess) err = CudaMessage(ce);
  }
  if (err.empty()) {
    const ncclResult_t state = AsyncState(*nccl, comm->comm);
    if (state != ncclSuccess && state != ncclInProgress) {
      err = "asynchronous NCCL error: " + NcclMessage(*nccl, state);
    }
  }
  if (!err.empty()) {
    Abort(*nccl, *comm, err);
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
                                  .Attr<int64_t>("codec")            // 0: raw pieces
                                  .Attr<int64_t>("timeout_ms"));     // every wait's limit
