// The `diagnostics:` section of a job spec (DiagnosticsSpec in proto/trainctl/v1/diagnostics.proto)
// and the probe job kind: defaults and checks, called by ValidateJobSpec (common/job_spec.h).
//
//   diagnostics:
//     bandwidth_probe: true            # all_reduce/all_gather/reduce_scatter sweep before training
//     probe_sizes: [1048576, 16777216] # bytes; default 1 KiB .. 64 MiB by x4 (Gloo: .. 16 MiB)
//     probe_iterations: 5              # timed iterations per size, after one warm-up
//     nccl_log: true                   # NCCL_DEBUG=INFO on NCCL jobs, parsed into a report
//
// A `kind: probe` job runs the bandwidth probe alone (no model, no data, no output_dir needed).
// Pure functions, thread-safe.
#ifndef TRAINCTL_COMMON_DIAGNOSTICS_SPEC_H_
#define TRAINCTL_COMMON_DIAGNOSTICS_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/internal/spec_checker.h"
#include "trainctl/v1/job.pb.h"

namespace trainctl {

inline constexpr int kDefaultProbeIterations = 5;
inline constexpr int kMaxProbeIterations = 1000;
inline constexpr int kMaxProbeSizes = 32;
// A probe message is at least one float per rank and at most 1 GiB.
inline constexpr int64_t kMinProbeBytes = 4;
inline constexpr int64_t kMaxProbeBytes = int64_t{1} << 30;

// The sweep of a probe without probe_sizes: 1 KiB, 4 KiB, ... by x4 up to 64 MiB on NCCL and
// 16 MiB elsewhere (Gloo on CPUs).
std::vector<int64_t> DefaultProbeSizes(bool nccl);

// spec.diagnostics' fields in range ("spec.diagnostics.probe_sizes[2]: must be in [4, 1073741824]
// bytes, got 0"); probe_* set without a probe to run is an error too.
void CheckDiagnostics(const trainctl::v1::JobSpec& spec, internal::Checker& c);

// True when the job runs the bandwidth probe (a probe job, or diagnostics.bandwidth_probe).
bool RunsBandwidthProbe(const trainctl::v1::JobSpec& spec);

// diagnostics.nccl_log, default true.
bool NcclLogEnabled(const trainctl::v1::JobSpec& spec);

}  // namespace trainctl

#endif  // TRAINCTL_COMMON_DIAGNOSTICS_SPEC_H_
