// EventIngester: stores what workers report in bulk — rank log batches and trainer events
// (metrics, checkpoints) — on its own thread, many worker messages per store transaction, so the
// cluster's loop never waits on the disk and a chatty job costs one commit per batch, not per
// message.
//
// The cluster hands it a message once the message passed its checks and was not seen before, and
// learns through `on_stored` (called on the ingester's thread, in submission order) which messages
// are stored: only then may they be acknowledged. A message that cannot be stored for good (an
// unknown job, an unreadable event) is logged and reported as stored, so it is acknowledged and
// never sent again; one that hit a transient store error (IsTransientStoreError: a full disk) is
// reported with that error, and the ingester writes nothing more of the same session (the worker
// sends it all again on its next session).
//
// Flow control: the queue is bounded in bytes. Submit never blocks; while the queue is over its
// bound, each message's `release` waits until the queue drains below it, and the worker's stream
// reads nothing more meanwhile (one message in flight per stream).
//
// Thread-safe.
#ifndef TRAINCTL_COORDINATOR_EVENT_INGESTER_H_
#define TRAINCTL_COORDINATOR_EVENT_INGESTER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "coordinator/job_manager.h"
#include "trainctl/v1/worker.pb.h"

namespace trainctl {

struct EventIngesterOptions {
  // Queued message bytes above which senders are held (their `release` waits).
  size_t max_queue_bytes = 32 << 20;
  // At most this much goes into one batch (its log records and its event records are one
  // transaction each).
  size_t max_batch_bytes = 8 << 20;
  int max_batch_messages = 4096;
  // Log text stored per job (the lines' bytes) at most: lines past it are dropped, counted in
  // trainctl_log_lines_dropped_total, and the job gets one warning event saying so (per
  // coordinator run). The worker keeps every rank's whole output in its rank log files. The count
  // starts from what the store holds (JobStore::LogBytes), so a restart does not reset it.
  int64_t max_job_log_bytes = int64_t{64} << 20;
  // Optional (nullptr: none): trainctl_events_ingested_total, trainctl_log_lines_ingested_total,
  // trainctl_log_lines_dropped_total, trainctl_log_bytes_stored_total,
  // trainctl_ingest_queue_depth, trainctl_store_commit_duration_seconds{op=logs|events}.
  metrics::Registry* metrics = nullptr;
};

class EventIngester {
 public:
  // Which message was stored (status OK) or not (a transient store error).
  struct Outcome {
    int64_t session = 0;
    std::string node;
    int64_t seq = 0;
    absl::Status status;
    bool topology = false;  // the message was a topology probe (JobStore::PutNodeTopology)
  };
  using OnStored = std::function<void(std::vector<Outcome> outcomes)>;

  // Does not take ownership; `jobs` must outlive the ingester. Starts its thread.
  EventIngester(JobManager* jobs, EventIngesterOptions options, OnStored on_stored);
  ~EventIngester();  // Stop()
  EventIngester(const EventIngester&) = delete;
  EventIngester& operator=(const EventIngester&) = delete;

  // Stores what is queued, then ends the thread. Later submits are stored on the caller's thread.
  void Stop();

  // Queues `message` (logs, event, or topology: a node's topology probe, stored under `node`) of
  // `node`'s `session`. `release` runs once the queue has room
  // (at once, on this thread, when it has now).
  void Submit(int64_t session, const std::string& node, trainctl::v1::WorkerMessage message,
              std::function<void()> release);

  // Returns once everything submitted before the call has been stored and its outcome reported.
  void Flush();

  // Messages waiting to be stored.
  size_t depth();

 private:
  struct Item {
    int64_t session = 0;
    std::string node;
    trainctl::v1::WorkerMessage message;
    size_t bytes = 0;
    std::function<void()> release;  // set while the sender is held
  };
  struct Metrics;
  // One job's stored log text, as far as this ingester knows (store_mu_).
  struct LogBudget {
    int64_t stored = -1;  // -1: not read from the store yet
    bool warned = false;  // its dropped-lines warning is recorded
  };

  void Run();
  // Keeps the lines of `lines` that fit their job's max_job_log_bytes, counting them as stored;
  // a job's first dropped line adds its warning record to `events`. `touched` gets the jobs whose
  // count changed.
  std::vector<LogLine> AdmitLogLines(google::protobuf::RepeatedPtrField<LogLine>* lines,
                                     std::vector<BatchRecord>* events,
                                     std::set<std::string>* touched)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(store_mu_);
  // A batch's records for the store (log records and event records), and where each item's is.
  struct BatchWrites;
  // Stores `batch` and reports its outcomes.
  void Store(std::vector<Item>& batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(store_mu_);
  // The records of `batch`'s logs and events, for items of sessions not failed (none for
  // topology probes, which are stored one by one).
  void StageBatch(std::vector<Item>& batch, BatchWrites* writes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(store_mu_);
  // Writes `records` in one transaction (if any), timing it for the commit histogram.
  void CommitRecords(std::vector<BatchRecord>* records, bool are_logs);
  // After the commit: counts the log bytes stored, and reports the jobs' stored log bytes (or,
  // after a transient error, forgets them all, to be read from the store again).
  void AccountStoredLogs(const BatchWrites& writes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(store_mu_);
  // The outcome of `batch[i]` (`item`) once `writes` are committed: a topology probe is stored
  // here; a transient error fails the item's session for the rest of the batch and after.
  Outcome ItemOutcome(const Item& item, size_t i, const BatchWrites& writes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(store_mu_);
  // Stores a topology probe (`item`) under its session's node, setting `out` from the result.
  void StoreTopology(const Item& item, Outcome* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(store_mu_);
  // The record a trainer event becomes, or nothing (an event type the store does not keep, or one
  // that does not parse: logged). `type` is set for the events counter.
  bool EventRecord(const trainctl::v1::TrainerEvent& event, BatchRecord* record, std::string* type);
  // Runs held senders' `release` while the queue is under its bound. Called with mu_ held; the
  // releases run after it is unlocked (collected in `out`).
  void ReleaseLocked(std::vector<std::function<void()>>* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  JobManager* const jobs_;
  const EventIngesterOptions options_;
  const OnStored on_stored_;
  std::unique_ptr<Metrics> metrics_;

  absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  size_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t submitted_ ABSL_GUARDED_BY(mu_) = 0;  // messages ever submitted
  int64_t finished_ ABSL_GUARDED_BY(mu_) = 0;   // of those, stored and reported
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex store_mu_;  // one Store at a time (the thread, or callers after Stop)
  // Sessions whose message hit a transient store error, with that error: nothing more of theirs is
  // written.
  std::map<int64_t, absl::Status> failed_sessions_ ABSL_GUARDED_BY(store_mu_);
  std::map<std::string, LogBudget> log_budgets_ ABSL_GUARDED_BY(store_mu_);
  std::thread thread_;
};

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_EVENT_INGESTER_H_
