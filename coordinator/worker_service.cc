#include "coordinator/worker_service.h"

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"

namespace trainctl {
namespace {

namespace v1 = trainctl::v1;
using Reactor = grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>;

// The stream's state shared by the reactor (deleted by gRPC in OnDone) and the cluster (which holds
// it as a WorkerChannel for as long as it likes): once the reactor is gone, everything is a no-op.
class SessionChannel final : public WorkerChannel {
 public:
  explicit SessionChannel(Reactor* reactor) : reactor_(reactor) {}

  void Send(v1::CoordinatorMessage message) override {
    v1::CoordinatorMessage* next = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (reactor_ == nullptr || finishing_) return;
      queue_.push_back(std::move(message));
      if (writing_) return;
      writing_ = true;
      next = &queue_.front();  // deque references stay valid across push_back
      reactor_->StartWrite(next);
    }
  }

  void Close(const absl::Status& why) override {
    absl::MutexLock lock(&mu_);
    FinishLocked(
        grpc::Status(static_cast<grpc::StatusCode>(why.code()), std::string(why.message())));
  }

  // Reactor callbacks.
  void WriteDone(bool ok) {
    absl::MutexLock lock(&mu_);
    queue_.pop_front();
    if (!ok) {
      queue_.clear();
      writing_ = false;
      if (pending_finish_) FinishNow();
      return;
    }
    if (!queue_.empty() && !pending_finish_) {
      reactor_->StartWrite(&queue_.front());
    } else {
      writing_ = false;
      if (pending_finish_) FinishNow();
    }
  }
  // Reads the next message into `in` (the reactor's buffer lives here, so a late call after the
  // reactor is gone touches nothing of it).
  void ResumeRead() {
    absl::MutexLock lock(&mu_);
    if (reactor_ != nullptr && !finishing_) reactor_->StartRead(&in);
  }

  v1::WorkerMessage in;
  void Finish(const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    FinishLocked(status);
  }
  void Detach() {
    absl::MutexLock lock(&mu_);
    reactor_ = nullptr;
  }

 private:
  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (reactor_ == nullptr || finishing_) return;
    finishing_ = true;
    status_ = status;
    if (writing_) {
      pending_finish_ = true;  // after the write in flight
    } else {
      FinishNow();
    }
  }
  void FinishNow() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    pending_finish_ = false;
    if (reactor_ != nullptr && !finished_) {
      finished_ = true;
      reactor_->Finish(status_);
    }
  }

  absl::Mutex mu_;
  Reactor* reactor_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::CoordinatorMessage> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool pending_finish_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

// A session refused before it began.
class RefusedSession final : public Reactor {
 public:
  explicit RefusedSession(const absl::Status& why) {
    Finish(grpc::Status(static_cast<grpc::StatusCode>(why.code()), std::string(why.message())));
  }
  void OnDone() override { delete this; }
};

class SessionReactor final : public Reactor {
 public:
  SessionReactor(Cluster* cluster, const RpcAuthorizer* authorizer, Caller caller)
      : cluster_(cluster),
        authorizer_(authorizer),
        caller_(std::move(caller)),
        channel_(std::make_shared<SessionChannel>(this)) {
    session_ = cluster_->Connect(channel_);
    StartRead(&channel_->in);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The worker closed its side or the connection broke.
      Disconnect();
      channel_->Finish(grpc::Status::OK);
      return;
    }
    if (channel_->in.has_register_()) {
      const absl::Status s =
          authorizer_->CheckNodeName(caller_, channel_->in.register_().node_name());
      if (!s.ok()) {
        TRAINCTL_LOG(WARNING) << "worker session refused: " << s.message();
        Disconnect();
        channel_->Close(s);
        return;
      }
    }
    std::weak_ptr<SessionChannel> channel = channel_;
    cluster_->Receive(session_, std::move(channel_->in), [channel] {
      if (auto c = channel.lock()) c->ResumeRead();
    });
  }
  void OnWriteDone(bool ok) override { channel_->WriteDone(ok); }
  void OnCancel() override { Disconnect(); }
  void OnDone() override {
    Disconnect();
    channel_->Detach();
    delete this;
  }

 private:
  void Disconnect() {
    if (disconnected_.exchange(true)) return;
    cluster_->Disconnect(session_);
  }

  Cluster* const cluster_;
  const RpcAuthorizer* const authorizer_;
  const Caller caller_;
  std::shared_ptr<SessionChannel> channel_;
  int64_t session_ = 0;
  std::atomic<bool> disconnected_{false};
};

}  // namespace

grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>* WorkerServiceImpl::Session(
    grpc::CallbackServerContext* context) {
  static const RpcAuthorizer kOpen;
  const RpcAuthorizer* authorizer = authorizer_ == nullptr ? &kOpen : authorizer_;
  absl::StatusOr<Caller> caller = authorizer->Authorize(*context, "WorkerService/Session");
  if (!caller.ok()) {
    TRAINCTL_LOG(WARNING) << "worker session refused: " << caller.status().message();
    return new RefusedSession(caller.status());
  }
  return new SessionReactor(cluster_, authorizer, *std::move(caller));
}

}  // namespace trainctl
