// jaxcc.sim.simulate (jaxcc/sim/simulate.py) in C++: the same hops over the
// same ports, the same dataflow dependencies between transfers and writes and
// the same events in the same order, so every number is the Python one bit
// for bit.
#ifndef JAXCC_CPU_SIMULATE_H_
#define JAXCC_CPU_SIMULATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "jaxcc/schedule.h"

namespace jaxcc {

// `size` values at `data`.
template <typename T>
struct Span {
  const T* data;
  int64_t size;
  T operator[](int64_t i) const { return data[i]; }
};

// Schedule.table: `rows` rows of the columns of jaxcc/schedule.h, sorted by step.
struct SimTable {
  const int64_t* data;
  int64_t rows;
  int64_t operator()(int64_t row, int64_t column) const { return data[row * kColumns + column]; }
};

// The ports of a Topology, one entry per rank (message_cost: seconds a
// message holds each port of the rank beside its bytes). `clusters` false: a
// flat topology, and the other fields are unused.
struct SimNetwork {
  Span<double> send, recv, latency, message_cost;
  bool clusters;
  Span<int64_t> cluster, relay;  // Topology.cluster and Topology.relay(rank)
  Span<double> inter_send, inter_recv, inter_latency;
  bool port_blocking_latency;
};

struct SimResult {
  double time;        // the last time a write was applied
  int64_t unapplied;  // writes never applied (a dependency cycle); 0 normally
  std::vector<double> tx_busy, rx_busy;            // per port (2 nranks): seconds held
  std::vector<double> bytes_sent, bytes_received;  // per rank
};

// The timing of a schedule of `nranks` ranks, buffers of `length` elements of
// `itemsize` bytes and `num_steps` steps over `network`. Returns an error
// message for inconsistent input, else "" and *out.
std::string Simulate(const SimTable& table, double itemsize, int64_t nranks, int64_t length,
                     int64_t num_steps, const SimNetwork& network, SimResult* out);

}  // namespace jaxcc

#endif  // JAXCC_CPU_SIMULATE_H_
