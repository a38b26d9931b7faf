// What every jaxcc nanobind module exposes: its FFI targets, the XLA FFI API
// version it was compiled against, and the ids and element types its kernels
// take (jaxcc/_src/ffi.py reads them all when it loads the module).
#ifndef JAXCC_MODULE_H_
#define JAXCC_MODULE_H_

#include <nanobind/nanobind.h>

#include <cstddef>

#include "jaxcc/codec_ffi.h"
#include "jaxcc/dtypes.h"
#include "jaxcc/reduce.h"
#include "xla/ffi/api/c_api.h"

namespace jaxcc {

struct Target {
  const char* name;          // the ffi_call target name (the same on every platform)
  XLA_FFI_Handler* handler;  // the handler symbol
};

// Defines registrations() -> {name: PyCapsule}, ffi_api_version(),
// codec_ids(), codec_dtype_ids() and reducible_dtypes() on `m`.
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
  m.def(
      "codec_ids",
      [] {
        nanobind::dict out;
        for (const codec::CodecEntry& c : codec::kCodecs) out[c.name] = static_cast<int>(c.id);
        return out;
      },
      "{codec name: the id its encodings carry (jaxcc/codec.h)}.");
  m.def(
      "codec_dtype_ids",
      [] {
        nanobind::dict out;
        for (const codec::CodecType& c : codec::kCodecTypes) {
          out[DataTypeName(c.type).c_str()] = static_cast<int>(c.id);
        }
        return out;
      },
      "{dtype name: the id its encodings carry} for the dtypes the codecs take.");
  m.def(
      "reducible_dtypes",
      [] {
        nanobind::list out;
        for (xla::ffi::DataType t : kReducibleTypes) {
          out.append(nanobind::str(DataTypeName(t).c_str()));
        }
        return out;
      },
      "The names of the dtypes jaxcc_reduce sums.");
}

}  // namespace jaxcc

#endif  // JAXCC_MODULE_H_
