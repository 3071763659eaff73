// StoreTailWriter<T>: a gRPC server-streaming reactor that sends a job's stored records (events or
// log lines) with seq > a starting point, then follows new ones as the JobNotifier announces them,
// and finishes when the job has ended and everything stored was sent (or at once when not
// following).
//
// Concurrency: every decision and every call into gRPC (StartWrite, Finish) happens under one mutex
// in a state object shared with the notifier's listener. gRPC never runs this reactor's reactions
// inline with StartWrite/Finish, and OnDone takes no lock, so the listener can call in at any time:
// after Finish it finds `finished` set and leaves the (possibly deleted) reactor alone.
#ifndef TRAINCTL_COORDINATOR_INTERNAL_STORE_TAIL_WRITER_H_
#define TRAINCTL_COORDINATOR_INTERNAL_STORE_TAIL_WRITER_H_

#include <grpcpp/grpcpp.h>

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/job_notifier.h"

namespace trainctl {

template <typename T>
class StoreTailWriter final : public grpc::ServerWriteReactor<T> {
 public:
  struct Source {
    // Records with seq > after_seq, oldest first (a bounded batch).
    std::function<absl::StatusOr<std::vector<T>>(int64_t after_seq)> fetch;
    // True once the job is in a terminal state (checked only when fetch returned nothing).
    std::function<absl::StatusOr<bool>()> job_over;
    bool follow = true;
  };

  // Starts streaming at once. The reactor deletes itself when gRPC is done with it.
  StoreTailWriter(JobNotifier* notifier, const std::string& job_id, int64_t after_seq,
                  Source source)
      : state_(std::make_shared<State>()) {
    state_->reactor = this;
    state_->source = std::move(source);
    state_->last_seq = after_seq;
    if (state_->source.follow) notifier->Subscribe(job_id, state_);
    absl::MutexLock lock(&state_->mu);
    state_->PumpLocked();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&state_->mu);
    state_->writing = false;
    if (!ok)
      return state_->FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "stream closed"));
    state_->pending.pop_front();
    state_->PumpLocked();
  }

  void OnCancel() override {
    absl::MutexLock lock(&state_->mu);
    state_->FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client"));
  }

  void OnDone() override { delete this; }

 private:
  struct State final : JobNotifier::Listener {
    void OnJobChanged() override {
      absl::MutexLock lock(&mu);
      PumpLocked();
    }

    // Sends the next pending record, refilling from the store when the queue runs dry.
    void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      if (finished || writing) return;
      if (pending.empty()) {
        auto batch = source.fetch(last_seq);
        if (!batch.ok()) return FinishLocked(ToGrpc(batch.status()));
        for (T& record : *batch) {
          last_seq = record.seq();
          pending.push_back(std::move(record));
        }
      }
      if (!pending.empty()) {
        writing = true;
        reactor->StartWrite(&pending.front());
        return;
      }
      if (!source.follow) return FinishLocked(grpc::Status::OK);
      auto over = source.job_over();
      if (!over.ok()) return FinishLocked(ToGrpc(over.status()));
      if (*over) {
        // The terminal state is stored before its notification: one last read catches anything
        // stored between the fetch above and the state check.
        auto tail = source.fetch(last_seq);
        if (tail.ok() && !tail->empty()) {
          for (T& record : *tail) {
            last_seq = record.seq();
            pending.push_back(std::move(record));
          }
          writing = true;
          reactor->StartWrite(&pending.front());
          return;
        }
        FinishLocked(grpc::Status::OK);
      }
    }

    void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      if (finished) return;
      finished = true;
      reactor->Finish(status);
    }

    static grpc::Status ToGrpc(const absl::Status& s) {
      return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
    }

    absl::Mutex mu;
    StoreTailWriter* reactor ABSL_GUARDED_BY(mu) = nullptr;
    Source source;
    int64_t last_seq ABSL_GUARDED_BY(mu) = 0;
    std::deque<T> pending ABSL_GUARDED_BY(mu);
    bool writing ABSL_GUARDED_BY(mu) = false;
    bool finished ABSL_GUARDED_BY(mu) = false;
  };

  std::shared_ptr<State> state_;
};

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_INTERNAL_STORE_TAIL_WRITER_H_
