// GatedJobStore: an InMemoryJobStore whose batch writes (JobStore::WriteBatch, what the cluster's
// event ingester uses) a test can hold back (Close/Open) or fail with a full disk. Everything else
// goes straight through. Thread-safe.
#ifndef TRAINCTL_TESTS_TESTING_GATED_JOB_STORE_H_
#define TRAINCTL_TESTS_TESTING_GATED_JOB_STORE_H_

#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "coordinator/in_memory_job_store.h"

namespace trainctl::testing {

class GatedJobStore final : public JobStore {
 public:
  // Batch writes wait until Open.
  void Close() {
    absl::MutexLock lock(&mu_);
    open_ = false;
  }
  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  // The next `n` batch writes fail with RESOURCE_EXHAUSTED, writing nothing.
  void FailNextBatches(int n) {
    absl::MutexLock lock(&mu_);
    fail_ = n;
  }
  // Batch writes waiting at the gate.
  int waiting() {
    absl::MutexLock lock(&mu_);
    return waiting_;
  }

  absl::Status WriteBatch(std::vector<BatchRecord>* records) override {
    {
      absl::MutexLock lock(&mu_);
      ++waiting_;
      mu_.Await(absl::Condition(&open_));
      --waiting_;
      if (fail_ > 0) {
        --fail_;
        const absl::Status full = absl::ResourceExhaustedError("database or disk is full");
        for (BatchRecord& r : *records) r.status = full;
        return full;
      }
    }
    return store_.WriteBatch(records);
  }

  absl::StatusOr<CreateJobResult> CreateJob(const Job& job, const std::string& request_id,
                                            std::vector<JobEvent> initial_events) override {
    return store_.CreateJob(job, request_id, std::move(initial_events));
  }
  absl::StatusOr<Job> GetJob(absl::string_view id) override { return store_.GetJob(id); }
  absl::StatusOr<JobPage> ListJobs(const JobFilter& filter) override {
    return store_.ListJobs(filter);
  }
  absl::StatusOr<std::vector<JobCount>> CountJobs() override { return store_.CountJobs(); }
  absl::StatusOr<Job> UpdateJob(absl::string_view id, const JobMutation& mutate,
                                std::vector<JobEvent>* events) override {
    return store_.UpdateJob(id, mutate, events);
  }
  absl::StatusOr<std::vector<JobEvent>> ListEvents(absl::string_view job_id, int64_t after_seq,
                                                   int limit) override {
    return store_.ListEvents(job_id, after_seq, limit);
  }
  absl::Status AppendLogs(std::vector<LogLine>* lines) override { return store_.AppendLogs(lines); }
  absl::StatusOr<std::vector<LogLine>> ListLogs(absl::string_view job_id,
                                                const LogQuery& query) override {
    return store_.ListLogs(job_id, query);
  }
  absl::StatusOr<int64_t> LogBytes(absl::string_view job_id) override {
    return store_.LogBytes(job_id);
  }
  absl::Status PutNodeTopology(const trainctl::v1::NodeTopology& topology) override {
    return store_.PutNodeTopology(topology);
  }
  absl::StatusOr<std::optional<trainctl::v1::NodeTopology>> GetNodeTopology(
      absl::string_view node) override {
    return store_.GetNodeTopology(node);
  }

 private:
  InMemoryJobStore store_;
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = true;
  int fail_ ABSL_GUARDED_BY(mu_) = 0;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace trainctl::testing

#endif  // TRAINCTL_TESTS_TESTING_GATED_JOB_STORE_H_
