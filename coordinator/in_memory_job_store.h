// A JobStore that keeps everything in memory: for tests of the components above the store, and for
// a coordinator started with `--db :memory:` (nothing survives a restart). Thread-safe.
#ifndef TRAINCTL_COORDINATOR_IN_MEMORY_JOB_STORE_H_
#define TRAINCTL_COORDINATOR_IN_MEMORY_JOB_STORE_H_

#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/job_store.h"
#include "coordinator/metric_retention.h"

namespace trainctl {

class InMemoryJobStore final : public JobStore {
 public:
  struct Options {
    // Metric events kept per job before older ones are thinned (coordinator/metric_retention.h).
    int max_metric_events = kDefaultMaxMetricEventsPerJob;
  };
  InMemoryJobStore() = default;
  explicit InMemoryJobStore(const Options& options)
      : max_metric_events_(options.max_metric_events) {}

  absl::StatusOr<CreateJobResult> CreateJob(const Job& job, const std::string& request_id,
                                            std::vector<JobEvent> initial_events) override;
  absl::StatusOr<Job> GetJob(absl::string_view id) override;
  absl::StatusOr<JobPage> ListJobs(const JobFilter& filter) override;
  absl::StatusOr<std::vector<JobCount>> CountJobs() override;
  absl::StatusOr<Job> UpdateJob(absl::string_view id, const JobMutation& mutate,
                                std::vector<JobEvent>* events) override;
  absl::StatusOr<std::vector<JobEvent>> ListEvents(absl::string_view job_id, int64_t after_seq,
                                                   int limit) override;
  absl::Status AppendLogs(std::vector<LogLine>* lines) override;
  absl::StatusOr<int64_t> LogBytes(absl::string_view job_id) override;
  absl::StatusOr<std::vector<LogLine>> ListLogs(absl::string_view job_id,
                                                const LogQuery& query) override;
  absl::Status PutNodeTopology(const trainctl::v1::NodeTopology& topology) override;
  absl::StatusOr<std::optional<trainctl::v1::NodeTopology>> GetNodeTopology(
      absl::string_view node) override;

 private:
  void AppendEventsLocked(const std::string& job_id, std::vector<JobEvent>* events)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  int64_t last_job_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_event_seq_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_log_seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int64_t, Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> request_ids_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, JobEvent> events_ ABSL_GUARDED_BY(mu_);  // by seq
  std::map<int64_t, LogLine> logs_ ABSL_GUARDED_BY(mu_);     // by seq
  const int max_metric_events_ = kDefaultMaxMetricEventsPerJob;
  std::map<std::string, std::vector<int64_t>> metric_seqs_ ABSL_GUARDED_BY(mu_);  // by job id
  std::map<std::string, trainctl::v1::NodeTopology, std::less<>> topologies_
      ABSL_GUARDED_BY(mu_);  // by node
};

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_IN_MEMORY_JOB_STORE_H_
