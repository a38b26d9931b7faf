// How the Tcp transport's pieces travel encoded (jaxcc_collective's `codec`
// attribute): the PieceCodec of jaxcc/dataflow.h over the CPU codecs.
//
// A piece of n elements travels in one of two layouts, told apart by their
// magic bytes:
//   segmented (jaxcc/piece_layout.h): ceil(n / kSegment) jaxcc encodings
//     (jaxcc/codec.h) of kSegment elements each (the last one fewer) back to
//     back. A reduce hop decodes,
//     sums and re-encodes one segment at a time while it is in the cache, so
//     each element passes through memory once.
//   split ("entropy", bf16 and f32, pieces of at least `split_bytes` raw bytes
//     that are not sparse): the split layout of jaxcc/codec.h, sent in two
//     parts. The sign+mantissa planes (half of bf16's bytes, three quarters of
//     f32's) leave as soon as one pass has split them; the exponents follow
//     once coded. Sign+mantissa planes are never coded in this layout, and
//     sparse pieces keep the segmented layout, whose blocks code their zeros.
#ifndef JAXCC_CPU_PIECE_CODEC_H_
#define JAXCC_CPU_PIECE_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "jaxcc/codec.h"
#include "jaxcc/dataflow.h"
#include "jaxcc/piece_layout.h"
#include "xla/ffi/api/ffi.h"

namespace jaxcc {

class HostPieceCodec final : public PieceCodec {
 public:
  static constexpr size_t kSegment = piece::kSegment;

  // Pieces of at least `split_bytes` raw bytes may be split (0: never).
  HostPieceCodec(codec::CodecId codec, codec::DTypeId dtype, uint64_t split_bytes);

  uint64_t MaxBytes(size_t n) const override;
  // The most a piece of n elements takes on the wire, in either layout.
  uint64_t MaxWireBytes(size_t n) const;
  std::string Encode(const char* src, size_t n, char* out, uint64_t* bytes) override;
  bool Splits(const char* src, size_t n) const override;
  std::string SendSplit(const char* src, size_t n, const PostPart& post) override;
  std::string Decode(const char* in, uint64_t bytes, char* out, size_t n) override;
  std::string DecodeReduce(const char* const* in, const uint64_t* bytes, size_t k, char* own,
                           size_t n, Kernels& kernels, char* out, uint64_t* out_bytes,
                           size_t* bad) override;

 private:
  codec::CodecId codec_;
  codec::DTypeId dtype_;
  size_t itemsize_;
  uint64_t split_bytes_;
  std::vector<uint8_t> exponents_;           // SendSplit's exponent plane
  std::vector<std::vector<char>> segments_;  // DecodeReduce's decoded segments
};

// The codec `codec_id` names for pieces of `dtype` into *out (0: none, *out
// stays empty); an unknown codec or a type no codec takes is an error that
// starts with `what`.
xla::ffi::Error NewHostPieceCodec(const std::string& what, int64_t codec_id,
                                  xla::ffi::DataType dtype, uint64_t split_bytes,
                                  std::unique_ptr<HostPieceCodec>* out);

}  // namespace jaxcc

#endif  // JAXCC_CPU_PIECE_CODEC_H_
