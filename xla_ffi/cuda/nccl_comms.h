// The NCCL side of _jaxcc_cuda that Python calls (through module.cc): load
// libnccl.so.2, make unique ids, and create the communicators the CUDA
// jaxcc_collective handler (collective.cu) looks up by (comm key, device
// ordinal). Host-only declarations: module.cc includes this without nccl.h.
// Compiled only when the build found nccl.h (JAXCC_HAS_NCCL).
#ifndef JAXCC_CUDA_NCCL_COMMS_H_
#define JAXCC_CUDA_NCCL_COMMS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace jaxcc {

// dlopens libnccl.so.2 (first by soname, then each of `paths`) and resolves
// the functions jaxcc uses, once. Returns an error message, empty on success.
std::string NcclLoad(const std::vector<std::string>& paths);

// A fresh ncclUniqueId's bytes (NCCL_UNIQUE_ID_BYTES) in *id.
std::string NcclUniqueId(std::string* id);

// One communicator to create: rank `rank` of `nranks` on local device
// `ordinal`, registered under (key, ordinal).
struct NcclInitEntry {
  int64_t key;
  int nranks;
  int rank;
  int ordinal;
  std::string unique_id;
};

// Creates every entry's communicator in one NCCL group (a process with several
// devices in one communicator must), skipping those already registered, and
// waits for them up to `timeout_s` seconds (then aborts them).
std::string NcclInit(const std::vector<NcclInitEntry>& entries, double timeout_s);

}  // namespace jaxcc

#endif  // JAXCC_CUDA_NCCL_COMMS_H_
