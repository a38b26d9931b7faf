// _jaxcc_cuda: the CUDA FFI handlers of jaxcc, registered for platform "CUDA"
// by jaxcc/_src/ffi.py. Importing it makes no CUDA call (cudart is linked
// statically and only used when a handler runs), so it loads on machines
// without a GPU or driver.
#include <nanobind/nanobind.h>

#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"

namespace nb = nanobind;

// One line per handler, defined in the .cu files of xla_ffi/cuda/.
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxccReduceCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxccCodecEncodeFixedCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxccCodecDecodeFixedCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxccCodecEncodeEntropyCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxccCodecDecodeEntropyCuda);

namespace {

struct Target {
  const char* name;          // the ffi_call target name (same as on the CPU)
  XLA_FFI_Handler* handler;  // the handler symbol
};

// Every target of this module. Add new handlers here.
constexpr Target kTargets[] = {
    {"jaxcc_reduce", JaxccReduceCuda},
    {"jaxcc_codec_encode_fixed", JaxccCodecEncodeFixedCuda},
    {"jaxcc_codec_decode_fixed", JaxccCodecDecodeFixedCuda},
    {"jaxcc_codec_encode_entropy", JaxccCodecEncodeEntropyCuda},
    {"jaxcc_codec_decode_entropy", JaxccCodecDecodeEntropyCuda},
};

}  // namespace

NB_MODULE(_jaxcc_cuda, m) {
  m.doc() = "jaxcc CUDA handlers for XLA FFI custom calls.";
  m.def(
      "registrations",
      [] {
        nb::dict targets;
        for (const Target& t : kTargets) {
          targets[t.name] = nb::capsule(reinterpret_cast<void*>(t.handler));
        }
        return targets;
      },
      "Returns {target name: PyCapsule of the handler} for jax.ffi.register_ffi_target.");
  m.def(
      "ffi_api_version", [] { return nb::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR); },
      "The XLA FFI C API version (major, minor) this module was compiled against.");
}
