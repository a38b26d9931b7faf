// The gossip exchange over the Tcp transport, the two halves that the FFI
// handlers (jaxcc_exchange_start / jaxcc_exchange_done, exchange.cc) and the
// host path (module.cc's exchange_start / exchange_done, called from host
// callbacks of any backend's program) share.
//
// ExchangeStart registers what `rank` receives (a piece of `itemsize * n`
// bytes, or its encoding, from each recv_from[j] as slot j), posts a copy of
// the n elements at `data` (encoded with `codec_id` for elements of
// `codec_type`) to each send_to[j] as slot j, and sets *handle at once: the
// pieces travel on the transport's progress thread. ExchangeDone waits for the
// m exchanges `handles` and writes, per exchange, its k rows into `out`
// (row_bytes each), a status per slot (1 arrived, 0 none expected, -1 the
// peer's connection is lost) and, per rank of `lost` (nlost), 1 if its
// process' connection is lost. From a call site's second done on (a call
// site: the op id of the first exchange), a peer whose process sends no byte
// (a live one's transport beats every 100 ms, however slow its compute) for
// half the call site's period (the time from its previous done to this one;
// at least 500 ms) while the done waits for its piece is stuck: its
// connection is dropped (closed, its reason saying "stuck past") and its
// slots are lost. A piece that does not come within `timeout_ms` while its
// peer's connection is up fails the wait, naming the peer. Errors:
// InvalidArgument for bad input, Internal for the transport.
#ifndef JAXCC_CPU_EXCHANGE_H_
#define JAXCC_CPU_EXCHANGE_H_

#include <cstddef>
#include <cstdint>

#include "xla/ffi/api/ffi.h"

namespace jaxcc {

xla::ffi::Error ExchangeStart(const char* data, size_t n, size_t itemsize,
                              xla::ffi::DataType codec_type,
                              xla::ffi::Span<const int32_t> send_to,
                              xla::ffi::Span<const int32_t> recv_from, int rank, int64_t nranks,
                              int64_t op_id, int64_t digest, xla::ffi::Span<const int64_t> procs,
                              int64_t codec_id, int64_t timeout_ms, int32_t* handle);

xla::ffi::Error ExchangeDone(xla::ffi::Span<const int32_t> handles, char* out, size_t out_bytes,
                             size_t itemsize, int32_t* status, size_t status_count, int32_t* lost,
                             size_t nlost);

}  // namespace jaxcc

#endif  // JAXCC_CPU_EXCHANGE_H_
