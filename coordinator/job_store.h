// JobStore: the coordinator's durable record of jobs, their events and their log lines.
//
// Three implementations share one conformance suite
// (tests/coordinator/job_store_conformance_test.cc): SqliteJobStore (the default; WAL, every write
// committed before it returns), PostgresJobStore (`--db postgresql://...`; the same promises on a
// PostgreSQL server, and the lead among several coordinators) and InMemoryJobStore (tests of other
// components). All are thread-safe. A job is stored whole, a pipeline's stages (Job.stages, Job.current_stage) included.
#ifndef TRAINCTL_COORDINATOR_JOB_STORE_H_
#define TRAINCTL_COORDINATOR_JOB_STORE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainctl/v1/job.pb.h"

namespace trainctl {

using trainctl::v1::Job;
using trainctl::v1::JobEvent;
using trainctl::v1::LogLine;

// Whether a store error is the store's passing condition (RESOURCE_EXHAUSTED: its disk is full;
// UNAVAILABLE: I/O error, busy) rather than a problem with the request: the same write may succeed
// later, so whatever it records must be kept and written again, never dropped.
bool IsTransientStoreError(const absl::Status& status);

// Job ids are "job-<n>", n > 0 assigned by the store in creation order.
std::string FormatJobId(int64_t n);
// Accepts "job-42" and "42". INVALID_ARGUMENT otherwise.
absl::StatusOr<int64_t> ParseJobId(absl::string_view id);

struct JobFilter {
  std::vector<trainctl::v1::JobState> states;  // empty: all
  int page_size = 100;
  int64_t before_id = 0;  // > 0: only jobs with a smaller number (the page token)
};

struct JobPage {
  std::vector<Job> jobs;       // newest first
  int64_t next_before_id = 0;  // 0: no more pages
};

// How many jobs are in one state and of one kind (JobStore::CountJobs).
struct JobCount {
  trainctl::v1::JobState state = trainctl::v1::JOB_STATE_UNSPECIFIED;
  trainctl::v1::JobKind kind = trainctl::v1::JOB_KIND_UNSPECIFIED;
  int64_t count = 0;
};

struct CreateJobResult {
  Job job;
  bool created = false;  // false: request_id matched an existing job, which is returned
};

// Edits a job in place inside a store transaction and may add events for it (seq and job_id are
// filled in by the store). A non-OK return aborts the update; nothing is written.
using JobMutation = std::function<absl::Status(Job* job, std::vector<JobEvent>* events)>;

// One record of JobStore::WriteBatch: log lines to append (as AppendLogs), or a mutation of one job
// (as UpdateJob). The cluster's event ingester writes many worker messages as one batch.
struct BatchRecord {
  std::vector<LogLine> lines;  // appended when job_id is empty; each line names its job
  std::string job_id;          // non-empty: `mutate` is applied to this job
  JobMutation mutate;
  // Out: OK once written; else why not (NOT_FOUND, the mutation's error, the store's error).
  absl::Status status;
  Job job;                       // a mutation's job as it left it
  std::vector<JobEvent> events;  // a mutation's events, with their seq
};

struct LogQuery {
  int64_t after_seq = 0;
  int limit = 1000;
  int tail = 0;  // > 0: the last `tail` lines with seq > after_seq (limit still applies)
};

class JobStore {
 public:
  virtual ~JobStore() = default;

  // Stores `job` (its id is assigned here) with `initial_events`, atomically, and returns it. A
  // non-empty request_id already used returns the job created then, with created = false.
  virtual absl::StatusOr<CreateJobResult> CreateJob(const Job& job, const std::string& request_id,
                                                    std::vector<JobEvent> initial_events) = 0;

  // NOT_FOUND when no job has that id.
  virtual absl::StatusOr<Job> GetJob(absl::string_view id) = 0;

  virtual absl::StatusOr<JobPage> ListJobs(const JobFilter& filter) = 0;

  // The number of jobs in each (state, kind) that has any, ordered by state then kind; cheap
  // enough to run on every Prometheus scrape (no job is read whole).
  virtual absl::StatusOr<std::vector<JobCount>> CountJobs() = 0;

  // Reads the job, applies `mutate`, writes it and its new events atomically. Returns the updated
  // job; `events` (optional) receives the appended events with their seq. NOT_FOUND, or the
  // mutation's own error (nothing written).
  virtual absl::StatusOr<Job> UpdateJob(absl::string_view id, const JobMutation& mutate,
                                        std::vector<JobEvent>* events) = 0;

  // Events of one job with seq > after_seq, oldest first, at most `limit`.
  virtual absl::StatusOr<std::vector<JobEvent>> ListEvents(absl::string_view job_id,
                                                           int64_t after_seq, int limit) = 0;

  // Appends log lines (each names its job; seq is assigned here, in order). NOT_FOUND if a job
  // does not exist; then nothing is written.
  virtual absl::Status AppendLogs(std::vector<LogLine>* lines) = 0;

  // Writes `records` in order, in as few transactions as the store can (SqliteJobStore: one). A
  // record that fails on its own (NOT_FOUND, its mutation's error) gets that status and nothing of
  // it is written; the others are. Returns OK, or the store's error when records could not be
  // written; each record's status then says whether it was (OK) or not (SqliteJobStore writes all
  // or none). The default writes them one by one through AppendLogs and UpdateJob.
  virtual absl::Status WriteBatch(std::vector<BatchRecord>* records);

  // Log lines of one job, oldest first.
  virtual absl::StatusOr<std::vector<LogLine>> ListLogs(absl::string_view job_id,
                                                        const LogQuery& query) = 0;
  // The bytes of log text stored for one job (the lines' text, UTF-8). NOT_FOUND for no such job.
  virtual absl::StatusOr<int64_t> LogBytes(absl::string_view job_id) = 0;

  // Keeps `topology` as its node's (topology.node, required: INVALID_ARGUMENT without) latest
  // probe, replacing the one before. Kept across restarts (SqliteJobStore), for nodes gone too.
  virtual absl::Status PutNodeTopology(const trainctl::v1::NodeTopology& topology) = 0;
  // The node's latest probe; nullopt when it never sent one.
  virtual absl::StatusOr<std::optional<trainctl::v1::NodeTopology>> GetNodeTopology(
      absl::string_view node) = 0;
};

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_JOB_STORE_H_
