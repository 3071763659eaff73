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

using metrics::Counter;
using metrics::Family;
using metrics::Gauge;

// DCGM-exporter's label names, but `modelName` as `model_name`: promtool rejects camelCase.
const std::vector<std::string>& GpuLabelNames() {
  static const auto* names = new std::vector<std::string>{"gpu", "UUID", "model_name", "Hostname"};
  return *names;
}

const std::vector<std::string>& RankLabelNames() {
  static const auto* names = new std::vector<std::string>{"node", "job", "task", "rank"};
  return *names;
}

// Moves a counter to `value`, a cumulative total kept elsewhere (the kernel's, the driver's). A
// smaller value means the source started again: the child is made anew, which Prometheus reads
// as a counter reset.
void SetCounterTo(Family<Counter>& family, const std::vector<std::string>& labels, double value) {
  Counter& counter = family.WithLabels(labels);
  const double now = counter.Value();
  if (value >= now) {
    counter.Inc(value - now);
    return;
  }
  family.Remove(labels);
  family.WithLabels(labels).Inc(value);
}

}  // namespace

NodeMetrics::NodeMetrics(NodeMetricsOptions options, metrics::Registry* registry,
                         std::function<WorkerStats()> stats)
    : options_(std::move(options)),
      stats_(std::move(stats)),
      info_(registry->AddGauge("trainctl_worker_info", "The running worker (always 1).",
                               {"node", "version"})),
      slots_(registry->AddGauge("trainctl_worker_slots",
                                "Slots the worker offers: GPUs, or CPU slots on a node without.",
                                {"node"})),
      connected_(registry->AddGauge(
          "trainctl_worker_connected",
          "1 while the worker is registered with the coordinator on a live session.", {"node"})),
      reconnects_(registry->AddCounter("trainctl_worker_reconnects_total",
                                       "Sessions with the coordinator opened after the first.",
                                       {"node"})),
      outbox_messages_(
          registry->AddGauge("trainctl_worker_outbox_messages",
                             "Messages for the coordinator not yet acknowledged by it.", {"node"})),
      outbox_spilled_bytes_(registry->AddGauge("trainctl_worker_outbox_spilled_bytes",
                                               "Bytes of the outbox kept on disk.", {"node"})),
      tasks_(
          registry->AddGauge("trainctl_worker_tasks", "Tasks whose ranks are running.", {"node"})),
      rank_cpu_(registry->AddCounter("trainctl_rank_cpu_seconds_total",
                                     "CPU time (user + system) of a rank process.",
                                     RankLabelNames())),
      rank_rss_(registry->AddGauge("trainctl_rank_resident_memory_bytes",
                                   "Resident set size of a rank process.", RankLabelNames())),
      gpu_utilization_(registry->AddGauge("trainctl_gpu_utilization_ratio",
                                          "Fraction of the last sample period a kernel ran on the "
                                          "GPU (nvidia-smi utilization.gpu).",
                                          GpuLabelNames())),
      gpu_memory_used_(registry->AddGauge("trainctl_gpu_memory_used_bytes",
                                          "GPU memory in use (nvidia-smi memory.used).",
                                          GpuLabelNames())),
      gpu_memory_total_(registry->AddGauge("trainctl_gpu_memory_total_bytes",
                                           "GPU memory in all (nvidia-smi memory.total).",
                                           GpuLabelNames())),
      gpu_power_(registry->AddGauge("trainctl_gpu_power_watts",
                                    "GPU power draw (nvidia-smi power.draw).", GpuLabelNames())),
      gpu_temperature_(registry->AddGauge("trainctl_gpu_temperature_celsius",
                                          "GPU core temperature (nvidia-smi temperature.gpu).",
                                          GpuLabelNames())),
      gpu_sm_clock_(registry->AddGauge("trainctl_gpu_sm_clock_hertz",
                                       "GPU SM clock (nvidia-smi clocks.sm).", GpuLabelNames())),
      gpu_ecc_(registry->AddCounter("trainctl_gpu_ecc_uncorrected_errors_total",
                                    "Uncorrected ECC errors since the driver loaded "
                                    "(nvidia-smi ecc.errors.uncorrected.volatile.total).",
                                    GpuLabelNames())),
      gpu_xid_(registry->AddCounter(
          "trainctl_gpu_xid_errors_total",
          "NVIDIA Xid errors in the kernel log (NVRM: Xid lines), by Xid code.",
          {"Hostname", "xid"})) {
  info_.WithLabels({options_.node_name, options_.version}).Set(1);
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
    gpu_xid_.WithLabels({options_.node_name, absl::StrCat(xid)}).Inc();
  }
}

void NodeMetrics::Collect() {
  const WorkerStats stats = stats_ ? stats_() : WorkerStats();
  const std::vector<std::string> node = {options_.node_name};
  slots_.WithLabels(node).Set(stats.slots);
  connected_.WithLabels(node).Set(stats.connected ? 1 : 0);
  SetCounterTo(reconnects_, node, static_cast<double>(stats.reconnects));
  outbox_messages_.WithLabels(node).Set(static_cast<double>(stats.outbox_messages));
  outbox_spilled_bytes_.WithLabels(node).Set(static_cast<double>(stats.outbox_spilled_bytes));
  tasks_.WithLabels(node).Set(stats.tasks);
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
    Labels labels = {options_.node_name, rank.job_id, rank.task_id, absl::StrCat(rank.rank)};
    const SeenProcess process{rank.pid, sample->start_ticks};
    auto before = seen_ranks_.find(labels);
    if (before != seen_ranks_.end() &&
        (before->second.pid != process.pid || before->second.start_ticks != process.start_ticks)) {
      rank_cpu_.Remove(labels);  // another process under the same name: its own counter
    }
    SetCounterTo(rank_cpu_, labels, sample->cpu_seconds);
    rank_rss_.WithLabels(labels).Set(static_cast<double>(sample->resident_bytes));
    seen.emplace(std::move(labels), process);
  }
  for (const auto& [labels, process] : seen_ranks_) {
    if (seen.count(labels) == 0) {
      rank_cpu_.Remove(labels);
      rank_rss_.Remove(labels);
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
    family->Clear();
  }
  std::vector<Labels> ecc_series;
  for (const GpuReading& gpu : gpus) {
    const Labels labels = {absl::StrCat(gpu.index), gpu.uuid, gpu.name, options_.node_name};
    auto set = [&](Family<Gauge>& family, const std::optional<double>& value) {
      if (value.has_value()) family.WithLabels(labels).Set(*value);
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
      gpu_ecc_.Remove(labels);
    }
  }
  ecc_series_ = std::move(ecc_series);
}

}  // namespace trainctl::worker
