// The one thread of a process that forks children which must die with it: PR_SET_PDEATHSIG fires
// when the forking *thread* exits, so a child forked from a short-lived thread (an RPC handler, a
// test's worker thread) would get its signal when that thread ends. This thread never exits. It
// runs with every signal blocked, so no handler runs in it and a child starts with every signal
// blocked until it has reset the mask and dispositions before exec. Used by the worker's rank
// launcher (worker/daemon/rank_child.cc) and the tests' PostgreSQL server.
#ifndef TRAINCTL_COMMON_FORK_THREAD_H_
#define TRAINCTL_COMMON_FORK_THREAD_H_

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace trainctl {

class ForkThread {
 public:
  // This process's fork thread, started on first use. A process forked (without exec) from one
  // that had one has no such thread: it gets its own; the inherited object is leaked.
  static ForkThread& Get() {
    static absl::Mutex* const mu = new absl::Mutex;
    static ForkThread* thread = nullptr;
    absl::MutexLock lock(mu);
    if (thread == nullptr || thread->owner_pid_ != getpid()) thread = new ForkThread;
    return *thread;
  }

  // Runs `work` on the fork thread; returns once it has run.
  void Run(const std::function<void()>& work) {
    Job job{&work};
    absl::MutexLock lock(&mu_);
    queue_.push_back(&job);
    cv_.SignalAll();
    while (!job.done) cv_.Wait(&mu_);
  }

 private:
  struct Job {
    const std::function<void()>* work;
    bool done = false;  // guarded by mu_
  };

  ForkThread() : owner_pid_(getpid()) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);  // the new thread inherits this mask
    std::thread([this] { Loop(); }).detach();
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
  }

  void Loop() {
    while (true) {
      Job* job = nullptr;
      {
        absl::MutexLock lock(&mu_);
        while (queue_.empty()) cv_.Wait(&mu_);
        job = queue_.front();
        queue_.pop_front();
      }
      (*job->work)();
      absl::MutexLock lock(&mu_);
      job->done = true;
      cv_.SignalAll();
    }
  }

  const pid_t owner_pid_;
  absl::Mutex mu_;
  absl::CondVar cv_;
  std::deque<Job*> queue_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainctl

#endif  // TRAINCTL_COMMON_FORK_THREAD_H_
