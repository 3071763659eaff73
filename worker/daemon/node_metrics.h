// The worker daemon's Prometheus metrics (deploy/prometheus/METRICS.md, "Worker"): the worker's own
// state and its rank processes' CPU time and memory, read from a WorkerStats snapshot and /proc at
// each scrape; per-GPU readings (nvidia-smi) and Xid errors (kernel log), read by a background
// poller so a slow or hung nvidia-smi never delays a scrape.
//
// On a node with GPUs, Xid errors come from the kernel log at `kernel_log` (--kernel_log, default
// /dev/kmsg, which needs CAP_SYSLOG or kernel.dmesg_restrict=0; a plain file such as
// /var/log/kern.log works too, and is how tests feed it). When it cannot be read the Xid series are
// absent (one warning in the daemon's log), not zero: no reading is not the same as no errors.
//
// Thread-safe: the collector runs on the scrape thread, the poller on its own.
#ifndef TRAINCTL_WORKER_DAEMON_NODE_METRICS_H_
#define TRAINCTL_WORKER_DAEMON_NODE_METRICS_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "worker/daemon/gpu_metrics.h"
#include "worker/daemon/worker_stats.h"

namespace trainctl::worker {

struct NodeMetricsOptions {
  std::string node_name;   // the `node` and `Hostname` labels
  std::string version;     // trainctl_worker_info's `version`
  std::string nvidia_smi;  // the program's path; "" on a node without GPUs (no GPU series)
  std::string kernel_log;  // "" = no Xid series
  absl::Duration poll_interval = absl::Seconds(5);
  absl::Duration nvidia_smi_timeout = absl::Seconds(10);
};

class NodeMetrics {
 public:
  // Adds the worker's families to `registry` and a collector that calls `stats` at each scrape.
  // `registry` must outlive this object, and this object every Render of it (the collector
  // points here): stop the server first. `stats` is called on the scrape thread and must be
  // thread-safe. Nothing is polled until Start().
  NodeMetrics(NodeMetricsOptions options, metrics::Registry* registry,
              std::function<WorkerStats()> stats);
  // Stops and joins the poller (waiting out at most one nvidia-smi run).
  ~NodeMetrics();
  NodeMetrics(const NodeMetrics&) = delete;
  NodeMetrics& operator=(const NodeMetrics&) = delete;

  // Starts the background poller: one poll now, then one every poll_interval.
  void Start();
  // One poll of nvidia-smi and the kernel log on the calling thread (the poller's body; tests call
  // it directly instead of Start).
  void PollOnce();

 private:
  using Labels = prometheus::Labels;
  // A rank series' process: a new pid (or a reused one) under the same labels restarts its counter.
  struct SeenProcess {
    pid_t pid = 0;
    uint64_t start_ticks = 0;
  };

  void Collect();  // the registry's collector
  void CollectRanks(const std::vector<RankProcess>& ranks);
  void CollectGpus();
  void PollLoop();

  const NodeMetricsOptions options_;
  const std::function<WorkerStats()> stats_;

  prometheus::Family<prometheus::Gauge>& info_;
  prometheus::Family<prometheus::Gauge>& slots_;
  prometheus::Family<prometheus::Gauge>& connected_;
  prometheus::Family<prometheus::Counter>& reconnects_;
  prometheus::Family<prometheus::Gauge>& outbox_messages_;
  prometheus::Family<prometheus::Gauge>& outbox_spilled_bytes_;
  prometheus::Family<prometheus::Gauge>& tasks_;
  prometheus::Family<prometheus::Counter>& rank_cpu_;
  prometheus::Family<prometheus::Gauge>& rank_rss_;
  prometheus::Family<prometheus::Gauge>& gpu_utilization_;
  prometheus::Family<prometheus::Gauge>& gpu_memory_used_;
  prometheus::Family<prometheus::Gauge>& gpu_memory_total_;
  prometheus::Family<prometheus::Gauge>& gpu_power_;
  prometheus::Family<prometheus::Gauge>& gpu_temperature_;
  prometheus::Family<prometheus::Gauge>& gpu_sm_clock_;
  prometheus::Family<prometheus::Counter>& gpu_ecc_;
  prometheus::Family<prometheus::Counter>& gpu_xid_;

  // The collector's own state (one Render at a time runs it).
  absl::Mutex collect_mu_;
  std::map<Labels, SeenProcess> seen_ranks_ ABSL_GUARDED_BY(collect_mu_);
  std::vector<Labels> ecc_series_ ABSL_GUARDED_BY(collect_mu_);

  // The poller's latest GPU readings; empty after a failed poll (stale readings would mislead).
  absl::Mutex gpus_mu_;
  std::vector<GpuReading> gpus_ ABSL_GUARDED_BY(gpus_mu_);

  // Poller-thread state.
  std::unique_ptr<KernelLogReader> kernel_log_;
  std::string last_poll_problem_;  // logged once until it changes
  bool kernel_log_warned_ = false;

  absl::Notification stop_;
  std::thread poller_;
};

}  // namespace trainctl::worker

#endif  // TRAINCTL_WORKER_DAEMON_NODE_METRICS_H_
