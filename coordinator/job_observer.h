// JobObserver: how JobManager announces what it committed (coordinator/job_manager.h AddObserver).
#ifndef TRAINCTL_COORDINATOR_JOB_OBSERVER_H_
#define TRAINCTL_COORDINATOR_JOB_OBSERVER_H_

#include <cstdint>
#include <string>

#include "trainctl/v1/job.pb.h"

namespace trainctl {

using trainctl::v1::Job;

// Told of every committed change JobManager makes, after the commit, on the caller's thread (RPC
// threads and the cluster's loop alike, so implementations are thread-safe). Must not call back
// into the JobManager. E.g. coordinator/job_metrics.h keeps Prometheus series from these.
class JobObserver {
 public:
  virtual ~JobObserver() = default;
  // A submit that created `job` (a repeated request id is not one).
  virtual void OnSubmitted(const Job& /*job*/) {}
  // A cancel that was accepted: the job was not cancelled or being cancelled already.
  virtual void OnCancelAccepted(const Job& /*job*/) {}
  // `job` (as committed) moved from `from` to its current state.
  virtual void OnStateChanged(const Job& /*job*/, trainctl::v1::JobState /*from*/) {}
  // A metric sample of `job` was stored; `job` carries the progress it updated.
  virtual void OnMetric(const Job& /*job*/, const trainctl::v1::MetricSample& /*sample*/) {}
  // A remedy (coordinator/remedy_ladder.h) was recorded for `job`'s next attempt.
  virtual void OnRemedy(const Job& /*job*/, const trainctl::v1::Remedy& /*remedy*/) {}
  // The job `job_id` has `bytes` of log text stored now (coordinator/event_ingester.h).
  virtual void OnLogBytes(const std::string& /*job_id*/, int64_t /*bytes*/) {}
  // Something its watchers read was stored for job `job_id` (events, log lines); once per job per
  // write, after the calls above. coordinator/job_notifier.h wakes the job's streams on it.
  virtual void OnStored(const std::string& /*job_id*/) {}
};

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_JOB_OBSERVER_H_
