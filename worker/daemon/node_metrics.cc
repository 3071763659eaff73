#include "worker/daemon/node_metrics.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/process_stats.h"

namespace trainctl::worker {
namespace {

using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Labels;

// Moves a counter to `value`, a cumulative total kept elsewhere (the kernel's, the driver's). A
// smaller value means the source started again: the child is made anew, which Prometheus reads
// as a counter reset.
void SetCounterTo(Family<Counter>& family, const Labels& labels, double value) {
  Counter& counter = family.Add(labels);
  const double now = counter.Value();
  if (value >= now) {
    counter.Increment(value - now);
    return;
  }
  family.Remove(&counter);
  family.Add(labels).Increment(value);
}

}  // namespace

NodeMetrics::NodeMetrics(NodeMetricsOptions options, metrics::Registry* registry,
                         std::function<WorkerStats()> stats)
    : options_(std::move(options)),
      stats_(std::move(stats)),
      // The worker's own series carry {node}; the ranks' {node, job, task, rank}; the GPUs'
      // DCGM-exporter's {gpu, UUID, model_name, Hostname} (`modelName` as `model_name`: promtool
      // rejects camelCase).
      info_(registry->AddGauge("trainctl_worker_info", "The running worker (always 1).")),
      slots_(registry->AddGauge("trainctl_worker_slots",
                                "Slots the worker offers: GPUs, or CPU slots on a node without.")),
      connected_(registry->AddGauge(
          "trainctl_worker_connected",
          "1 while the worker is registered with the coordinator on a live session.")),
      reconnects_(registry->AddCounter("trainctl_worker_reconnects_total",
                                       "Sessions with the coordinator opened after the first.")),
      outbox_messages_(
          registry->AddGauge("trainctl_worker_outbox_messages",
                             "Messages for the coordinator not yet acknowledged by it.")),
      outbox_spilled_bytes_(registry->AddGauge("trainctl_worker_outbox_spilled_bytes",
                                               "Bytes of the outbox kept on disk.")),
      tasks_(registry->AddGauge("trainctl_worker_tasks", "Tasks whose ranks are running.")),
      rank_cpu_(registry->AddCounter("trainctl_rank_cpu_seconds_total",
                                     "CPU time (user + system) of a rank process.")),
      rank_rss_(registry->AddGauge("trainctl_rank_resident_memory_bytes",
                                   "Resident set size of a rank process.")),
      gpu_utilization_(registry->AddGauge("trainctl_gpu_utilization_ratio",
                                          "Fraction of the last sample period a kernel ran on the "
                                          "GPU (nvidia-smi utilization.gpu).")),
      gpu_memory_used_(registry->AddGauge("trainctl_gpu_memory_used_bytes",
                                          "GPU memory in use (nvidia-smi memory.used).")),
      gpu_memory_total_(registry->AddGauge("trainctl_gpu_memory_total_bytes",
                                           "GPU memory in all (nvidia-smi memory.total).")),
      gpu_power_(registry->AddGauge("trainctl_gpu_power_watts",
                                    "GPU power draw (nvidia-smi power.draw).")),
      gpu_temperature_(registry->AddGauge("trainctl_gpu_temperature_celsius",
                                          "GPU core temperature (nvidia-smi temperature.gpu).")),
      gpu_sm_clock_(registry->AddGauge("trainctl_gpu_sm_clock_hertz",
                                       "GPU SM clock (nvidia-smi clocks.sm).")),
      gpu_ecc_(registry->AddCounter("trainctl_gpu_ecc_uncorrected_errors_total",
                                    "Uncorrected ECC errors since the driver loaded "
                                    "(nvidia-smi ecc.errors.uncorrected.volatile.total).")),
      gpu_xid_(registry->AddCounter(
          "trainctl_gpu_xid_errors_total",
          "NVIDIA Xid errors in the kernel log (NVRM: Xid lines), by Xid code.")) {
  info_.Add({{"node", options_.node_name}, {"version", options_.version}}).Set(1);
  if (!options_.kernel_log.empty() && !options_.nvidia_smi.empty()) {
    kernel_log_ = std::make_unique<KernelLogReader>(options_.kernel_log);
  }
  registry->AddCollector([this] { Collect(); });
}

NodeMetrics::~NodeMetrics() {
  stop_.Notify();
  if (poller_.joinable()) poller_.join();
}

void NodeMetrics::Start() {
  if (options_.nvidia_smi.empty() || poller_.joinable()) return;
  poller_ = std::thread([this] { PollLoop(); });
}

void NodeMetrics::PollLoop() {
  do {
    PollOnce();
  } while (!stop_.WaitForNotificationWithTimeout(options_.poll_interval));
}

void NodeMetrics::PollOnce() {
  if (options_.nvidia_smi.empty()) return;
  std::vector<std::string> warnings;
  absl::StatusOr<std::vector<GpuReading>> gpus =
      QueryGpuMetrics(options_.nvidia_smi, options_.nvidia_smi_timeout, &warnings);
  std::string problem;
  if (!gpus.ok()) {
    problem = std::string(gpus.status().message());
  } else if (!warnings.empty()) {
    problem = absl::StrJoin(warnings, "; ");
  }
  // Once per distinct problem: a driver that always says the same odd thing fills no log.
  if (problem != last_poll_problem_) {
    if (!problem.empty()) TRAINCTL_LOG(WARNING) << "GPU metrics: " << problem;
    if (problem.empty()) TRAINCTL_LOG(INFO) << "GPU metrics: nvidia-smi reads cleanly again";
    last_poll_problem_ = problem;
  }
  {
    absl::MutexLock lock(&gpus_mu_);
    gpus_ = gpus.ok() ? std::move(*gpus) : std::vector<GpuReading>();
  }

  if (kernel_log_ == nullptr) return;
  absl::StatusOr<std::vector<int>> xids = kernel_log_->ReadNewXids();
  if (!xids.ok()) {
    if (!kernel_log_warned_) {
      TRAINCTL_LOG(WARNING) << "GPU Xid errors will not be reported: " << xids.status().message()
                            << " (see --kernel_log)";
      kernel_log_warned_ = true;
    }
    return;
  }
  for (int xid : *xids) {
    TRAINCTL_LOG(WARNING) << "kernel log: NVIDIA Xid " << xid;
    gpu_xid_.Add({{"Hostname", options_.node_name}, {"xid", absl::StrCat(xid)}}).Increment();
  }
}

void NodeMetrics::Collect() {
  const WorkerStats stats = stats_ ? stats_() : WorkerStats();
  const Labels node = {{"node", options_.node_name}};
  slots_.Add(node).Set(stats.slots);
  connected_.Add(node).Set(stats.connected ? 1 : 0);
  SetCounterTo(reconnects_, node, static_cast<double>(stats.reconnects));
  outbox_messages_.Add(node).Set(static_cast<double>(stats.outbox_messages));
  outbox_spilled_bytes_.Add(node).Set(static_cast<double>(stats.outbox_spilled_bytes));
  tasks_.Add(node).Set(stats.tasks);
  CollectRanks(stats.ranks);
  CollectGpus();
}

void NodeMetrics::CollectRanks(const std::vector<RankProcess>& ranks) {
  absl::MutexLock lock(&collect_mu_);
  std::map<Labels, SeenProcess> seen;
  for (const RankProcess& rank : ranks) {
    absl::StatusOr<ProcessSample> sample = ReadProcessSample(rank.pid);
    // Gone, a zombie, or (pid reused) no longer the leader of the rank's own process group.
    if (!sample.ok() || sample->state == 'Z' || sample->process_group != rank.pid) continue;
    Labels labels = {{"node", options_.node_name},
                     {"job", rank.job_id},
                     {"task", rank.task_id},
                     {"rank", absl::StrCat(rank.rank)}};
    const SeenProcess process{rank.pid, sample->start_ticks};
    auto before = seen_ranks_.find(labels);
    if (before != seen_ranks_.end() &&
        (before->second.pid != process.pid || before->second.start_ticks != process.start_ticks)) {
      // Another process under the same name: its own counter.
      metrics::RemoveSeries(rank_cpu_, labels);
    }
    SetCounterTo(rank_cpu_, labels, sample->cpu_seconds);
    rank_rss_.Add(labels).Set(static_cast<double>(sample->resident_bytes));
    seen.emplace(std::move(labels), process);
  }
  for (const auto& [labels, process] : seen_ranks_) {
    if (seen.count(labels) == 0) {
      metrics::RemoveSeries(rank_cpu_, labels);
      metrics::RemoveSeries(rank_rss_, labels);
    }
  }
  seen_ranks_ = std::move(seen);
}

void NodeMetrics::CollectGpus() {
  std::vector<GpuReading> gpus;
  {
    absl::MutexLock lock(&gpus_mu_);
    gpus = gpus_;
  }
  absl::MutexLock lock(&collect_mu_);
  // Gauges are made afresh from the latest readings (a field may have turned [N/A]); the render
  // that follows sees only the result.
  for (Family<Gauge>* family : {&gpu_utilization_, &gpu_memory_used_, &gpu_memory_total_,
                                &gpu_power_, &gpu_temperature_, &gpu_sm_clock_}) {
    metrics::RemoveAllSeries(*family);
  }
  std::vector<Labels> ecc_series;
  for (const GpuReading& gpu : gpus) {
    const Labels labels = {{"gpu", absl::StrCat(gpu.index)},
                           {"UUID", gpu.uuid},
                           {"model_name", gpu.name},
                           {"Hostname", options_.node_name}};
    auto set = [&](Family<Gauge>& family, const std::optional<double>& value) {
      if (value.has_value()) family.Add(labels).Set(*value);
    };
    set(gpu_utilization_, gpu.utilization_ratio);
    set(gpu_memory_used_, gpu.memory_used_bytes);
    set(gpu_memory_total_, gpu.memory_total_bytes);
    set(gpu_power_, gpu.power_watts);
    set(gpu_temperature_, gpu.temperature_celsius);
    set(gpu_sm_clock_, gpu.sm_clock_hertz);
    if (gpu.ecc_uncorrected_errors.has_value()) {
      SetCounterTo(gpu_ecc_, labels, *gpu.ecc_uncorrected_errors);
      ecc_series.push_back(labels);
    }
  }
  for (const Labels& labels : ecc_series_) {
    if (std::find(ecc_series.begin(), ecc_series.end(), labels) == ecc_series.end()) {
      metrics::RemoveSeries(gpu_ecc_, labels);
    }
  }
  ecc_series_ = std::move(ecc_series);
}

}  // namespace trainctl::worker
