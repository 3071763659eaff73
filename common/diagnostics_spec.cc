#include "common/diagnostics_spec.h"

#include "absl/strings/str_cat.h"

namespace trainctl {

std::vector<int64_t> DefaultProbeSizes(bool nccl) {
  std::vector<int64_t> sizes;
  const int64_t last = nccl ? (int64_t{64} << 20) : (int64_t{16} << 20);
  for (int64_t bytes = 1024; bytes <= last; bytes *= 4) sizes.push_back(bytes);
  return sizes;
}

bool RunsBandwidthProbe(const trainctl::v1::JobSpec& spec) {
  return spec.kind() == trainctl::v1::JOB_KIND_PROBE || spec.diagnostics().bandwidth_probe();
}

bool NcclLogEnabled(const trainctl::v1::JobSpec& spec) {
  return !spec.diagnostics().has_nccl_log() || spec.diagnostics().nccl_log();
}

void CheckDiagnostics(const trainctl::v1::JobSpec& spec, internal::Checker& c) {
  const trainctl::v1::DiagnosticsSpec& d = spec.diagnostics();
  const std::string path = "spec.diagnostics";
  if (d.probe_sizes_size() > kMaxProbeSizes) {
    c.Fail(path + ".probe_sizes",
           absl::StrCat("at most ", kMaxProbeSizes, " sizes, got ", d.probe_sizes_size()));
  }
  for (int i = 0; i < d.probe_sizes_size() && i < kMaxProbeSizes; ++i) {
    const int64_t bytes = d.probe_sizes(i);
    if (bytes < kMinProbeBytes || bytes > kMaxProbeBytes) {
      c.Fail(absl::StrCat(path, ".probe_sizes[", i, "]"),
             absl::StrCat("must be in [", kMinProbeBytes, ", ", kMaxProbeBytes, "] bytes, got ",
                          bytes));
    }
  }
  if (d.has_probe_iterations() &&
      (d.probe_iterations() < 1 || d.probe_iterations() > kMaxProbeIterations)) {
    c.Fail(path + ".probe_iterations",
           absl::StrCat("must be in [1, ", kMaxProbeIterations, "], got ", d.probe_iterations()));
  }
  if (!RunsBandwidthProbe(spec) && (d.probe_sizes_size() > 0 || d.has_probe_iterations())) {
    c.Fail(path + ".bandwidth_probe",
           "probe_sizes/probe_iterations are set but no probe runs: set bandwidth_probe: true "
           "(or submit a `kind: probe` job)");
  }
  if (spec.kind() == trainctl::v1::JOB_KIND_PROBE && d.has_bandwidth_probe() &&
      !d.bandwidth_probe()) {
    c.Fail(path + ".bandwidth_probe", "a probe job runs the probe; it cannot be false");
  }
}

}  // namespace trainctl
