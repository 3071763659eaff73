#include "coordinator/job_notifier.h"

namespace trainctl {

void JobNotifier::Subscribe(const std::string& job_id, std::weak_ptr<Listener> listener) {
  absl::MutexLock lock(&mu_);
  listeners_[job_id].push_back(std::move(listener));
}

void JobNotifier::Notify(const std::string& job_id) {
  std::vector<std::shared_ptr<Listener>> live;
  {
    absl::MutexLock lock(&mu_);
    auto it = listeners_.find(job_id);
    if (it == listeners_.end()) return;
    auto& list = it->second;
    for (auto w = list.begin(); w != list.end();) {
      if (auto l = w->lock()) {
        live.push_back(std::move(l));
        ++w;
      } else {
        w = list.erase(w);
      }
    }
    if (list.empty()) listeners_.erase(it);
  }
  for (auto& l : live) l->OnJobChanged();
}

int JobNotifier::ListenerCount(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = listeners_.find(job_id);
  if (it == listeners_.end()) return 0;
  int n = 0;
  for (const auto& w : it->second) n += w.expired() ? 0 : 1;
  return n;
}

}  // namespace trainctl
