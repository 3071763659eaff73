// PostgresJobStore: the JobStore on a PostgreSQL database (`--db postgresql://...`), for sites
// that already run PostgreSQL and want the coordinator's record off its machine.
//
// Durability: every write is committed with synchronous_commit = on (set on the session, whatever
// the server's default) before the call returns, so an acknowledged write survives a crash of the
// server. Concurrent writers are group-committed on one writing connection as in SqliteJobStore
// (internal/group_commit.h): commit order is queue order, so event and log seqs grow in the order
// they become visible to the watchers that tail them. Reads use a second connection.
//
// Losing the server: a call in flight fails UNAVAILABLE (nothing of it is kept unless it was
// committed; a retried submit with its request id finds it), and the next call connects again.
//
// One coordinator writes to a database, the one that leads it (TryLead): it holds the lead's
// advisory lock on its writing session and a lease in table trainctl_leader that it renews
// (RenewLead). Another takes over when the lock is free (the leader's session ended: it died, or
// its connection did) or the lease ran out (a leader paused or cut off, whose session it then
// ends); each takeover raises the lead's epoch. Every write transaction first checks, under a
// share lock on the lead's row, that this store's epoch still leads with its lease unexpired, so a
// leader that was taken over writes nothing more (FAILED_PRECONDITION), even one that resumes
// after a pause. A store that does not lead writes nothing.
//
// Schema: numbered migrations in table trainctl_schema, applied under a transaction-level advisory
// lock at Open, or when a standby takes the lead. Log text is stored as text: a NUL byte, which
// PostgreSQL text cannot hold, is stored as U+FFFD. Thread-safe.
#ifndef TRAINCTL_COORDINATOR_POSTGRES_JOB_STORE_H_
#define TRAINCTL_COORDINATOR_POSTGRES_JOB_STORE_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "coordinator/internal/group_commit.h"
#include "coordinator/internal/pg.h"
#include "coordinator/job_store.h"
#include "coordinator/metric_retention.h"

namespace trainctl {

class PostgresJobStore final : public JobStore {
 public:
  struct Options {
    std::string uri;  // postgresql://user[:password]@host[:port]/database[?param=value]
    // Tests open older schemas with this; 0 means the latest.
    int schema_version = 0;
    // Metric events kept per job before older ones are thinned (coordinator/metric_retention.h).
    int max_metric_events = kDefaultMaxMetricEventsPerJob;
  };

  // Connects and migrates the schema, unless another coordinator leads the database (it runs its
  // own schema): then at TryLead. The store leads nothing yet: TryLead. UNAVAILABLE when the server
  // cannot be reached, FAILED_PRECONDITION when its schema is newer than this binary's.
  static absl::StatusOr<std::unique_ptr<PostgresJobStore>> Open(const Options& options);
  static int LatestSchemaVersion();
  absl::StatusOr<int> SchemaVersion();

  // Takes the lead of the database for `lease` when no other coordinator holds it: OK, this store
  // now writes. FAILED_PRECONDITION naming the leader (`holder`, a host and pid) and its lease
  // otherwise; UNAVAILABLE when the server cannot be reached. A lease that ran out has its holder's
  // session ended, and the lead is taken at a later try, once that session is gone.
  absl::Status TryLead(const std::string& holder, absl::Duration lease);
  // Extends the lease (call well within it). FAILED_PRECONDITION once another took the lead: this
  // store writes nothing more.
  absl::Status RenewLead();
  bool leading() const { return epoch_.load() > 0; }

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
  // One transaction for the whole batch: every record is written, or none.
  absl::Status WriteBatch(std::vector<BatchRecord>* records) override;
  absl::Status PutNodeTopology(const trainctl::v1::NodeTopology& topology) override;
  absl::StatusOr<std::optional<trainctl::v1::NodeTopology>> GetNodeTopology(
      absl::string_view node) override;

 private:
  using Queue = internal::WriteQueue<pg::Conn>;
  using Work = Queue::Work;
  class Transaction;

  PostgresJobStore(std::unique_ptr<pg::Conn> writer, std::unique_ptr<pg::Conn> reader,
                   int max_metric_events)
      : writer_(std::move(writer)),
        reader_(std::move(reader)),
        max_metric_events_(max_metric_events) {}

  // Runs `work` inside a committed transaction, batched with concurrent writers, once the
  // transaction has checked that this store still leads (CheckLead).
  absl::Status Write(const Work& work);
  // Runs `work` in a transaction of its own on the writer (the lead's statements; no lead check).
  absl::Status InLeadTransaction(const Work& work) ABSL_EXCLUSIVE_LOCKS_REQUIRED(writer_mu_);
  // UNAVAILABLE unless this store's epoch leads with its lease unexpired.
  absl::Status CheckLead(pg::Conn& conn);
  // After TryLead won `epoch`: the session's settings, a deferred migration, the reconnections'
  // setup.
  absl::Status BecomeLeader(int64_t epoch, absl::Duration lease, const std::string& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(writer_mu_);
  static std::string TakenOver(const pg::Conn& conn, int64_t epoch);
  // A read on the reader's connection (connected again first if it was lost).
  template <typename Fn>
  auto Read(Fn fn) -> decltype(fn(std::declval<pg::Conn&>()));
  // After a write that failed: its counts may not have been committed; count again next time.
  void ForgetMetricCount(int64_t job_n);

  Queue queue_;
  // Held by whoever uses writer_: the group leader while it commits, TryLead and RenewLead.
  absl::Mutex writer_mu_;
  std::unique_ptr<pg::Conn> writer_;
  // A schema version to migrate to once leading (Open found another coordinator leading); 0: none.
  int pending_migration_ ABSL_GUARDED_BY(writer_mu_) = 0;
  bool relock_added_ ABSL_GUARDED_BY(writer_mu_) = false;  // reconnections take the lock again
  absl::Mutex read_mu_;
  std::unique_ptr<pg::Conn> reader_ ABSL_GUARDED_BY(read_mu_);

  const int max_metric_events_;
  // The lead's epoch this store holds; 0 when it does not lead. lease_ is its length.
  std::atomic<int64_t> epoch_{0};
  std::atomic<int64_t> lease_us_{0};
  // Each job's metric events as last counted (a hint, as in SqliteJobStore).
  absl::Mutex counts_mu_;
  std::map<int64_t, int64_t> metric_counts_ ABSL_GUARDED_BY(counts_mu_);
};

template <typename Fn>
auto PostgresJobStore::Read(Fn fn) -> decltype(fn(std::declval<pg::Conn&>())) {
  absl::MutexLock lock(&read_mu_);
  RETURN_IF_ERROR(reader_->EnsureConnected());
  auto result = fn(*reader_);
  if (result.ok() || reader_->connected()) return result;
  // The server dropped the connection (it restarted while we were idle): reads are safe to repeat.
  RETURN_IF_ERROR(reader_->EnsureConnected());
  return fn(*reader_);
}

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_POSTGRES_JOB_STORE_H_
