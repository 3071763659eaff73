// The node's topology as NCCL will find it: its GPUs (from GPU discovery, plus their PCI bus ids),
// the `nvidia-smi topo -m` matrix (topo_matrix.h), the RDMA ports under
// /sys/class/infiniband/<dev>/ports/<n>/, the network interfaces under /sys/class/net, whether a
// GPUDirect RDMA peer-memory module (nvidia_peermem, nv_peer_mem) is loaded, and the worker's
// NCCL-relevant environment. The worker sends it when it registers and when the coordinator asks
// for a fresh probe (trainctl nodes NODE --topology --refresh).
//
// Everything outside the process is injected (the nvidia-smi program, the sysfs root, the modules
// file, the environment), so tests run it against a fake nvidia-smi and a fake sysfs tree.
#ifndef TRAINCTL_WORKER_DAEMON_TOPOLOGY_PROBE_H_
#define TRAINCTL_WORKER_DAEMON_TOPOLOGY_PROBE_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "trainctl/v1/diagnostics.pb.h"
#include "trainctl/v1/worker.pb.h"

namespace trainctl::worker {

struct TopologyProbeOptions {
  // The GPUs the worker discovered (gpu_discovery.h); empty on a CPU node, where nvidia-smi is not
  // run at all.
  std::vector<trainctl::v1::GpuInfo> gpus;
  std::string nvidia_smi = "nvidia-smi";  // a path, or a name looked up in PATH
  absl::Duration nvidia_smi_timeout = absl::Seconds(30);
  std::string sysfs_root = "/sys";             // reads <root>/class/{infiniband,net}
  std::string proc_modules = "/proc/modules";  // loaded kernel modules
  // The worker's environment, or the part of it that matters (IsNcclRelevant); others are ignored.
  std::map<std::string, std::string> environment;
};

// NCCL_* variables and CUDA_VISIBLE_DEVICES: what the probe reports of the environment.
bool IsNcclRelevant(absl::string_view name);

// Probes the node. Never fails: whatever could not be probed (nvidia-smi failing or hanging, a
// matrix that does not parse, an unreadable sysfs file) is named in probe_errors and the rest is
// filled in. `node` is left empty (the coordinator sets it); probe_time is `now`.
trainctl::v1::NodeTopology ProbeTopology(const TopologyProbeOptions& options, absl::Time now);

// The parts, for tests.

// The output of `nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader`: index -> bus id.
// INVALID_ARGUMENT naming the line.
absl::StatusOr<std::map<int, std::string>> ParsePciBusIds(absl::string_view csv);

// The RDMA ports under <sysfs_root>/class/infiniband, by device then port. A missing
// class/infiniband is no error (no RDMA device); unreadable attributes are added to `errors`.
std::vector<trainctl::v1::RdmaPort> ReadRdmaPorts(const std::string& sysfs_root,
                                                  std::vector<std::string>* errors);

// The figure in a sysfs rate ("400 Gb/sec (4X NDR)" -> 400, "25 Gb/sec (1X EDR)" -> 25); 0 when
// there is none.
double ParseRateGbps(absl::string_view rate);

// The loaded peer-memory module named in a /proc/modules text ("nvidia_peermem" or
// "nv_peer_mem"), or "".
std::string FindPeerMemoryModule(absl::string_view proc_modules);

}  // namespace trainctl::worker

#endif  // TRAINCTL_WORKER_DAEMON_TOPOLOGY_PROBE_H_
