// The Tcp transport's piece codec: see piece_codec.h.
#include "piece_codec.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "codec_host.h"
#include "jaxcc/codec_ffi.h"

namespace jaxcc {
namespace {

// Walks an encoded piece of n elements a segment at a time, in order.
class PieceReader {
 public:
  PieceReader(codec::CodecId c, codec::DTypeId d, const char* in, uint64_t bytes, uint64_t n)
      : c_(c), d_(d), in_(reinterpret_cast<const uint8_t*>(in)), bytes_(bytes), n_(n),
        split_(codec::IsSplit(in_, bytes)) {}

  // Decodes elements [first, first + m) (the next segment) into out.
  std::string Next(uint64_t first, uint64_t m, void* out) {
    if (split_) {
      if (c_ != codec::kEntropy) return "a split piece for the \"fixed\" codec";
      return codec::SplitDecode(d_, in_, bytes_, n_, first, m, out);
    }
    if (bytes_ - at_ < codec::kHeaderBytes) {
      return "truncated: segment " + std::to_string(first / HostPieceCodec::kSegment) +
             " starts " + std::to_string(bytes_ - at_) + " bytes before the end";
    }
    const uint64_t size = codec::Load64(in_ + at_ + 16);  // the segment's nbytes
    std::string err = codec::DecodeOnHost(c_, d_, in_ + at_, bytes_ - at_, size, m, out);
    if (!err.empty()) {
      return "segment " + std::to_string(first / HostPieceCodec::kSegment) + ": " + err;
    }
    at_ += size;
    return "";
  }
  // After the last segment: whether the piece ended there.
  std::string Finish() const {
    if (split_ || at_ == bytes_) return "";
    return std::to_string(bytes_ - at_) + " bytes after the last segment";
  }

 private:
  codec::CodecId c_;
  codec::DTypeId d_;
  const uint8_t* in_;
  uint64_t bytes_, n_, at_ = 0;
  bool split_;
};

}  // namespace

HostPieceCodec::HostPieceCodec(codec::CodecId codec, codec::DTypeId dtype, uint64_t split_bytes)
    : codec_(codec), dtype_(dtype), itemsize_(codec::Info(dtype).elem_bytes),
      split_bytes_(split_bytes) {}

uint64_t HostPieceCodec::MaxBytes(size_t n) const { return piece::MaxPieceBytes(codec_, dtype_, n); }

uint64_t HostPieceCodec::MaxWireBytes(size_t n) const {
  const uint64_t split = codec_ == codec::kEntropy && dtype_ != codec::kF16 && split_bytes_ != 0
                             ? codec::SplitHeadBytes(dtype_, n) + codec::SplitTailMaxBytes(n)
                             : 0;
  return std::max(MaxBytes(n), split);
}

std::string HostPieceCodec::Encode(const char* src, size_t n, char* out, uint64_t* bytes) {
  uint64_t at = 0;
  for (size_t first = 0; first < n; first += kSegment) {
    const size_t m = std::min(kSegment, n - first);
    at += codec::EncodeOnHost(codec_, dtype_, src + first * itemsize_, m,
                              reinterpret_cast<uint8_t*>(out) + at);
  }
  *bytes = at;
  return "";
}

bool HostPieceCodec::Splits(const char* src, size_t n) const {
  if (codec_ != codec::kEntropy || dtype_ == codec::kF16 || split_bytes_ == 0 ||
      n * itemsize_ < split_bytes_) {
    return false;
  }
  // Sparse pieces code better segmented: judged on up to 4096 elements.
  const size_t stride = std::max<size_t>(1, n / 4096);
  size_t seen = 0, zeros = 0;
  for (size_t i = 0; i < n; i += stride, ++seen) {
    const char* e = src + i * itemsize_;
    zeros += std::all_of(e, e + itemsize_, [](char b) { return b == 0; });
  }
  return zeros * 16 < seen;
}

std::string HostPieceCodec::SendSplit(const char* src, size_t n, const PostPart& post) {
  const uint64_t head_bytes = codec::SplitHeadBytes(dtype_, n);
  const uint64_t tail_max = codec::SplitTailMaxBytes(n);
  std::unique_ptr<char[]> head(new char[head_bytes]);
  exponents_.resize(n);
  codec::SplitEncodeHead(dtype_, src, n, reinterpret_cast<uint8_t*>(head.get()),
                         exponents_.data());
  std::string err = post(std::move(head), head_bytes, head_bytes + tail_max, false);
  if (!err.empty()) return err;
  std::unique_ptr<char[]> tail(new char[tail_max]);
  const uint64_t tail_bytes =
      codec::SplitEncodeTail(exponents_.data(), n, reinterpret_cast<uint8_t*>(tail.get()));
  return post(std::move(tail), tail_bytes, 0, true);
}

std::string HostPieceCodec::Decode(const char* in, uint64_t bytes, char* out, size_t n) {
  PieceReader reader(codec_, dtype_, in, bytes, n);
  for (size_t first = 0; first < n; first += kSegment) {
    std::string err = reader.Next(first, std::min(kSegment, n - first), out + first * itemsize_);
    if (!err.empty()) return err;
  }
  return reader.Finish();
}

std::string HostPieceCodec::DecodeReduce(const char* const* in, const uint64_t* bytes, size_t k,
                                         char* own, size_t n, Kernels& kernels, char* out,
                                         uint64_t* out_bytes, size_t* bad) {
  *bad = k;
  std::vector<PieceReader> readers;
  for (size_t i = 0; i < k; ++i) readers.emplace_back(codec_, dtype_, in[i], bytes[i], n);
  if (segments_.size() < k) segments_.resize(k);
  std::vector<const char*> inputs(k + 1);
  uint64_t at = 0;
  for (size_t first = 0; first < n; first += kSegment) {
    const size_t m = std::min(kSegment, n - first);
    char* mine = own + first * itemsize_;
    inputs[0] = mine;
    for (size_t i = 0; i < k; ++i) {
      segments_[i].resize(kSegment * itemsize_);
      std::string err = readers[i].Next(first, m, segments_[i].data());
      if (!err.empty()) {
        *bad = i;
        return err;
      }
      inputs[i + 1] = segments_[i].data();
    }
    std::string err = kernels.Reduce(inputs.data(), k + 1, mine, m);
    if (!err.empty()) return err;
    if (out) {
      at += codec::EncodeOnHost(codec_, dtype_, mine, m, reinterpret_cast<uint8_t*>(out) + at);
    }
  }
  for (size_t i = 0; i < k; ++i) {
    std::string err = readers[i].Finish();
    if (!err.empty()) {
      *bad = i;
      return err;
    }
  }
  if (out_bytes) *out_bytes = at;
  return "";
}

xla::ffi::Error NewHostPieceCodec(const std::string& what, int64_t codec_id,
                                  xla::ffi::DataType dtype, uint64_t split_bytes,
                                  std::unique_ptr<HostPieceCodec>* out) {
  out->reset();
  if (codec_id == 0) return xla::ffi::Error::Success();
  codec::DTypeId d;
  xla::ffi::Error bad = codec::CheckDType(what, dtype, &d);
  if (!bad.success()) return bad;
  if (codec_id != codec::kFixed && codec_id != codec::kEntropy) {
    return xla::ffi::Error::InvalidArgument(what + ": unknown codec id " +
                                            std::to_string(codec_id));
  }
  out->reset(new HostPieceCodec(static_cast<codec::CodecId>(codec_id), d, split_bytes));
  return xla::ffi::Error::Success();
}

}  // namespace jaxcc
