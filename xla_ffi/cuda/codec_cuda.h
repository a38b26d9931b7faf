// What the CUDA codec files (codec*.cu) share: launch geometry, element
// words, the device status word of decoding failures, host-side error and
// scratch helpers, and the per-format launchers that codec.cu's handlers call.
#ifndef JAXCC_CUDA_CODEC_CUDA_H_
#define JAXCC_CUDA_CODEC_CUDA_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>

#include "jaxcc/codec.h"
#include "jaxcc/piece_layout.h"
#include "xla/ffi/api/ffi.h"

namespace jaxcc {
namespace codec {

namespace ffi = xla::ffi;

constexpr int kThreads = 256;
static_assert(kThreads == kFixedBlock, "one thread per fixed-codec element");
static_assert(kEntropyBlock / kThreads == 256, "a thread owns 256 elements in compactions");

template <DTypeId D>
using Bits = std::conditional_t<D == kF32, uint32_t, uint16_t>;

template <typename T>
__host__ __device__ inline T Min(T a, T b) {
  return a < b ? a : b;
}

// Decode failures, reported through a device status word (first one wins).
enum Status : uint32_t {
  kOk = 0,
  kBadBlockHeader,
  kBadEscape,
  kBadSize,
  kBadPlane,
  kBadBitmap,
  kBadBlockKind,
  kBadHeader,
  kBadChecksum,
};

inline const char* StatusText(uint32_t s) {
  switch (s) {
    case kBadBlockHeader: return "bad block header";
    case kBadEscape: return "bad escape";
    case kBadSize: return "size mismatch: the blocks do not add up to nbytes";
    case kBadPlane: return "corrupted plane";
    case kBadBitmap: return "bad zero bitmap";
    case kBadBlockKind: return "bad block kind";
    case kBadHeader: return "bad header: not the segment of this codec, dtype and length";
    case kBadChecksum: return "checksum mismatch: the data is corrupted";
  }
  return "unknown failure";
}

struct MaxOp {
  __device__ uint32_t operator()(uint32_t a, uint32_t b) const { return a > b ? a : b; }
};

__device__ inline void Fail(uint32_t* status, uint32_t s) { atomicCAS(status, 0u, s); }

// ---------------------------------------------------------------------------
// Host-side helpers.
// ---------------------------------------------------------------------------

inline ffi::Error CudaError(const std::string& name, cudaError_t err, const char* what) {
  return ffi::Error::Internal(name + ": " + what + ": " + cudaGetErrorName(err) + ": " +
                              cudaGetErrorString(err));
}

#define JAXCC_CUDA(name, call)                                        \
  do {                                                                \
    const cudaError_t err_ = (call);                                  \
    if (err_ != cudaSuccess) return CudaError(name, err_, #call);     \
  } while (0)

#define JAXCC_LAUNCHED(name)                                                    \
  do {                                                                          \
    const cudaError_t err_ = cudaGetLastError();                                \
    if (err_ != cudaSuccess) return CudaError(name, err_, "kernel launch");     \
  } while (0)

// Carves typed arrays out of one scratch allocation.
struct Carver {
  uint8_t* base;
  uint64_t used = 0;
  template <typename T>
  T* Take(uint64_t count) {
    T* p = reinterpret_cast<T*>(base + used);
    used += (count * sizeof(T) + 255) / 256 * 256;
    return p;
  }
};

inline std::optional<uint8_t*> Allocate(ffi::ScratchAllocator& scratch, uint64_t bytes) {
  if (bytes == 0) bytes = 256;
  std::optional<void*> p = scratch.Allocate(bytes, 256);
  if (!p.has_value() || *p == nullptr) return std::nullopt;
  return static_cast<uint8_t*>(*p);
}

inline ffi::Error NoScratch(const std::string& name, uint64_t bytes) {
  return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                    name + ": cannot allocate " + std::to_string(bytes) + " bytes of scratch");
}

// Exclusive scan of count u32 values into out (count + 1 values: the total
// last); codec_checksum.cu.
ffi::Error ExclusiveScan(const std::string& name, cudaStream_t stream,
                         ffi::ScratchAllocator& scratch, const uint32_t* in, uint32_t* out,
                         uint64_t count);

// sums[0..1] += the checksum of data[0, *nbytes), nbytes <= max_bytes, on the
// stream; codec_checksum.cu.
ffi::Error SumChecksum(const std::string& name, cudaStream_t stream, const uint8_t* data,
                       const uint64_t* nbytes, uint64_t max_bytes, uint32_t* sums);

// Sums the checksum of out[0, *nbytes) (header fields already in place) and
// writes the header and the nbytes result; codec_checksum.cu.
ffi::Error Finish(const std::string& name, cudaStream_t stream, uint8_t* out, CodecId codec,
                  DTypeId dtype, uint64_t n, uint64_t max_bytes, const uint64_t* nbytes,
                  uint32_t* sums, int32_t* nbytes_out);

// "fixed" (codec_fixed.cu): encodes the n elements at x into out and its size
// into *nbytes_out; decodes the nbytes at `in` (header checked) into y,
// failures into status[0] and the spill total into status[1].
template <DTypeId D>
ffi::Error EncodeFixedOn(const std::string& name, cudaStream_t stream,
                         ffi::ScratchAllocator& scratch, const void* x, uint64_t n, uint8_t* out,
                         int32_t* nbytes_out);

template <DTypeId D>
ffi::Error DecodeFixedOn(const std::string& name, cudaStream_t stream,
                         ffi::ScratchAllocator& scratch, const uint8_t* in, uint64_t nbytes,
                         uint64_t n, void* y, uint32_t* status);

// "entropy" (codec_entropy.cu): as the "fixed" launchers (status[0] only).
template <DTypeId D>
ffi::Error EncodeEntropyOn(const std::string& name, cudaStream_t stream,
                           ffi::ScratchAllocator& scratch, const void* x, uint64_t n, uint8_t* out,
                           int32_t* nbytes_out);

template <DTypeId D>
ffi::Error DecodeEntropyOn(const std::string& name, cudaStream_t stream,
                           ffi::ScratchAllocator& scratch, const uint8_t* in, uint64_t nbytes,
                           uint64_t n, void* y, uint32_t* status);

// Segmented pieces (jaxcc/piece_layout.h), every launcher on the work areas
// of piece::HopWorkLayout at `work`; `sizes` (u32, one per segment) and
// `offsets` (u64, the segment starts and the total) of an encoded result are
// device arrays.

// "fixed" (codec_fixed.cu): own = own (with `sum`) + the k pieces `inputs`
// decoded, in order (with k = 1 and no `sum`: the piece's bits); then, with
// `out`, own encoded there. `inputs` are host records; `records` (host
// memory for k of them, see piece::HopOnStream) receives them with their
// `spill` set, for the device. Their checks (CheckSegments) come first.
template <DTypeId D>
ffi::Error FixedPieceHopOn(const std::string& name, cudaStream_t stream,
                           const piece::HopInput* inputs, piece::HopInput* records, uint32_t k,
                           bool sum, void* own, uint64_t n, uint8_t* work,
                           const piece::HopWork& w, uint8_t* out, uint32_t* sizes,
                           uint64_t* offsets);

// "entropy" (codec_entropy.cu): the n elements at x encoded at out; the
// piece `in` decoded into y (`w`: the areas of the hop they are part of).
template <DTypeId D>
ffi::Error EntropyPieceEncodeOn(const std::string& name, cudaStream_t stream, const void* x,
                                uint64_t n, uint8_t* work, const piece::HopWork& w, uint8_t* out,
                                uint32_t* sizes, uint64_t* offsets);
template <DTypeId D>
ffi::Error EntropyPieceDecodeOn(const std::string& name, cudaStream_t stream,
                                const piece::HopInput& in, uint64_t n, uint8_t* work,
                                const piece::HopWork& w, void* y);

// piece_codec.cu: offsets[0..segments] from the segment sizes (one thread
// block); the headers and checksums of the encoded segments at out; the checks
// of a received piece's segments (header, announced size, checksum) into its
// status.
ffi::Error ScanSegments(const std::string& name, cudaStream_t stream, const uint32_t* sizes,
                        uint64_t segments, uint64_t* offsets);
ffi::Error FinishSegments(const std::string& name, cudaStream_t stream, uint8_t* out,
                          const uint64_t* offsets, CodecId c, DTypeId d, uint64_t n);
ffi::Error CheckSegments(const std::string& name, cudaStream_t stream, const piece::HopInput& in,
                         CodecId c, DTypeId d, uint64_t n);

}  // namespace codec
}  // namespace jaxcc

#endif  // JAXCC_CUDA_CODEC_CUDA_H_
