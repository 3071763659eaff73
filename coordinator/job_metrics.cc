#include "coordinator/job_metrics.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "coordinator/job_state.h"

namespace trainctl {
namespace {

// How much of a new step_time goes into the smoothed one: enough to follow a real change in speed
// within ~10 logged steps, little enough that one slow step (a checkpoint save) barely moves ETA.
constexpr double kStepTimeWeight = 0.2;

int NodeCount(const Job& job) {
  if (job.nodes_size() > 0) return job.nodes_size();
  return job.spec().resources().has_nodes() ? job.spec().resources().nodes() : 1;
}

}  // namespace

const std::vector<JobMetrics::SampleGauge>& JobMetrics::SampleGauges() {
  static const auto* const kGauges = new std::vector<SampleGauge>{
      {"loss", "trainctl_job_loss", "Training loss of the latest logged step (NaN when diverged)."},
      {"learning_rate", "trainctl_job_learning_rate", "Learning rate of the latest logged step."},
      {"grad_norm", "trainctl_job_grad_norm", "Global gradient norm before clipping."},
      {"tokens_per_second", "trainctl_job_tokens_per_second",
       "Training tokens per second over the latest logging window."},
      {"samples_per_second", "trainctl_job_samples_per_second",
       "Training samples per second over the latest logging window."},
      {"mfu", "trainctl_job_mfu_ratio",
       "Model FLOPs utilisation (0..1), where the device's peak is known."},
      {"reward", "trainctl_job_reward", "GRPO: mean reward of the latest rollouts."},
      {"reward_std", "trainctl_job_reward_std", "GRPO: reward standard deviation within groups."},
      {"kl", "trainctl_job_kl", "GRPO: KL divergence from the reference model."},
      {"completions/mean_length", "trainctl_job_completion_length_tokens",
       "GRPO: mean completion length in tokens."},
  };
  return *kGauges;
}

JobMetrics::JobMetrics(metrics::Registry* registry)
    : submissions_(
          registry->AddCounter("trainctl_job_submissions_total",
                               "Accepted job submissions (a repeated request id counts once).")),
      cancellations_(
          registry->AddCounter("trainctl_job_cancellations_total", "Accepted job cancels.")
              .Add({})),
      finished_(registry->AddCounter("trainctl_jobs_finished_total",
                                     "Jobs that ended since the coordinator started.")),
      restarts_(registry->AddCounter("trainctl_job_restarts_total",
                                     "Job restarts after a failed attempt.")),
      remedies_(registry->AddCounter(
          "trainctl_job_remedies_total",
          "Automatic remedies applied to restarts (spec.remedies), by cause (oom, loss_spike).")),
      // The per-job gauges below carry Series::labels.
      attempt_(registry->AddGauge("trainctl_job_attempt",
                                  "Attempt number of a running job (0 for the first run).")),
      step_(registry->AddGauge("trainctl_job_step", "Global step of a running job.")),
      total_steps_(
          registry->AddGauge("trainctl_job_total_steps", "Total steps of a running job's run.")),
      progress_(registry->AddGauge("trainctl_job_progress_ratio",
                                   "Step / total steps of a running job.")),
      eta_(registry->AddGauge("trainctl_job_eta_seconds",
                              "Time a running job needs to finish, from a smoothed step time.")),
      log_bytes_(registry->AddGauge("trainctl_job_log_bytes",
                                    "Bytes of rank log text the coordinator stores for a running "
                                    "job (capped by --max_job_log_bytes).")) {
  for (const SampleGauge& g : SampleGauges()) {
    sample_gauges_.push_back(&registry->AddGauge(g.metric_name, g.help));
  }
}

void JobMetrics::OnSubmitted(const Job& job) {
  submissions_.Add({{"kind", JobKindName(job.spec().kind())}}).Increment();
}

void JobMetrics::OnCancelAccepted(const Job& /*job*/) { cancellations_.Increment(); }

void JobMetrics::OnRemedy(const Job& /*job*/, const trainctl::v1::Remedy& remedy) {
  remedies_.Add({{"cause", remedy.cause()}}).Increment();
}

void JobMetrics::OnLogBytes(const std::string& job_id, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (ended_.count(job_id) > 0) return;
  auto it = series_.find(job_id);
  if (it == series_.end()) {
    unshown_log_bytes_[job_id] = bytes;
    return;
  }
  log_bytes_.Add(it->second.labels).Set(static_cast<double>(bytes));
}

void JobMetrics::OnStateChanged(const Job& job, trainctl::v1::JobState /*from*/) {
  const std::string kind = JobKindName(job.spec().kind());
  if (job.state() == trainctl::v1::JOB_STATE_RESTARTING)
    restarts_.Add({{"kind", kind}}).Increment();
  absl::MutexLock lock(&mu_);
  if (IsTerminal(job.state())) {
    finished_.Add({{"kind", kind}, {"state", JobStateName(job.state())}}).Increment();
    DropSeries(job.id());
    ended_.insert(job.id());
    unshown_log_bytes_.erase(job.id());
    return;
  }
  if (series_.count(job.id()) == 0) return;
  if (job.state() == trainctl::v1::JOB_STATE_PENDING) {
    // A pipeline waiting for its next stage: the last stage's figures are not this one's.
    DropSeries(job.id());
    return;
  }
  // A new attempt shows at once, not at its first logged step.
  attempt_.Add(SeriesFor(job).labels).Set(job.attempt());
}

void JobMetrics::OnMetric(const Job& job, const trainctl::v1::MetricSample& sample) {
  absl::MutexLock lock(&mu_);
  if (IsTerminal(job.state()) || ended_.count(job.id()) > 0) return;
  Series& series = SeriesFor(job);
  const auto& values = sample.values();
  if (auto it = values.find("step_time"); it != values.end() && it->second > 0) {
    series.smoothed_step_time =
        series.smoothed_step_time == 0
            ? it->second
            : kStepTimeWeight * it->second + (1 - kStepTimeWeight) * series.smoothed_step_time;
  }
  const std::vector<SampleGauge>& gauges = SampleGauges();
  for (size_t i = 0; i < gauges.size(); ++i) {
    auto it = values.find(gauges[i].sample_name);
    if (it != values.end()) sample_gauges_[i]->Add(series.labels).Set(it->second);
  }
  SetProgress(job, series);
}

void JobMetrics::SetProgress(const Job& job, Series& series) {
  const auto& labels = series.labels;
  const trainctl::v1::Progress& p = job.progress();
  attempt_.Add(labels).Set(job.attempt());
  step_.Add(labels).Set(static_cast<double>(p.step()));
  if (p.total_steps() <= 0) return;
  total_steps_.Add(labels).Set(static_cast<double>(p.total_steps()));
  progress_.Add(labels).Set(
      std::min(1.0, static_cast<double>(p.step()) / static_cast<double>(p.total_steps())));
  // JobManager's ETA (wall time per step, smoothed) once it has two samples of the attempt; until
  // then the trainer's own step time (compute only) is the best guess there is.
  if (p.eta_seconds() > 0) {
    eta_.Add(labels).Set(p.eta_seconds());
  } else if (series.smoothed_step_time > 0) {
    const int64_t left = std::max<int64_t>(0, p.total_steps() - p.step());
    eta_.Add(labels).Set(static_cast<double>(left) * series.smoothed_step_time);
  }
}

JobMetrics::Series& JobMetrics::SeriesFor(const Job& job) {
  prometheus::Labels labels = {{"job", job.id()},
                               {"name", job.spec().name()},
                               {"kind", JobKindName(job.spec().kind())},
                               {"nodes", absl::StrCat(NodeCount(job))}};
  auto it = series_.find(job.id());
  if (it != series_.end() && it->second.labels == labels) return it->second;
  if (it != series_.end()) DropSeries(job.id());  // e.g. a restart placed on fewer nodes
  Series& series = series_[job.id()];
  series.labels = std::move(labels);
  if (auto bytes = unshown_log_bytes_.find(job.id()); bytes != unshown_log_bytes_.end()) {
    log_bytes_.Add(series.labels).Set(static_cast<double>(bytes->second));
    unshown_log_bytes_.erase(bytes);
  }
  return series;
}

void JobMetrics::DropSeries(const std::string& job_id) {
  auto it = series_.find(job_id);
  if (it == series_.end()) return;
  const prometheus::Labels& labels = it->second.labels;
  for (auto* family : {&attempt_, &step_, &total_steps_, &progress_, &eta_, &log_bytes_}) {
    metrics::RemoveSeries(*family, labels);
  }
  for (auto* family : sample_gauges_) metrics::RemoveSeries(*family, labels);
  series_.erase(it);
}

std::vector<std::string> JobMetrics::JobsWithSeries() {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> ids;
  for (const auto& [id, series] : series_) ids.push_back(id);
  return ids;
}

}  // namespace trainctl
