// jaxcc_collective on the CPU: one custom call runs one whole collective by
// walking its Schedule (jaxcc/transport.h: RunSchedule) over the InProcess
// transport, with jaxcc_reduce's kernel for the sums.
//
// Operands: the rank's flat buffer (aliased with the result, so the schedule
// runs in place), its rank and group (int32 scalars from lax.axis_index), and
// an int32 order scalar: each jaxcc collective consumes the previous one's and
// produces the next, so they run in program order on every device.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "inprocess.h"
#include "jaxcc/reduce.h"
#include "jaxcc/schedule.h"
#include "jaxcc/transport.h"
#include "reduce_host.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jaxcc {
namespace {

class HostKernels final : public Kernels {
 public:
  explicit HostKernels(ffi::DataType dtype) : dtype_(dtype) {}
  std::string Copy(char* dst, const char* src, size_t bytes) override {
    if (dst != src) std::memmove(dst, src, bytes);
    return "";
  }
  std::string Reduce(const char* const* inputs, size_t k, char* out, size_t n) override {
    ffi::Error err =
        ReduceOnHost(dtype_, reinterpret_cast<const void* const*>(inputs), k, out, n);
    return err.success() ? "" : err.message();
  }

 private:
  ffi::DataType dtype_;
};

std::chrono::seconds TimeoutFromEnv() {
  const char* env = std::getenv("JAXCC_TIMEOUT_S");
  long seconds = env ? std::strtol(env, nullptr, 10) : 0;
  return std::chrono::seconds(seconds > 0 ? seconds : 300);
}

ffi::Error CollectiveImpl(ffi::RunId run_id, ffi::AnyBuffer x, ffi::Buffer<ffi::S32> rank_buf,
                          ffi::Buffer<ffi::S32> group_buf, ffi::Buffer<ffi::S32> order_in,
                          ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::Buffer<ffi::S32>> order_out,
                          ffi::Span<const int64_t> table, int64_t num_steps, int64_t nranks,
                          int64_t op_id, int64_t digest, std::string_view name) {
  const std::string what = "jaxcc " + std::string(name) + " (op " + std::to_string(op_id) + ")";
  const int rank = rank_buf.typed_data()[0];
  const int64_t group = group_buf.typed_data()[0];
  order_out->typed_data()[0] = order_in.typed_data()[0] + 1;
  const size_t itemsize = ffi::ByteWidth(x.element_type());
  const int64_t length = static_cast<int64_t>(x.element_count());
  char* buf = static_cast<char*>(y->untyped_data());
  if (buf != x.untyped_data()) std::memcpy(buf, x.untyped_data(), length * itemsize);

  std::vector<RankStep> plan;
  std::string err = PlanRank(table.begin(), table.size(), num_steps, static_cast<int>(nranks),
                             rank, length, &plan);
  if (!err.empty()) return ffi::Error::InvalidArgument(what + ": " + err);
  const InProcessTransport::Key key{run_id.run_id, op_id, group,
                                    InProcessTransport::NextInstance(run_id.run_id, op_id,
                                                                     group, rank)};
  std::unique_ptr<InProcessTransport> transport;
  err = InProcessTransport::Join(key, static_cast<int>(nranks), rank, buf, digest,
                                 TimeoutFromEnv(), what, &transport);
  if (err.empty()) {
    HostKernels kernels(x.element_type());
    err = RunSchedule(plan, *transport, kernels, buf, itemsize);
  }
  if (!err.empty()) {
    if (transport) transport->Fail(err);
    return ffi::Error::Internal(what + ", rank " + std::to_string(rank) + ": " + err);
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxcc

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxccCollective, jaxcc::CollectiveImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::RunId>()
                                  .Arg<ffi::AnyBuffer>()             // x: this rank's flat buffer
                                  .Arg<ffi::Buffer<ffi::S32>>()      // rank along the axis
                                  .Arg<ffi::Buffer<ffi::S32>>()      // group: which axis instance
                                  .Arg<ffi::Buffer<ffi::S32>>()      // order in
                                  .Ret<ffi::AnyBuffer>()             // y: the result, aliases x
                                  .Ret<ffi::Buffer<ffi::S32>>()      // order out
                                  .Attr<ffi::Span<const int64_t>>("table")
                                  .Attr<int64_t>("num_steps")
                                  .Attr<int64_t>("nranks")
                                  .Attr<int64_t>("op_id")
                                  .Attr<int64_t>("digest")
                                  .Attr<std::string_view>("name"));
