// Outbox: what a worker has to tell the coordinator, kept until the coordinator acknowledges it.
//
// Every message gets the next sequence number. Messages stay until Ack(seq) covers them, so a
// reconnecting worker sends again everything the coordinator may not have applied. Memory is
// bounded: past `memory_limit_bytes`, new messages are appended to a spill file on disk and read
// back, in order, as acknowledgements make room. A message the coordinator cannot take is removed
// (SetAside) so it never blocks the ones behind it. Thread-safe.
#ifndef TRAINCTL_WORKER_DAEMON_OUTBOX_H_
#define TRAINCTL_WORKER_DAEMON_OUTBOX_H_

#include <cstdint>
#include <cstdio>
#include <deque>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "trainctl/v1/worker.pb.h"

namespace trainctl::worker {

class Outbox {
 public:
  Outbox(std::string spill_path, size_t memory_limit_bytes);
  ~Outbox();
  Outbox(const Outbox&) = delete;
  Outbox& operator=(const Outbox&) = delete;

  // Stamps `message` with the next seq and keeps it. Returns the seq.
  int64_t Push(trainctl::v1::WorkerMessage message);

  // Waits until a message with seq > `after_seq` is held or `deadline` passes, then returns up to
  // `max` of them in order (empty on timeout or after Close).
  std::vector<trainctl::v1::WorkerMessage> WaitNext(int64_t after_seq, int max,
                                                    absl::Time deadline);
  // Drops every message with seq <= through_seq.
  void Ack(int64_t through_seq);
  // Takes message `seq` out for good: it is not sent again. NOT_FOUND when it is not held in memory
  // (acknowledged already, or still spilled: only messages in memory are ever sent).
  absl::StatusOr<trainctl::v1::WorkerMessage> SetAside(int64_t seq);
  // Wakes waiters for good.
  void Close();

  int64_t acked_through();
  int64_t last_seq();
  int64_t first_held();  // the smallest seq not yet acknowledged nor set aside; 0 when none
  size_t held();         // messages not yet acknowledged
  size_t spilled();      // of those, how many are on disk
  // The bytes those take on disk.
  int64_t spilled_bytes();
  // An error of the spill file (disk full...), if one happened; messages were then kept in memory.
  absl::Status spill_status();

 private:
  // Moves spilled messages back to memory, in order: until memory is half full, or all of them.
  void RefillLocked(bool all) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string spill_path_;
  const size_t memory_limit_;
  absl::Mutex mu_;
  std::deque<trainctl::v1::WorkerMessage> memory_ ABSL_GUARDED_BY(mu_);
  size_t memory_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::FILE* spill_ ABSL_GUARDED_BY(mu_) = nullptr;  // opened on first spill
  long spill_read_offset_ ABSL_GUARDED_BY(mu_) = 0;
  size_t spilled_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t spilled_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // of the records not yet read back
  absl::Status spill_status_ ABSL_GUARDED_BY(mu_);
  int64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t acked_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace trainctl::worker

#endif  // TRAINCTL_WORKER_DAEMON_OUTBOX_H_
