// JobMetrics: the coordinator's job counters and the gauges of each running job, for /metrics
// (names in deploy/prometheus/METRICS.md). JobManager feeds it as its JobObserver, so it sees
// every committed submit, cancel, state change and metric sample, whoever made them.
//
// Per-job gauges carry the labels job (id), name, kind and nodes (node count) and hold the latest
// logged sample's values; a value the job never logged (reward for SFT) has no series. A job's
// series are dropped when it ends (succeeded, failed, cancelled), and samples that arrive after
// its end are ignored; a pipeline's are dropped between stages (pending again). NaN (a diverged
// loss) is exported as NaN.
//
// Thread-safe.
#ifndef TRAINCTL_COORDINATOR_JOB_METRICS_H_
#define TRAINCTL_COORDINATOR_JOB_METRICS_H_

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "coordinator/job_manager.h"

namespace trainctl {

class JobMetrics final : public JobObserver {
 public:
  // Adds the families to `registry` (not owned; must outlive this).
  explicit JobMetrics(metrics::Registry* registry);

  void OnSubmitted(const Job& job) override;
  void OnCancelAccepted(const Job& job) override;
  void OnStateChanged(const Job& job, trainctl::v1::JobState from) override;
  void OnMetric(const Job& job, const trainctl::v1::MetricSample& sample) override;
  void OnRemedy(const Job& job, const trainctl::v1::Remedy& remedy) override;
  // trainctl_job_log_bytes: shown once the job has series (its first metric sample).
  void OnLogBytes(const std::string& job_id, int64_t bytes) override;

  // Ids of the jobs that have series now (tests).
  std::vector<std::string> JobsWithSeries();

  // The trainer's metric name (worker/trainer/stages/loop.cc, grpo.cc) that feeds each per-job
  // gauge taken from a sample as is.
  struct SampleGauge {
    const char* sample_name;
    const char* metric_name;
    const char* help;
  };
  static const std::vector<SampleGauge>& SampleGauges();

 private:
  struct Series {
    prometheus::Labels labels;      // job, name, kind, nodes
    double smoothed_step_time = 0;  // seconds; 0 until a sample has step_time
  };

  // The job's series, made (or relabelled, when its node count changed) for `job`.
  Series& SeriesFor(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropSeries(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetProgress(const Job& job, Series& series) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  prometheus::Family<prometheus::Counter>& submissions_;
  prometheus::Counter& cancellations_;
  prometheus::Family<prometheus::Counter>& finished_;
  prometheus::Family<prometheus::Counter>& restarts_;
  prometheus::Family<prometheus::Counter>& remedies_;
  prometheus::Family<prometheus::Gauge>& attempt_;
  prometheus::Family<prometheus::Gauge>& step_;
  prometheus::Family<prometheus::Gauge>& total_steps_;
  prometheus::Family<prometheus::Gauge>& progress_;
  prometheus::Family<prometheus::Gauge>& eta_;
  prometheus::Family<prometheus::Gauge>& log_bytes_;
  // One per SampleGauges() entry, in that order.
  std::vector<prometheus::Family<prometheus::Gauge>*> sample_gauges_;

  absl::Mutex mu_;
  std::map<std::string, Series> series_ ABSL_GUARDED_BY(mu_);  // by job id
  // Jobs that ended: a sample committed before the end but told after it must not bring their
  // series back. One short string per finished job since the coordinator started.
  std::set<std::string> ended_ ABSL_GUARDED_BY(mu_);
  // Stored log bytes of jobs that have no series yet, shown when their series is made.
  std::map<std::string, int64_t> unshown_log_bytes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_JOB_METRICS_H_
