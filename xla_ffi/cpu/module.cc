// _jaxcc_cpu: the CPU FFI handlers of jaxcc, registered for platform "cpu" by
// jaxcc/_src/ffi.py.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "exchange.h"
#include "hmac_sha256.h"
#include "jaxcc/module.h"
#include "jaxcc/piece_layout.h"
#include "jaxcc/schedule.h"
#include "piece_codec.h"
#include "reduce_host.h"
#include "simulate.h"
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
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxccLocalCollective);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxccExchangeStart);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxccExchangeDone);

namespace {

// A transport call's error as a Python RuntimeError; nothing if it is empty.
void Raise(const std::string& err) {
  if (!err.empty()) throw std::runtime_error("jaxcc: " + err);
}

std::chrono::milliseconds Millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1e3));
}

template <typename T>
using Vector = nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

template <typename T>
jaxcc::Span<T> View(const Vector<T>& a) {
  return {a.data(), static_cast<int64_t>(a.shape(0))};
}

// Every target of this module. Add new handlers here.
constexpr jaxcc::Target kTargets[] = {
    {"jaxcc_reduce", JaxccReduce},
    {"jaxcc_codec_encode_fixed", JaxccCodecEncodeFixed},
    {"jaxcc_codec_decode_fixed", JaxccCodecDecodeFixed},
    {"jaxcc_codec_encode_entropy", JaxccCodecEncodeEntropy},
    {"jaxcc_codec_decode_entropy", JaxccCodecDecodeEntropy},
    {"jaxcc_collective", JaxccCollective},
    {"jaxcc_local_collective", JaxccLocalCollective},
    {"jaxcc_exchange_start", JaxccExchangeStart},
    {"jaxcc_exchange_done", JaxccExchangeDone},
};

}  // namespace

