// JobNotifier: wakes the watchers of a job when something about it was stored (an event, a log
// line, a state change). A notification carries no data: the woken watcher reads what is new from
// the store, so notifications may be coalesced or arrive out of order without anything being lost.
// It is one of JobManager's observers (JobObserver::OnStored), added where the daemon is wired.
#ifndef TRAINCTL_COORDINATOR_JOB_NOTIFIER_H_
#define TRAINCTL_COORDINATOR_JOB_NOTIFIER_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/job_observer.h"

namespace trainctl {

// Thread-safe.
class JobNotifier final : public JobObserver {
 public:
  class Listener {
   public:
    virtual ~Listener() = default;
    // Called on the notifying thread, with no JobNotifier lock held. Must not block for long.
    virtual void OnJobChanged() = 0;
  };

  // Listeners are held weakly: one that has been destroyed is dropped at the next notification.
  void Subscribe(const std::string& job_id, std::weak_ptr<Listener> listener);
  void Notify(const std::string& job_id);
  void OnStored(const std::string& job_id) override { Notify(job_id); }
  // Live listeners of a job (for tests).
  int ListenerCount(const std::string& job_id);

 private:
  absl::Mutex mu_;
  std::map<std::string, std::vector<std::weak_ptr<Listener>>> listeners_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_JOB_NOTIFIER_H_
