// What every jaxcc nanobind module exposes: its FFI targets and the XLA FFI
// API version it was compiled against (jaxcc/_src/ffi.py reads both).
#ifndef JAXCC_MODULE_H_
#define JAXCC_MODULE_H_

#include <nanobind/nanobind.h>

#include <cstddef>

#include "xla/ffi/api/c_api.h"

namespace jaxcc {

struct Target {
  const char* name;          // the ffi_call target name (the same on every platform)
  XLA_FFI_Handler* handler;  // the handler symbol
};

// Defines registrations() -> {name: PyCapsule} and ffi_api_version() on `m`.
template <size_t N>
void DefineRegistrations(nanobind::module_& m, const Target (&targets)[N]) {
  const Target* first = targets;
  m.def(
      "registrations",
      [first] {
        nanobind::dict out;
        for (size_t i = 0; i < N; ++i) {
          out[first[i].name] = nanobind::capsule(reinterpret_cast<void*>(first[i].handler));
        }
        return out;
      },
      "Returns {target name: PyCapsule of the handler} for jax.ffi.register_ffi_target.");
  m.def(
      "ffi_api_version",
      [] { return nanobind::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR); },
      "The XLA FFI C API version (major, minor) this module was compiled against.");
}

}  // namespace jaxcc

#endif  // JAXCC_MODULE_H_
