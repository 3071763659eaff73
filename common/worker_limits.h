// What a worker may say on its session (proto/trainctl/v1/worker.proto), and the checks that hold
// it to that. The coordinator runs them on every message it receives (a worker is a peer on the
// network, not trusted code); the worker runs CheckRegisterWorker on its own flags at start-up and
// keeps what it sends within the limits. docs/limits.md ("Limits: workers") lists them for users.
#ifndef TRAINCTL_COMMON_WORKER_LIMITS_H_
#define TRAINCTL_COMMON_WORKER_LIMITS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "trainctl/v1/worker.pb.h"

namespace trainctl {

// A node offers at most this many slots (GPUs, or CPU slots when it has no GPU).
inline constexpr int kMaxNodeSlots = 1024;
// Node names: 1..253 bytes of [A-Za-z0-9._-], starting with a letter or digit (a host name fits).
inline constexpr size_t kMaxNodeNameBytes = 253;
// advertise_addr: 1..253 bytes of [A-Za-z0-9._:-[]] (a host name, IPv4 or IPv6 address).
inline constexpr size_t kMaxAddressBytes = 253;
// Labels: at most 64; keys 1..63 bytes and values 0..63 bytes of [A-Za-z0-9._/:-].
inline constexpr int kMaxNodeLabels = 64;
inline constexpr size_t kMaxLabelBytes = 63;
// boot_id, task ids, job ids, GPU uuids and names: at most this many bytes, no control characters.
inline constexpr size_t kMaxIdBytes = 256;
// A rank number or world size larger than this is refused.
inline constexpr int kMaxRank = 1 << 20;
// One log line's text or one trainer event line (the rank launcher cuts longer lines in pieces).
inline constexpr size_t kMaxLineBytes = 64 * 1024;
// One LogBatch: lines and bytes of text. The worker flushes a batch before either is reached.
inline constexpr int kMaxLogBatchLines = 4096;
inline constexpr size_t kMaxLogBatchBytes = 1 << 20;
// TaskStatus: last_log_lines kept, and the length of its message.
inline constexpr int kMaxStatusTailLines = 32;
inline constexpr size_t kMaxMessageBytes = 64 * 1024;

// NodeTopology (a worker's topology probe, worker/daemon/topology_probe.h): devices of the
// `nvidia-smi topo -m` matrix, RDMA ports, network interfaces, NCCL variables, probe errors; the
// length of free text (an environment value, a probe error), and of the matrix as printed.
inline constexpr int kMaxTopologyDevices = 256;
inline constexpr int kMaxTopologyRdmaPorts = 256;
inline constexpr int kMaxTopologyInterfaces = 512;
inline constexpr int kMaxTopologyEnv = 128;
inline constexpr int kMaxTopologyProbeErrors = 64;
inline constexpr size_t kMaxTopologyTextBytes = 4096;
inline constexpr size_t kMaxTopoMatrixBytes = 256 * 1024;

// INVALID_ARGUMENT naming the first field out of range or of the wrong shape
// ("register.resources.cpu_slots: must be in [1, 1024] on a node without GPUs, got -1").
absl::Status CheckRegisterWorker(const trainctl::v1::RegisterWorker& reg);

// The same for a topology probe, `field` naming where it is ("register.topology", "topology").
// CheckRegisterWorker does not look at register.topology: a bad probe costs only the probe (the
// coordinator drops it), never the registration.
absl::Status CheckNodeTopology(absl::string_view field, const trainctl::v1::NodeTopology& topology);

// The same for every other kind of message (task_status, logs, event, warning, heartbeat, topology):
// INVALID_ARGUMENT naming the field ("logs.lines[3].stream: must be stdout or stderr, got 'x'"),
// also for a message that carries nothing or a negative seq. Does not look at register.
absl::Status CheckWorkerMessage(const trainctl::v1::WorkerMessage& message);

}  // namespace trainctl

#endif  // TRAINCTL_COMMON_WORKER_LIMITS_H_
