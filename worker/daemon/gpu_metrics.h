// What the worker's /metrics says about its GPUs: per-GPU readings from nvidia-smi, and Xid
// errors from the kernel log. Parsers are pure (unit-tested on real output); the readers do I/O and
// are meant for a background thread (nvidia-smi can take seconds, or hang on a lost GPU).
#ifndef TRAINCTL_WORKER_DAEMON_GPU_METRICS_H_
#define TRAINCTL_WORKER_DAEMON_GPU_METRICS_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace trainctl::worker {

// The query the readings come from, in this column order.
inline constexpr char kGpuMetricsQuery[] =
    "index,uuid,name,utilization.gpu,memory.used,memory.total,power.draw,temperature.gpu,clocks.sm,"
    "ecc.errors.uncorrected.volatile.total";

// One GPU's readings, in base units. A field the driver cannot report ([N/A], [Not Supported],
// ...) is empty.
struct GpuReading {
  int index = 0;
  std::string uuid;
  std::string name;
  std::optional<double> utilization_ratio;  // utilization.gpu / 100
  std::optional<double> memory_used_bytes;  // MiB * 2^20
  std::optional<double> memory_total_bytes;
  std::optional<double> power_watts;
  std::optional<double> temperature_celsius;
  std::optional<double> sm_clock_hertz;  // MHz * 10^6
  std::optional<double> ecc_uncorrected_errors;
};

// Parses the output of `nvidia-smi --query-gpu=<kGpuMetricsQuery> --format=csv,noheader,nounits`.
// A row that cannot be read (wrong column count, no index or UUID) is skipped, and so is a field
// that is neither a number nor the driver's "[...]"/"N/A" marker; each adds a line naming it to
// `warnings` (may be null).
std::vector<GpuReading> ParseGpuMetricsCsv(absl::string_view csv,
                                           std::vector<std::string>* warnings);

// Runs `nvidia_smi` (a path) with that query, killing it after `timeout`, and parses its output.
// UNAVAILABLE with its output when it cannot run, exits non-zero or times out.
absl::StatusOr<std::vector<GpuReading>> QueryGpuMetrics(const std::string& nvidia_smi,
                                                        absl::Duration timeout,
                                                        std::vector<std::string>* warnings);

// The Xid code of a kernel log line `... NVRM: Xid (PCI:0000:3b:00): 79, pid=..., ...` (also with a
// /dev/kmsg "prio,seq,usec,flags;" prefix, a dmesg timestamp, or the older "(0000:3b:00)" form);
// nullopt for any other line.
std::optional<int> ParseXidLine(absl::string_view line);

// Follows a kernel log: /dev/kmsg (one record per read; opened non-blocking, it starts at the
// oldest record the kernel still holds) or a plain file such as /var/log/kern.log (read from the
// start, then what is appended). Not thread-safe: one poller thread uses it.
class KernelLogReader {
 public:
  explicit KernelLogReader(std::string path);
  ~KernelLogReader();
  KernelLogReader(const KernelLogReader&) = delete;
  KernelLogReader& operator=(const KernelLogReader&) = delete;

  // The Xid codes in what was logged since the last call (in order), reading at most `max_bytes`.
  // An error (the errno-derived code with the path) when the log cannot be opened or read; the
  // reader then stays closed and every later call returns that error again.
  absl::StatusOr<std::vector<int>> ReadNewXids(size_t max_bytes = size_t{4} << 20);

 private:
  const std::string path_;
  int fd_ = -1;
  absl::Status error_;   // sticky
  std::string partial_;  // a plain file's last line, until its newline arrives
};

}  // namespace trainctl::worker

#endif  // TRAINCTL_WORKER_DAEMON_GPU_METRICS_H_
