// _jaxcc_cpu: the CPU FFI handlers of jaxcc, registered for platform "cpu" by
// jaxcc/_src/ffi.py.
#include <nanobind/nanobind.h>
#include <nanobind/stl/vector.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "jaxcc/module.h"
#include "tcp.h"
#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"

namespace nb = nanobind;

// One line per handler, defined in the other files of xla_ffi/cpu/.
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxccReduce);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxccCodecEncodeFixed);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxccCodecDecodeFixed);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxccCodecEncodeEntropy);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxccCodecDecodeEntropy);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxccCollective);

namespace {

// Every target of this module. Add new handlers here.
constexpr jaxcc::Target kTargets[] = {
    {"jaxcc_reduce", JaxccReduce},
    {"jaxcc_codec_encode_fixed", JaxccCodecEncodeFixed},
    {"jaxcc_codec_decode_fixed", JaxccCodecDecodeFixed},
    {"jaxcc_codec_encode_entropy", JaxccCodecEncodeEntropy},
    {"jaxcc_codec_decode_entropy", JaxccCodecDecodeEntropy},
    {"jaxcc_collective", JaxccCollective},
};

}  // namespace

NB_MODULE(_jaxcc_cpu, m) {
  m.doc() = "jaxcc CPU handlers for XLA FFI custom calls.";
  jaxcc::DefineRegistrations(m, kTargets);
  m.def(
      "tcp_start",
      [](int process, std::vector<int> fds) {
        const std::string err = jaxcc::TcpStart(process, fds);
        if (!err.empty()) throw std::runtime_error("jaxcc: " + err);
      },
      nb::arg("process"), nb::arg("fds"),
      "Starts the TCP transport as `process` over authenticated sockets: fds[q] to process q, "
      "-1 for this one. Takes the sockets over.");
  m.def("tcp_process", &jaxcc::TcpProcess,
        "This process' index in the TCP transport; -1 before tcp_start.");
}
