// The dataflow runner's interfaces: a schedule interpreter for push
// transports (Tcp) that lets steps overlap as far as the data allows, so a
// schedule cut into K chunks runs as a pipeline: chunk c+1's pieces cross the
// network while chunk c's are summed. The runner is in xla_ffi/cpu/dataflow.cc.
//
// A rank's work is a list of units in program order: each send, each copy it
// receives, and each step's reduce (every piece summed into one range). A
// unit waits only for what the IR's semantics (jaxcc/schedules/ir.py) make it
// wait for:
//   send   after the earlier units that write the range it reads (its value
//          must be the one after the sender's previous step);
//   apply  after the earlier units that write its range (write after write;
//          a reduce also reads it) and after the sends of this or an earlier
//          step that read it have left the buffer (write after read);
// and an apply also waits for its pieces to arrive. Ready sends go out in
// step order, so the transport's queues keep the schedule's port priorities.
// The result equals running the steps one after another, bit for bit (the
// same kernels sum the same inputs in the same order).
//
// With a PieceCodec each piece travels encoded. A send encodes its range into
// a buffer the transport owns (so it frees its range at once), or posts it in
// two parts when the codec splits it (the first leaves before the rest is
// coded); a copy decodes into place; a reduce sums its pieces into its range
// as the codec decodes them. A send that forwards exactly what an apply just
// wrote (and waits for nothing else) sends bytes the apply made: a copy's
// received bytes unchanged, a reduce's sum encoded in the same pass. Sizes on
// the wire are the encodings' real sizes.
//
// Every wait ends within the timeout with an error that names the peer and
// the step.
#ifndef JAXCC_DATAFLOW_H_
#define JAXCC_DATAFLOW_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "jaxcc/schedule.h"
#include "jaxcc/transport.h"

namespace jaxcc {

// A piece that reached this rank: its step and sender.
struct Arrival {
  int64_t step;
  int src;
};

// A push transport whose pieces may be in flight across steps.
class AsyncTransport {
 public:
  virtual ~AsyncTransport() = default;
  // Queues the `bytes` at `data` for `peer` as its piece of `step`. With
  // `owned` (which holds `data`) the transport keeps the bytes; else `data`
  // is in the rank's buffer and is read until Sync counts the piece written.
  virtual std::string Post(int64_t step, int peer, const char* data, uint64_t bytes,
                           std::unique_ptr<char[]> owned) = 0;
  // Appends the pieces that arrived since the last call to `arrived`; sets
  // (*written)[peer] to how many unowned pieces posted to `peer` have left the
  // buffer (they leave in posting order) and `events` to a counter that moves
  // whenever a piece arrives or leaves. Fails if the call was aborted or a
  // peer planned another schedule.
  virtual std::string Sync(std::vector<Arrival>* arrived, std::vector<int64_t>* written,
                           uint64_t* events) = 0;
  // Queues the next part of the piece of `step` for `peer`; the transport
  // keeps `data`. The receiver sees the piece once, when its last part came,
  // as the parts back to back; `bound`, with the first part, is the most they
  // take together.
  virtual std::string PostPart(int64_t step, int peer, std::unique_ptr<char[]> data,
                               uint64_t bytes, uint64_t bound, bool last) = 0;
  // The bytes of an arrived piece, valid until Release.
  virtual std::string View(int64_t step, int src, const char** data, uint64_t* bytes) = 0;
  virtual void Release(int64_t step, int src) = 0;
  // Blocks until the event counter differs from `events` or `deadline` passes.
  virtual void Wait(uint64_t events, std::chrono::steady_clock::time_point deadline) = 0;
  // Why `rank` cannot be reached any more; empty while it can.
  virtual std::string Lost(int rank) = 0;
  // What `rank`'s side sent that no call here has taken (frames for calls
  // that have not started here), for a timeout's message; empty if nothing.
  virtual std::string Stray(int rank) = 0;
  // How long `rank`'s side has sent nothing (its transport's beats included),
  // counted from `since` at the earliest: what tells a stopped or cut-off
  // peer from a slow one.
  virtual std::chrono::nanoseconds Silent(int rank,
                                          std::chrono::steady_clock::time_point since) = 0;
  // "rank r (process q)", for messages.
  virtual std::string Peer(int rank) const = 0;
  // Ends the call on this rank with `error` and tells the other ranks.
  virtual void Fail(const std::string& error) = 0;
};

// Hands a part of a piece to the transport: (data, bytes, bound, last).
using PostPart = std::function<std::string(std::unique_ptr<char[]>, uint64_t, uint64_t, bool)>;

// How pieces are encoded on the wire.
class PieceCodec {
 public:
  virtual ~PieceCodec() = default;
  // Bytes that hold Encode's output for n elements.
  virtual uint64_t MaxBytes(size_t n) const = 0;
  // Encodes the n elements at src into out (MaxBytes(n) bytes); sets *bytes.
  virtual std::string Encode(const char* src, size_t n, char* out, uint64_t* bytes) = 0;
  // Whether a send of the n elements at src goes in parts (SendSplit).
  virtual bool Splits(const char* src, size_t n) const = 0;
  // Encodes the n elements at src in parts, each handed to `post` as soon as
  // it is made; the first carries the bound of all parts together.
  virtual std::string SendSplit(const char* src, size_t n, const PostPart& post) = 0;
  // Decodes the `bytes` bytes at `in` (an encoding, or a split piece's parts
  // back to back) into the n elements at out.
  virtual std::string Decode(const char* in, uint64_t bytes, char* out, size_t n) = 0;
  // Sums the k encoded pieces in[i] (bytes[i] bytes) into the n elements at
  // own, in one pass: the kernel adds own and the pieces in that order, as
  // kernels.Reduce over whole pieces would. With `out` (MaxBytes(n) bytes) it
  // also encodes the sum there and sets *out_bytes. On a piece that does not
  // decode, *bad is its index (else k).
  virtual std::string DecodeReduce(const char* const* in, const uint64_t* bytes, size_t k,
                                   char* own, size_t n, Kernels& kernels, char* out,
                                   uint64_t* out_bytes, size_t* bad) = 0;
};

// Runs `plan` (this rank's steps) on `buf`, `length` elements of `itemsize`
// bytes, over `transport`; `codec` may be null (raw pieces). Every wait ends
// within `timeout`; a peer it waits for that is silent for `patience` (none
// if zero) fails the call as stuck, naming it. Returns an error message,
// empty on success.
std::string RunDataflow(const std::vector<RankStep>& plan, int64_t length,
                        AsyncTransport& transport, Kernels& kernels, PieceCodec* codec,
                        char* buf, size_t itemsize, std::chrono::milliseconds timeout,
                        std::chrono::nanoseconds patience);

}  // namespace jaxcc

#endif  // JAXCC_DATAFLOW_H_