NB_MODULE(_jaxcc_cpu, m) {
  m.doc() = "jaxcc CPU handlers for XLA FFI custom calls.";
  jaxcc::DefineRegistrations(m, kTargets);
  m.def(
      "tcp_start",
      [](int process, std::vector<int> fds, std::vector<nb::bytes> keys, bool integrity,
         const std::string& unconnected) {
        std::vector<std::string> key_bytes;
        for (const nb::bytes& k : keys) key_bytes.emplace_back(k.c_str(), k.size());
        Raise(jaxcc::TcpStart(process, fds, key_bytes, integrity, unconnected));
      },
      nb::arg("process"), nb::arg("fds"), nb::arg("keys"), nb::arg("integrity"),
      nb::arg("unconnected") = "",
      "Starts the TCP transport as `process` over authenticated sockets: fds[q] to process q, "
      "-1 for this one, keys[q] its connection key; with `integrity` every frame carries an "
      "HMAC-SHA256 under it. Takes the sockets over. fds[q] = -1 for another process: not "
      "connected, its connection lost for the reason `unconnected` until tcp_rejoin.");
  m.def(
      "tcp_rejoin",
      [](int process, int fd, nb::bytes key) {
        Raise(jaxcc::TcpRejoin(process, fd, std::string(key.c_str(), key.size())));
      },
      nb::arg("process"), nb::arg("fd"), nb::arg("key"),
      "Replaces the connection to `process` by the authenticated socket fd with its key. Takes "
      "the socket over.");
  m.def("tcp_process", &jaxcc::TcpProcess,
        "This process' index in the TCP transport; -1 before tcp_start.");
  m.def("tcp_lost", &jaxcc::TcpLost, nb::arg("process"),
        "Why the connection to `process` is lost; empty while it is up.");
  m.def("tcp_lost_at", &jaxcc::TcpLostAt, nb::arg("process"),
        "When the connection to `process` was found lost (Unix seconds); 0 while it is up.");
  m.attr("tcp_stuck_floor_s") = std::chrono::duration<double>(jaxcc::kMinPatience).count();
  m.def("tcp_silent_s", &jaxcc::TcpSilentS, nb::arg("process"),
        "How long `process` has sent nothing on a connection that is up (seconds; an idle "
        "connection beats every 100 ms); 0 while its bytes wait unread or it is lost.");
  m.def("tcp_instances", &jaxcc::TcpInstances,
        "The next instance of every (op id, group, rank) run here, as (op, group, rank, next).");
  m.def(
      "tcp_set_instances",
      [](const jaxcc::TcpInstanceCounts& counts) {
        const std::string err = jaxcc::TcpSetInstances(counts);
        if (!err.empty()) throw std::invalid_argument("jaxcc: " + err);
      },
      nb::arg("counts"), "Sets instance counts that tcp_instances gave (a restarted process).");
  m.def(
      "tcp_send_bytes",
      [](int process, int64_t tag, nb::bytes data) {
        Raise(jaxcc::TcpSendBytes(process, tag, std::string(data.c_str(), data.size())));
      },
      nb::arg("process"), nb::arg("tag"), nb::arg("data"),
      "Queues `data` for `process` as the host message `tag` (returns at once).");
  m.def(
      "tcp_recv_bytes",
      [](int process, int64_t tag, uint64_t max_bytes, double timeout_s) {
        std::string out, err;
        {
          nb::gil_scoped_release release;
          err = jaxcc::TcpRecvBytes(process, tag, max_bytes, Millis(timeout_s), &out);
        }
        Raise(err);
        return nb::bytes(out.data(), out.size());
      },
      nb::arg("process"), nb::arg("tag"), nb::arg("max_bytes"), nb::arg("timeout_s"),
      "Waits for `process`'s host message `tag` (at most max_bytes) and returns it.");
  m.def(
      "tcp_flush",
      [](double timeout_s) {
        std::string err;
        {
          nb::gil_scoped_release release;
          err = jaxcc::TcpFlush(Millis(timeout_s));
        }
        Raise(err);
      },
      nb::arg("timeout_s"), "Waits until every queued frame has been written (before an exit).");
  m.def(
      "tcp_records",
      [](uint64_t since) {
        std::vector<jaxcc::FrameRecord> records;
        const uint64_t next = jaxcc::TcpRecords(since, &records);
        return std::make_pair(next, nb::bytes(reinterpret_cast<const char*>(records.data()),
                                              records.size() * sizeof(jaxcc::FrameRecord)));
      },
      nb::arg("since"),
      "The frames the Tcp transport timed since the `since`-th, as (next since, packed records: "
      "peer i32, direction i32 (0 received, 1 sent), op id i64, instance i64, first ns i64, "
      "last ns i64, bytes u64; CLOCK_REALTIME, received frames by the kernel's stamps).");
  m.def("tcp_unpace", &jaxcc::TcpUnpace,
        "Clears every connection's pacing (the next paced call sets its rates again).");
  m.def(
      "exchange_start",
      [](nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu> x, Vector<int32_t> send_to,
         Vector<int32_t> recv_from, int rank, int64_t nranks, int64_t op_id, int64_t digest,
         Vector<int64_t> procs, int64_t codec, int64_t codec_type, int64_t timeout_ms) {
        int32_t handle = -1;
        xla::ffi::Error err;
        {
          nb::gil_scoped_release release;
          err = jaxcc::ExchangeStart(
              static_cast<const char*>(x.data()), x.size(), x.itemsize(),
              static_cast<xla::ffi::DataType>(codec_type),
              xla::ffi::Span<const int32_t>(send_to.data(), send_to.shape(0)),
              xla::ffi::Span<const int32_t>(recv_from.data(), recv_from.shape(0)), rank,
              nranks, op_id, digest, xla::ffi::Span<const int64_t>(procs.data(), procs.shape(0)),
              codec, timeout_ms, &handle);
        }
        if (!err.success()) throw std::runtime_error(err.message());
        return handle;
      },
      nb::arg("x"), nb::arg("send_to"), nb::arg("recv_from"), nb::arg("rank"), nb::arg("nranks"),
      nb::arg("op_id"), nb::arg("digest"), nb::arg("procs"), nb::arg("codec"),
      nb::arg("codec_type"), nb::arg("timeout_ms"),
      "The host path's jaxcc_exchange_start: posts x (flat, C order) to the ranks send_to and "
      "returns the exchange's handle at once (codec_type: the FFI type of x's elements).");
  m.def(
      "exchange_done",
      [](Vector<int32_t> handles, nb::ndarray<nb::c_contig, nb::device::cpu> out,
         nb::ndarray<int32_t, nb::c_contig, nb::device::cpu> status,
         nb::ndarray<int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> lost) {
        xla::ffi::Error err;
        {
          nb::gil_scoped_release release;
          err = jaxcc::ExchangeDone(
              xla::ffi::Span<const int32_t>(handles.data(), handles.shape(0)),
              static_cast<char*>(out.data()), out.nbytes(), out.itemsize(), status.data(),
              status.size(), lost.data(), lost.shape(0));
        }
        if (!err.success()) throw std::runtime_error(err.message());
      },
      nb::arg("handles"), nb::arg("out"), nb::arg("status"), nb::arg("lost"),
      "The host path's jaxcc_exchange_done: waits for the exchanges `handles` and writes the "
      "pieces (m x k x n) into out, a status per slot into status and the lost ranks into lost.");
  m.def("tcp_blocked_ns", &jaxcc::TcpBlockedNs,
        "Nanoseconds this process' calls spent blocked on the network (Tcp collectives and "
        "gossip exchange waits).");
  // The Tcp transport's piece layouts (piece_codec.h) and the Nccl transport's coded steps
  // (jaxcc/piece_layout.h), for tests.
  using Ids = std::pair<jaxcc::codec::CodecId, jaxcc::codec::DTypeId>;
  auto ids = [](int codec, int dtype) -> Ids {
    namespace c = jaxcc::codec;
    if ((codec != c::kFixed && codec != c::kEntropy) || dtype < c::kBF16 || dtype > c::kF32) {
      throw std::invalid_argument("jaxcc: unknown codec or dtype id");
    }
    return {static_cast<c::CodecId>(codec), static_cast<c::DTypeId>(dtype)};
  };
  auto piece_codec = [ids](int codec, int dtype, uint64_t split_bytes) {
    const auto [c, d] = ids(codec, dtype);
    return jaxcc::HostPieceCodec(c, d, split_bytes);
  };
  m.def(
      "piece_encode",
      [piece_codec](int codec, int dtype, nb::bytes x, bool split) {
        jaxcc::HostPieceCodec pc = piece_codec(codec, dtype, split ? 1 : 0);
        const size_t n = x.size() / jaxcc::codec::Info(static_cast<jaxcc::codec::DTypeId>(dtype))
                                        .elem_bytes;
        std::string out;
        std::string err;
        if (pc.Splits(x.c_str(), n)) {
          err = pc.SendSplit(x.c_str(), n, [&](std::unique_ptr<char[]> part, uint64_t bytes,
                                               uint64_t, bool) {
            out.append(part.get(), bytes);
            return std::string();
          });
        } else {
          out.resize(pc.MaxBytes(n));
          uint64_t bytes = 0;
          err = pc.Encode(x.c_str(), n, out.data(), &bytes);
          out.resize(bytes);
        }
        Raise(err);
        return nb::bytes(out.data(), out.size());
      },
      nb::arg("codec"), nb::arg("dtype"), nb::arg("x"), nb::arg("split"),
      "The bytes a piece of the elements in x travels as over TCP: split (both parts back to "
      "back) if `split` and the codec splits it, else segmented.");
  m.def(
      "piece_decode",
      [piece_codec](int codec, int dtype, nb::bytes data, size_t n) {
        jaxcc::HostPieceCodec pc = piece_codec(codec, dtype, 0);
        std::string out(n * jaxcc::codec::Info(static_cast<jaxcc::codec::DTypeId>(dtype))
                                .elem_bytes, '\0');
        const std::string err = pc.Decode(data.c_str(), data.size(), out.data(), n);
        if (!err.empty()) throw std::invalid_argument("jaxcc: cannot decode the piece: " + err);
        return nb::bytes(out.data(), out.size());
      },
      nb::arg("codec"), nb::arg("dtype"), nb::arg("data"), nb::arg("n"),
      "Decodes a piece of n elements that piece_encode made.");
  m.def(
      "piece_decode_reduce",
      [piece_codec](int codec, int dtype, std::vector<nb::bytes> pieces, nb::bytes own,
                    bool encode) {
        namespace c = jaxcc::codec;
        jaxcc::HostPieceCodec pc = piece_codec(codec, dtype, 0);
        const size_t n = own.size() / c::Info(static_cast<c::DTypeId>(dtype)).elem_bytes;
        static constexpr xla::ffi::DataType kTypes[] = {xla::ffi::BF16, xla::ffi::F16,
                                                        xla::ffi::F32};
        jaxcc::HostKernels kernels(kTypes[dtype - 1]);
        std::string sum(own.c_str(), own.size()), out(encode ? pc.MaxBytes(n) : 0, '\0');
        std::vector<const char*> in;
        std::vector<uint64_t> sizes;
        for (const nb::bytes& p : pieces) {
          in.push_back(p.c_str());
          sizes.push_back(p.size());
        }
        uint64_t out_bytes = 0;
        size_t bad = 0;
        const std::string err =
            pc.DecodeReduce(in.data(), sizes.data(), in.size(), sum.data(), n, kernels,
                            encode ? out.data() : nullptr, &out_bytes, &bad);
        if (!err.empty()) {
          throw std::invalid_argument("jaxcc: cannot sum piece " + std::to_string(bad) + ": " +
                                      err);
        }
        return std::make_pair(nb::bytes(sum.data(), sum.size()), nb::bytes(out.data(), out_bytes));
      },
      nb::arg("codec"), nb::arg("dtype"), nb::arg("pieces"), nb::arg("own"), nb::arg("encode"),
      "own + pieces[0] + ... summed in one pass as a reduce hop does (jaxcc_reduce's order and "
      "rounding), and, if `encode`, the sum encoded as a segmented piece.");
  m.def(
      "coded_plan",
      [ids](const Vector<int64_t>& table, int64_t num_steps, int nranks, int rank,
            int64_t length, int codec, int dtype) {
        const auto [c, d] = ids(codec, dtype);
        std::vector<jaxcc::RankStep> plan;
        const std::string err = jaxcc::PlanRank(table.data(), table.shape(0), num_steps, nranks,
                                                rank, length, &plan);
        if (!err.empty()) throw std::invalid_argument("jaxcc: " + err);
        const jaxcc::piece::CodedPlan coded = jaxcc::piece::PlanCoded(plan, c, d);
        nb::list steps;
        for (const jaxcc::piece::CodedStep& s : coded.steps) {
          nb::list sends, recvs;
          for (const jaxcc::piece::CodedSend& x : s.sends) {
            sends.append(nb::make_tuple(x.piece.peer, x.piece.src_start, x.piece.dst_start,
                                        x.piece.length, x.forwards, x.forwards_sum, x.offset,
                                        x.word));
          }
          for (const jaxcc::piece::CodedRecv& x : s.recvs) {
            recvs.append(nb::make_tuple(x.piece.peer, x.piece.src_start, x.piece.dst_start,
                                        x.piece.length, x.reduce, x.offset, x.word));
          }
          steps.append(nb::make_tuple(sends, recvs, s.keeps_sum, s.send_words, s.recv_words));
        }
        nb::dict totals;
        totals["send_bytes"] = coded.send_bytes;
        totals["staging_bytes"] = coded.staging_bytes;
        totals["sum_bytes"] = coded.sum_bytes;
        totals["words"] = coded.words;
        totals["reduce_inputs"] = coded.reduce_inputs;
        totals["reduce_length"] = coded.reduce_length;
        return nb::make_tuple(steps, totals);
      },
      nb::arg("table"), nb::arg("num_steps"), nb::arg("nranks"), nb::arg("rank"),
      nb::arg("length"), nb::arg("codec"), nb::arg("dtype"),
      "The Nccl transport's coded steps of `rank` (jaxcc/piece_layout.h: PlanCoded), for tests: "
      "([(sends, recvs, keeps_sum, send_words, recv_words)], totals). A send is (peer, "
      "src_start, dst_start, length, forwards, forwards_sum, offset, word), a recv (peer, "
      "src_start, dst_start, length, reduce, offset, word).");
  m.def(
      "piece_max_bytes",
      [ids](int codec, int dtype, uint64_t n) {
        const auto [c, d] = ids(codec, dtype);
        return jaxcc::piece::MaxPieceBytes(c, d, n);
      },
      nb::arg("codec"), nb::arg("dtype"), nb::arg("n"),
      "The most a segmented piece of n elements takes (jaxcc/piece_layout.h).");
  m.def(
      "hop_work_layout",
      [ids](int codec, int dtype, uint64_t n, uint64_t k, bool sum, bool encode) {
        const auto [c, d] = ids(codec, dtype);
        const jaxcc::piece::HopWork w = jaxcc::piece::HopWorkLayout(c, d, n, k, sum, encode);
        nb::dict out;
        out["inputs"] = w.inputs;
        out["spill"] = w.spill;
        out["meta"] = w.meta;
        out["spill_size"] = w.spill_size;
        out["spill_offset"] = w.spill_offset;
        out["planes"] = w.planes;
        out["nz"] = w.nz;
        out["bitmap"] = w.bitmap;
        out["slots"] = w.slots;
        out["block_sizes"] = w.block_sizes;
        out["decoded"] = w.decoded;
        out["bytes"] = w.bytes;
        out["hop_input_bytes"] = sizeof(jaxcc::piece::HopInput);
        return out;
      },
      nb::arg("codec"), nb::arg("dtype"), nb::arg("n"), nb::arg("k"), nb::arg("sum"),
      nb::arg("encode"),
      "Where the device work areas of one hop lie (jaxcc/piece_layout.h: HopWorkLayout), for "
      "tests.");
  m.def(
      "segment_offsets",
      [ids](int codec, int dtype, uint64_t n, const std::vector<uint32_t>& sizes,
            uint64_t cap) {
        const auto [c, d] = ids(codec, dtype);
        if (sizes.size() != jaxcc::piece::Segments(n)) {
          throw std::invalid_argument("jaxcc: " + std::to_string(sizes.size()) +
                                      " sizes for " +
                                      std::to_string(jaxcc::piece::Segments(n)) + " segments");
        }
        std::vector<uint64_t> offsets(sizes.size());
        uint64_t total = 0;
        const std::string err =
            jaxcc::piece::SegmentOffsets(c, d, n, sizes.data(), cap, offsets.data(), &total);
        if (!err.empty()) throw std::invalid_argument("jaxcc: " + err);
        return std::make_pair(offsets, total);
      },
      nb::arg("codec"), nb::arg("dtype"), nb::arg("n"), nb::arg("sizes"), nb::arg("cap"),
      "Where a received piece's segments start, from their announced sizes, and its total "
      "(jaxcc/piece_layout.h: SegmentOffsets), for tests.");
  m.def(
      "simulate",
      [](nb::ndarray<const int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> table,
         double itemsize, int64_t nranks, int64_t length, int64_t num_steps,
         const Vector<double>& send, const Vector<double>& recv, const Vector<double>& latency,
         const Vector<double>& message_cost,
         const std::optional<std::tuple<Vector<int64_t>, Vector<int64_t>, Vector<double>,
                                        Vector<double>, Vector<double>>>& clusters,
         bool port_blocking_latency) {
        if (table.shape(1) != jaxcc::kColumns) {
          throw std::invalid_argument("jaxcc.sim.simulate: the table has " +
                                      std::to_string(table.shape(1)) + " columns, not " +
                                      std::to_string(jaxcc::kColumns));
        }
        const jaxcc::SimTable t{table.data(), static_cast<int64_t>(table.shape(0))};
        jaxcc::SimNetwork network{View(send), View(recv), View(latency), View(message_cost),
                                  clusters.has_value(),
                                  {}, {}, {}, {}, {}, port_blocking_latency};
        if (clusters) {
          const auto& [cluster, relay, inter_send, inter_recv, inter_latency] = *clusters;
          network.cluster = View(cluster);
          network.relay = View(relay);
          network.inter_send = View(inter_send);
          network.inter_recv = View(inter_recv);
          network.inter_latency = View(inter_latency);
        }
        jaxcc::SimResult out;
        std::string err;
        {
          nb::gil_scoped_release release;
          err = jaxcc::Simulate(t, itemsize, nranks, length, num_steps, network, &out);
        }
        if (!err.empty()) throw std::invalid_argument("jaxcc.sim.simulate: " + err);
        return nb::make_tuple(out.time, out.unapplied, out.tx_busy, out.rx_busy, out.bytes_sent,
                              out.bytes_received);
      },
      nb::arg("table"), nb::arg("itemsize"), nb::arg("nranks"), nb::arg("length"),
      nb::arg("num_steps"), nb::arg("send"), nb::arg("recv"), nb::arg("latency"),
      nb::arg("message_cost"), nb::arg("clusters").none(), nb::arg("port_blocking_latency"),
      "jaxcc.sim.simulate's timing of a Schedule.table (sorted by step) over a Topology's "
      "per-rank ports: send, recv, latency and message_cost, and clusters (cluster, relay, "
      "inter_send, inter_recv, inter_latency) or None. Returns (completion time, writes never "
      "applied, tx and rx busy seconds per port (2 nranks), bytes sent and received per rank).");
  m.def(
      "hmac_sha256",
      [](nb::bytes key, nb::bytes data) {
        jaxcc::HmacSha256 mac(reinterpret_cast<const uint8_t*>(key.c_str()), key.size());
        // Fed in pieces of several sizes, so that the partial-block paths run.
        const char* at = data.c_str();
        size_t left = data.size();
        for (size_t piece : {size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{1000}, left}) {
          const size_t n = std::min(piece, left);
          mac.Update(at, n);
          at += n;
          left -= n;
        }
        uint8_t out[32];
        mac.Final(out);
        return nb::bytes(reinterpret_cast<const char*>(out), sizeof(out));
      },
      nb::arg("key"), nb::arg("data"),
      "HMAC-SHA256 of `data` under `key` as the TCP transport computes frame MACs, for tests.");
}
