// Group commit for a store with one writing connection (SqliteJobStore, PostgresJobStore):
// concurrent writers queue their work; the first in the queue runs the work of every queued writer
// (up to kMaxGroup) in one transaction — one fsync, one round of commit — each inside its own
// savepoint so that one failure does not undo the others, then wakes them with their statuses.
// Commit order is queue order, so the numbers a store assigns in a transaction (event and log
// seqs) grow in the order they become visible.
#ifndef TRAINCTL_COORDINATOR_INTERNAL_GROUP_COMMIT_H_
#define TRAINCTL_COORDINATOR_INTERNAL_GROUP_COMMIT_H_

#include <algorithm>
#include <deque>
#include <functional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace trainctl::internal {

// `Db` runs statements without parameters through `absl::Status ExecCached(absl::string_view)`.
template <typename Db>
class WriteQueue {
 public:
  using Work = std::function<absl::Status(Db& db)>;
  struct Writer {
    const Work* work;
    absl::Status status;
    bool done = false;
  };
  // Commits a group: runs each writer's work and sets its status (CommitInSavepoints, and what a
  // store does around it).
  using CommitFn = std::function<void(const std::vector<Writer*>& group)>;

  static constexpr size_t kMaxGroup = 256;

  // Runs `work` inside a committed transaction, batched with concurrent writers; returns its
  // status once committed (or why it was not).
  absl::Status Write(const Work& work, const CommitFn& commit) {
    Writer self{&work, absl::OkStatus(), false};
    mu_.Lock();
    writers_.push_back(&self);
    while (!self.done && writers_.front() != &self) cv_.Wait(&mu_);
    if (self.done) {  // a leader committed our work with its group
      mu_.Unlock();
      return self.status;
    }
    std::vector<Writer*> group(writers_.begin(),
                               writers_.begin() + std::min(writers_.size(), kMaxGroup));
    mu_.Unlock();

    commit(group);

    mu_.Lock();
    for (Writer* w : group) {
      writers_.pop_front();
      w->done = true;
    }
    cv_.SignalAll();  // the group's writers, and the next leader
    mu_.Unlock();
    return self.status;
  }

 private:
  absl::Mutex mu_;
  absl::CondVar cv_;
  std::deque<Writer*> writers_ ABSL_GUARDED_BY(mu_);
};

// One transaction (`begin` opens it) for the group's work; each writer's status is its work's, or
// the commit's error. Alone in the transaction, a writer's failure rolls back the whole of it (no
// savepoint needed). `first` (optional) runs right after `begin`: its error is every writer's, and
// nothing is written (PostgresJobStore's check that it still leads the database).
template <typename Db>
void CommitInSavepoints(Db& db, absl::string_view begin,
                        const std::vector<typename WriteQueue<Db>::Writer*>& group,
                        const std::function<absl::Status(Db&)>& first = nullptr) {
  if (absl::Status s = db.ExecCached(begin); !s.ok()) {
    for (auto* w : group) w->status = s;
    return;
  }
  if (first != nullptr) {
    if (absl::Status s = first(db); !s.ok()) {
      (void)db.ExecCached("ROLLBACK");
      for (auto* w : group) w->status = s;
      return;
    }
  }
  if (group.size() == 1) {
    auto* w = group[0];
    w->status = (*w->work)(db);
    if (!w->status.ok()) {
      (void)db.ExecCached("ROLLBACK");
      return;
    }
  } else {
    for (auto* w : group) {
      absl::Status s = db.ExecCached("SAVEPOINT w");
      if (s.ok()) s = (*w->work)(db);
      if (!s.ok()) (void)db.ExecCached("ROLLBACK TO w");
      (void)db.ExecCached("RELEASE w");
      w->status = s;
    }
  }
  if (absl::Status commit = db.ExecCached("COMMIT"); !commit.ok()) {
    (void)db.ExecCached("ROLLBACK");
    for (auto* w : group) {
      if (w->status.ok()) w->status = commit;
    }
  }
}

}  // namespace trainctl::internal

#endif  // TRAINCTL_COORDINATOR_INTERNAL_GROUP_COMMIT_H_
