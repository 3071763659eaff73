// The bandwidth probe: all_reduce, all_gather and reduce_scatter over the job's own comm layer
// (zero::Comm: NCCL on GPUs, Gloo on CPUs with its fallbacks) at a sweep of sizes, reported with
// nccl-tests' figures (doc/PERFORMANCE.md there): algbw = S / t with S the whole buffer (for
// all_gather and reduce_scatter the total over ranks), busbw = algbw x 2(n-1)/n for all_reduce and
// x (n-1)/n for all_gather and reduce_scatter. The time of a row is the slowest rank's mean.
//
// Each timed iteration starts after a barrier, and each rank measures from there to the moment its
// own result is in place; every rank's mean goes into the report, so a rank whose device, memory or
// link is slow shows a longer time than its peers (a rank that arrives late instead makes all the
// others wait, and the row's time grows for everyone).
#ifndef TRAINCTL_WORKER_TRAINER_DIAGNOSTICS_BANDWIDTH_PROBE_H_
#define TRAINCTL_WORKER_TRAINER_DIAGNOSTICS_BANDWIDTH_PROBE_H_

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainctl/v1/diagnostics.pb.h"
#include "worker/trainer/event_sink.h"
#include "worker/trainer/zero/comm.h"

namespace trainctl::trainer {

struct BandwidthProbeOptions {
  // Message sizes in bytes; each is rounded down to whole float32 elements divisible by the world
  // size (at least one per rank), and the row reports the bytes actually moved.
  std::vector<int64_t> sizes;
  int iterations = 5;  // timed, per collective and size
  int warmup = 1;      // untimed, before them
  std::string host;    // this rank's host, for BandwidthReport.rank_hosts
  // Tests: runs on this rank after each timed collective, inside its timing.
  std::function<void(const std::string& collective, int64_t bytes)> after_collective;
};

// Options from the job's diagnostics section: its sizes or DefaultProbeSizes for the backend, its
// iterations or kDefaultProbeIterations.
BandwidthProbeOptions BandwidthProbeOptionsFor(const trainctl::v1::DiagnosticsSpec& spec,
                                               const std::string& backend, const std::string& host);

// Runs the sweep on every rank of `comm` together (a collective call: every rank must call it with
// the same sizes and iterations) and returns the whole report on every rank. INVALID_ARGUMENT for
// options out of range; UNAVAILABLE when a collective fails (a peer is gone).
absl::StatusOr<trainctl::v1::BandwidthReport> RunBandwidthProbe(
    zero::Comm& comm, const torch::Device& device, const BandwidthProbeOptions& options);

// nccl-tests' bus-bandwidth factor of `collective` on `world` ranks: 2(n-1)/n or (n-1)/n.
double BusBandwidthFactor(const std::string& collective, int world);

// The `bandwidth` event {"report": {...}} (rank times of the smallest sizes left out first if the
// report would not fit one event line), and a table of the rows on stdout.
void EmitBandwidthReport(const trainctl::v1::BandwidthReport& report, EventSink* events);

}  // namespace trainctl::trainer

#endif  // TRAINCTL_WORKER_TRAINER_DIAGNOSTICS_BANDWIDTH_PROBE_H_
