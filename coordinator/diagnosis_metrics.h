// DiagnosisMetrics: the findings of each running job's interconnect diagnosis as the gauge
// trainctl_job_findings{job, name, rule, severity} (how many findings of that rule, e.g. one per
// node), for the alert rules (deploy/prometheus/alerts.yml). Collected on scrape: each running
// job's new events are read incrementally and its findings recomputed only when a report, a
// bandwidth probe or a new attempt arrived. Ended jobs' series are dropped.
//
// Thread-safe.
#ifndef TRAINCTL_COORDINATOR_DIAGNOSIS_METRICS_H_
#define TRAINCTL_COORDINATOR_DIAGNOSIS_METRICS_H_

#include <map>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "coordinator/job_diagnoser.h"
#include "coordinator/job_store.h"

namespace trainctl {

class DiagnosisMetrics {
 public:
  // Adds the family and its collector to `registry`. None is owned; all must outlive the
  // registry's last Render.
  DiagnosisMetrics(metrics::Registry* registry, JobStore* store, const JobDiagnoser* diagnoser);

  // What a scrape does; public for tests.
  void Collect();

 private:
  struct Tracked {
    JobDiagnostics state;
    std::string name;
    std::map<std::pair<std::string, std::string>, int> findings;  // (rule, severity) → count
  };

  JobStore* const store_;
  const JobDiagnoser* const diagnoser_;
  prometheus::Family<prometheus::Gauge>& findings_;
  absl::Mutex mu_;
  std::map<std::string, Tracked> jobs_ ABSL_GUARDED_BY(mu_);  // running jobs, by id
};

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_DIAGNOSIS_METRICS_H_
