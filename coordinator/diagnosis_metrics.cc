#include "coordinator/diagnosis_metrics.h"

#include <vector>

#include "common/logging.h"
#include "coordinator/diagnosis.h"

namespace trainctl {

DiagnosisMetrics::DiagnosisMetrics(metrics::Registry* registry, JobStore* store,
                                   const JobDiagnoser* diagnoser)
    : store_(store),
      diagnoser_(diagnoser),
      findings_(registry->AddGauge(
          "trainctl_job_findings",
          "Findings of a running job's interconnect diagnosis (trainctl diagnose JOB), by rule "
          "and severity.")) {
  registry->AddCollector([this] { Collect(); });
}

void DiagnosisMetrics::Collect() {
  JobFilter filter;
  filter.states = {trainctl::v1::JOB_STATE_RUNNING};
  filter.page_size = 1000;
  auto running = store_->ListJobs(filter);
  if (!running.ok()) {
    TRAINCTL_LOG(WARNING) << "trainctl_job_findings: reading the running jobs: "
                          << running.status().message();
    return;  // the series keep their last values
  }
  absl::MutexLock lock(&mu_);
  std::map<std::string, Tracked> still;
  for (const Job& job : running->jobs) {
    auto it = jobs_.find(job.id());
    Tracked tracked = it != jobs_.end() ? std::move(it->second) : Tracked();
    const bool fresh = it == jobs_.end();
    tracked.name = job.spec().name();
    auto changed = diagnoser_->Advance(job.id(), &tracked.state);
    if (!changed.ok()) {
      TRAINCTL_LOG(WARNING) << "trainctl_job_findings: job " << job.id() << ": "
                            << changed.status().message();
    } else if (*changed || fresh) {
      auto diagnosis = diagnoser_->Build(job, tracked.state);
      if (diagnosis.ok()) {
        tracked.findings.clear();
        for (const trainctl::v1::Finding& f : diagnosis->findings()) {
          ++tracked.findings[{f.rule(), SeverityName(f.severity())}];
        }
      } else {
        TRAINCTL_LOG(WARNING) << "trainctl_job_findings: job " << job.id() << ": "
                              << diagnosis.status().message();
      }
    }
    still.emplace(job.id(), std::move(tracked));
  }
  jobs_ = std::move(still);
  metrics::RemoveAllSeries(findings_);
  for (const auto& [id, tracked] : jobs_) {
    for (const auto& [key, count] : tracked.findings) {
      findings_
          .Add({{"job", id}, {"name", tracked.name}, {"rule", key.first}, {"severity", key.second}})
          .Set(count);
    }
  }
}

}  // namespace trainctl
