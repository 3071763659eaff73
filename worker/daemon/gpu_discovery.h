// The GPUs of this node, from `nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv`.
#ifndef TRAINCTL_WORKER_DAEMON_GPU_DISCOVERY_H_
#define TRAINCTL_WORKER_DAEMON_GPU_DISCOVERY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainctl/v1/worker.pb.h"

namespace trainctl::worker {

// Parses nvidia-smi's CSV (a header line, then `0, GPU-..., NVIDIA H100 80GB HBM3, 81559 MiB`).
// INVALID_ARGUMENT naming the line when a row is malformed.
absl::StatusOr<std::vector<trainctl::v1::GpuInfo>> ParseNvidiaSmiCsv(absl::string_view csv);

// Runs `nvidia_smi` (a path, or a name looked up in PATH) and parses its output. An empty list when
// the program does not exist (a CPU node); an error when it exists but fails.
absl::StatusOr<std::vector<trainctl::v1::GpuInfo>> DiscoverGpus(const std::string& nvidia_smi);

}  // namespace trainctl::worker

#endif  // TRAINCTL_WORKER_DAEMON_GPU_DISCOVERY_H_
