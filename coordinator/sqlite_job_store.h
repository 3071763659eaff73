// SqliteJobStore: the JobStore on one SQLite file in WAL mode.
//
// A full disk is RESOURCE_EXHAUSTED (UNAVAILABLE for other I/O errors); nothing of the failed write
// is kept, and the caller may try again later.
//
// Durability: every write is committed (synchronous=FULL by default: survives power loss, not only
// a crash of the process) before the call returns. Concurrent writers are group-committed: the
// first writer in the queue runs every queued writer's work in one transaction (one fsync), each
// inside its own savepoint so one failure does not undo the others. Reads use a second connection
// and never wait for a commit in progress.
//
// Schema changes are numbered migrations (PRAGMA user_version); opening a database applies the
// missing ones, each in its own transaction. Thread-safe.
#ifndef TRAINCTL_COORDINATOR_SQLITE_JOB_STORE_H_
#define TRAINCTL_COORDINATOR_SQLITE_JOB_STORE_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/internal/group_commit.h"
#include "coordinator/internal/sqlite.h"
#include "coordinator/job_store.h"
#include "coordinator/metric_retention.h"

namespace trainctl {

class SqliteJobStore final : public JobStore {
 public:
  struct Options {
    std::string path;
    // FULL: fsync at every commit. NORMAL: WAL-safe against process crashes, may lose the last
    // commits on power loss.
    bool synchronous_full = true;
    // Tests open older schemas with this; 0 means the latest.
    int schema_version = 0;
    // Metric events kept per job before older ones are thinned (coordinator/metric_retention.h).
    int max_metric_events = kDefaultMaxMetricEventsPerJob;
  };

  // Opens or creates the database and migrates it. UNAVAILABLE when the file cannot be opened,
  // DATA_LOSS when it is not a database, FAILED_PRECONDITION when its schema is newer than this
  // binary's.
  static absl::StatusOr<std::unique_ptr<SqliteJobStore>> Open(const Options& options);
  static int LatestSchemaVersion();
  // The database's schema version (for tests of migrations).
  absl::StatusOr<int> SchemaVersion();

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
  // One transaction for the whole batch: every record is written, or none (then each record's
  // status is the store's error).
  absl::Status WriteBatch(std::vector<BatchRecord>* records) override;
  // In sqlite_node_topology.cc (table node_topology, schema migration 5).
  absl::Status PutNodeTopology(const trainctl::v1::NodeTopology& topology) override;
  absl::StatusOr<std::optional<trainctl::v1::NodeTopology>> GetNodeTopology(
      absl::string_view node) override;

 private:
  using Queue = internal::WriteQueue<sqlite::Db>;
  using Work = Queue::Work;

  SqliteJobStore(std::unique_ptr<sqlite::Db> writer, std::unique_ptr<sqlite::Db> reader)
      : writer_db_(std::move(writer)), reader_db_(std::move(reader)) {}

  // Runs `work` inside a committed transaction, batched with concurrent writers.
  absl::Status Write(const Work& work);
  // Commits the group; writers that failed on a full disk are tried once more after a checkpoint
  // that truncates the WAL.
  void CommitGroup(const std::vector<Queue::Writer*>& group);

  class BatchTx;

  Queue queue_;
  // Used only by the current group leader (the front of queue_), so it needs no lock of its own.
  std::unique_ptr<sqlite::Db> writer_db_;

  absl::Mutex read_mu_;
  std::unique_ptr<sqlite::Db> reader_db_ ABSL_GUARDED_BY(read_mu_);

  // Metric retention, inside a write transaction: counts the job's metric events (`added` just
  // inserted among them) and thins them once there are more than max_metric_events_.
  absl::Status ThinMetricEvents(sqlite::Db& db, int64_t job_n, const std::vector<JobEvent>& added);
  // After a write that failed: its counts may not have been committed; count again next time.
  void ForgetMetricCount(int64_t job_n);

  int max_metric_events_ = kDefaultMaxMetricEventsPerJob;
  // Each job's metric events as last counted, so that an insert need not count them. Only a hint:
  // a stale count thins a little early or late.
  absl::Mutex counts_mu_;
  std::map<int64_t, int64_t> metric_counts_ ABSL_GUARDED_BY(counts_mu_);
};

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_SQLITE_JOB_STORE_H_
