// What the SQL job stores (SqliteJobStore, PostgresJobStore) share: how a job and an event are
// laid out in rows, and WriteBatch's rules over a store's own statements.
#ifndef TRAINCTL_COORDINATOR_INTERNAL_SQL_STORE_H_
#define TRAINCTL_COORDINATOR_INTERNAL_SQL_STORE_H_

#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/job_store.h"
#include "google/protobuf/timestamp.pb.h"

namespace trainctl::internal {

int64_t ToMicros(const google::protobuf::Timestamp& t);

// The job's blob: what no column or other table holds (not its id, stages or current stage).
std::string JobBlob(const Job& job);

// The job_events.kind column: the event's payload ("state_change", "metric", ...).
const char* EventKind(const JobEvent& e);

// A store's statements inside one write transaction, as WriteBatch uses them.
class BatchTransaction {
 public:
  virtual ~BatchTransaction() = default;
  // The job numbered `n` as stored; NOT_FOUND when there is none.
  virtual absl::StatusOr<Job> ReadJob(int64_t n) = 0;
  // AppendLogs' insert: assigns seqs; NOT_FOUND (nothing inserted) when a job does not exist.
  virtual absl::Status InsertLogLines(std::vector<LogLine>* lines) = 0;
  // Writes `after` over `before` (its row and the stages that changed).
  virtual absl::Status WriteJob(int64_t n, const Job& after, const Job& before) = 0;
  // Inserts the job's events, filling their seq and job id.
  virtual absl::Status InsertEvents(int64_t n, std::vector<JobEvent>* events) = 0;
  // Metric retention after `added` were inserted for job `n`.
  virtual absl::Status ThinMetricEvents(int64_t n, const std::vector<JobEvent>& added) = 0;
};

// A job a batch mutates: its mutations apply in record order to one read of it, written once.
struct BatchJob {
  Job before, after;
  std::vector<BatchRecord*> records;  // its mutations that succeeded, in order
};

// JobStore::UpdateJob's body inside the store's transaction: reads job `n`, applies `mutate`,
// writes the job and `events` (filled by the mutation, then given their seqs), thins metrics.
// `updated` receives the job as it was written.
absl::Status ApplyUpdate(BatchTransaction& tx, int64_t n, const JobMutation& mutate, Job* updated,
                         std::vector<JobEvent>* events);

// JobStore::WriteBatch's body inside the store's transaction: every record in order, each
// record's status set (NOT_FOUND, its mutation's error); `jobs` receives the jobs it touched.
// Returns the first store error (transient or not), after which the caller rolls back.
absl::Status ApplyBatch(BatchTransaction& tx, std::vector<BatchRecord>* records,
                        std::map<int64_t, BatchJob>* jobs);

}  // namespace trainctl::internal

#endif  // TRAINCTL_COORDINATOR_INTERNAL_SQL_STORE_H_
