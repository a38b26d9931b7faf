// _jaxcc_cuda: the CUDA FFI handlers of jaxcc, registered for platform "CUDA"
// by jaxcc/_src/ffi.py. Importing it makes no CUDA call (cudart is linked
// statically and only used when a handler runs), so it loads on machines
// without a GPU or driver.
#include <nanobind/nanobind.h>

#include "jaxcc/module.h"
#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"

#ifdef JAXCC_HAS_NCCL
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "nccl_comms.h"
#endif

namespace nb = nanobind;

// One line per handler, defined in the .cu files of xla_ffi/cuda/.
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxccReduceCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxccCodecEncodeFixedCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxccCodecDecodeFixedCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxccCodecEncodeEntropyCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxccCodecDecodeEntropyCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxccPieceEncodeCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxccPieceHopCuda);
#ifdef JAXCC_HAS_NCCL
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxccCollectiveCuda);
#endif

namespace {

// Every target of this module. Add new handlers here.
constexpr jaxcc::Target kTargets[] = {
    {"jaxcc_reduce", JaxccReduceCuda},
    {"jaxcc_codec_encode_fixed", JaxccCodecEncodeFixedCuda},
    {"jaxcc_codec_decode_fixed", JaxccCodecDecodeFixedCuda},
    {"jaxcc_codec_encode_entropy", JaxccCodecEncodeEntropyCuda},
    {"jaxcc_codec_decode_entropy", JaxccCodecDecodeEntropyCuda},
    {"jaxcc_piece_encode", JaxccPieceEncodeCuda},  // one segmented piece (checks)
    {"jaxcc_piece_hop", JaxccPieceHopCuda},        // one fused reduce hop (checks)
#ifdef JAXCC_HAS_NCCL
    {"jaxcc_collective", JaxccCollectiveCuda},  // the Nccl transport
#endif
};

}  // namespace

NB_MODULE(_jaxcc_cuda, m) {
  m.doc() = "jaxcc CUDA handlers for XLA FFI custom calls.";
  jaxcc::DefineRegistrations(m, kTargets);
#ifdef JAXCC_HAS_NCCL
  m.def("has_nccl", [] { return true; }, "Whether the Nccl transport (jaxcc_collective) was built.");
  m.def(
      "nccl_load",
      [](const std::vector<std::string>& paths) { return jaxcc::NcclLoad(paths); },
      nb::arg("paths") = std::vector<std::string>(),
      "dlopens libnccl.so.2 (by soname, then each path); returns an error message, '' on success.");
  m.def(
      "nccl_unique_id",
      [] {
        std::string id;
        const std::string err = jaxcc::NcclUniqueId(&id);
        if (!err.empty()) throw std::runtime_error("jaxcc: " + err);
        return nb::bytes(id.data(), id.size());
      },
      "A fresh ncclUniqueId, as bytes (call nccl_load first).");
  m.def(
      "nccl_init",
      [](const std::vector<std::tuple<int64_t, int, int, int, nb::bytes>>& entries,
         double timeout_s) {
        std::vector<jaxcc::NcclInitEntry> parsed;
        for (const auto& [key, nranks, rank, ordinal, uid] : entries) {
          parsed.push_back({key, nranks, rank, ordinal, std::string(uid.c_str(), uid.size())});
        }
        std::string err;
        {
          nb::gil_scoped_release release;  // peers' threads may need the GIL meanwhile
          err = jaxcc::NcclInit(parsed, timeout_s);
        }
        if (!err.empty()) throw std::runtime_error("jaxcc: " + err);
      },
      nb::arg("entries"), nb::arg("timeout_s"),
      "Creates the communicators [(comm_key, nranks, rank, device_ordinal, unique_id)] in one "
      "NCCL group and registers them under (comm_key, device_ordinal) for jaxcc_collective.");
#else
  m.def("has_nccl", [] { return false; }, "Whether the Nccl transport (jaxcc_collective) was built.");
#endif
}
