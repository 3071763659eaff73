// The session protocol: register, every message a worker sends (routed to the event ingester or
// applied on the loop, acknowledged once stored, rejected, or left for a resend). What a message
// means for jobs is GangRunner's (gang_runner.h); who may take a node's name is NodeRegistry's.
// The loop, leases and the public calls are in cluster.cc.
#include <algorithm>
#include <future>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/worker_limits.h"
#include "coordinator/cluster.h"
#include "coordinator/internal/cluster_metrics.h"

namespace trainctl {

namespace v1 = trainctl::v1;

void Cluster::HandleMessage(int64_t session, v1::WorkerMessage message, absl::Status checked,
                            absl::Time arrived, std::function<void()> done) {
  if (message.has_register_()) {
    HandleRegister(session, message.register_());
    done();
    return;
  }
  WorkerNode* node = registry_.ForSession(session);
  if (node == nullptr) {
    if (auto channel = registry_.SessionChannel(session)) {
      channel->Close(
          absl::FailedPreconditionError("the first message of a session must be register"));
      registry_.RemoveSession(session);
    }
    done();
    return;
  }
  node->last_seen = std::max(node->last_seen, arrived);
  if (!checked.ok()) {
    RejectMessage(*node, session, message, checked);
    done();
    return;
  }
  if (message.has_heartbeat()) {
    done();
    return;
  }
  const int64_t seq = message.seq();
  if (seq > 0 && seq <= node->applied_seq) {
    // Sent again after a reconnect; already applied, or handed to the ingester (then the Ack waits
    // until it is stored).
    node->acks.Add(session, seq, /*done=*/true);
    SendAcks(*node);
    done();
    return;
  }
  if (message.has_logs() || message.has_event() || message.has_topology()) {
    if (absl::Status s = runner_.MaySpeakFor(*node, message); !s.ok()) {
      RejectMessage(*node, session, message, s);
      done();
      return;
    }
    if (seq > 0) {
      node->applied_seq = seq;
      node->acks.Add(session, seq, /*done=*/false);
    }
    ingester_->Submit(session, node->name, std::move(message), std::move(done));
    return;
  }
  // A task status or a warning: after everything the worker sent before it is stored.
  if (!node->acks.AllDone()) {
    node->parked = ParkedMessage{session, std::move(message), std::move(done)};
    return;
  }
  ApplyOnLoop(*node, session, message);
  done();
}

void Cluster::ApplyOnLoop(WorkerNode& node, int64_t session, const v1::WorkerMessage& message) {
  // Checked now, not on arrival: what the node runs may have changed while the message was parked.
  if (absl::Status s = runner_.MaySpeakFor(node, message); !s.ok()) {
    RejectMessage(node, session, message, s);
    return;
  }
  absl::Status stored;
  if (message.has_task_status()) {
    stored = runner_.TaskStatus(node, message.task_status());
  } else if (message.has_warning()) {
    HandleWarning(node, message.warning());
  }
  if (!stored.ok()) {
    RetryLater(node, message.seq(), "task status", stored);
    return;
  }
  if (message.seq() <= 0) return;
  node.applied_seq = std::max(node.applied_seq, message.seq());
  node.acks.Add(session, message.seq(), /*done=*/true);
  SendAcks(node);
}

void Cluster::HandleStored(const std::vector<EventIngester::Outcome>& outcomes) {
  std::set<std::string> touched;
  for (const EventIngester::Outcome& o : outcomes) {
    if (o.topology && o.status.ok()) TopologyStored(o.node);
    WorkerNode* node = registry_.Find(o.node);
    if (node == nullptr || o.seq <= 0) continue;
    if (o.status.ok()) {
      if (node->acks.MarkDone(o.session, o.seq)) touched.insert(o.node);
      continue;
    }
    // Not stored. Unless a newer boot or an earlier failure already dropped it, it and everything
    // after it must come again.
    if (!node->acks.Contains(o.session, o.seq)) continue;
    RetryLater(*node, o.seq, "log batch or trainer event", o.status);
  }
  for (const std::string& name : touched) {
    WorkerNode& node = *registry_.Find(name);
    SendAcks(node);
    if (node.parked && node.acks.AllDone()) {
      ParkedMessage parked = std::move(*node.parked);
      node.parked.reset();
      ApplyOnLoop(node, parked.session, parked.message);
      parked.done();
    }
  }
}

void Cluster::SendAcks(WorkerNode& node) {
  const int64_t through = node.acks.PopDone();
  if (through <= 0 || node.channel == nullptr) return;
  v1::CoordinatorMessage ack;
  ack.mutable_ack()->set_through_seq(through);
  node.channel->Send(std::move(ack));
}

void Cluster::CountRejected(const absl::Status& why, int count) {
  if (metrics_ == nullptr) return;
  metrics_->rejected
      .Add({{"reason", absl::IsPermissionDenied(why) ? "not_placed_here" : "invalid"}})
      .Increment(count);
}

void Cluster::RejectMessage(WorkerNode& node, int64_t session, const v1::WorkerMessage& message,
                            const absl::Status& why) {
  TRAINCTL_LOG(WARNING) << "worker " << node.name << ": message " << message.seq()
                        << " rejected: " << why.message();
  CountRejected(why);
  if (message.has_task_status()) {
    runner_.FailTaskOf(node, message.task_status().task_id(),
                       absl::StrCat("worker on ", node.name, " sent a status for task ",
                                    message.task_status().task_id(),
                                    " that the coordinator rejected: ", why.message()));
  }
  if (message.seq() <= 0 || node.channel == nullptr) return;
  v1::CoordinatorMessage reject;
  reject.mutable_reject()->set_seq(message.seq());
  reject.mutable_reject()->set_reason(std::string(why.message()));
  node.channel->Send(std::move(reject));
  if (message.seq() > node.applied_seq) node.applied_seq = message.seq();
  node.acks.Add(session, message.seq(), /*done=*/true);
  SendAcks(node);
}

void Cluster::HandleWarning(WorkerNode& node, const v1::WorkerWarning& warning) {
  TRAINCTL_LOG(WARNING) << "worker " << node.name
                        << (warning.job_id().empty() ? ""
                                                     : absl::StrCat(" (", warning.job_id(), ")"))
                        << ": " << warning.message();
  if (!warning.task_id().empty()) runner_.FailTaskOf(node, warning.task_id(), warning.message());
  if (warning.job_id().empty()) return;
  if (auto s = jobs_->RecordWarning(warning.job_id(), absl::StrCat("worker ", node.name),
                                    warning.message());
      !s.ok()) {
    TRAINCTL_LOG(WARNING) << "warning of worker " << node.name
                          << " not recorded: " << s.status().message();
  }
}

void Cluster::RetryLater(WorkerNode& node, int64_t seq, const std::string& what,
                         const absl::Status& why) {
  TRAINCTL_LOG(WARNING) << "worker " << node.name << ": " << what << " seq " << seq
                        << " not stored, so not acknowledged (" << why.message()
                        << "); the worker sends it again when it reconnects";
  node.applied_seq = std::min(node.applied_seq, seq - 1);
  node.acks.DropFrom(seq);
  if (node.channel != nullptr) {
    // With the store's own code (RESOURCE_EXHAUSTED or UNAVAILABLE), which the worker does not
    // count against the message (Worker::CountStrike is for messages that end sessions).
    node.channel->Close(
        absl::Status(why.code(), absl::StrCat("the coordinator could not store message ", seq, " (",
                                              why.message(), "); send it again")));
  }
  registry_.Detach(node);
}

void Cluster::HandleRegister(int64_t session, const v1::RegisterWorker& reg) {
  std::shared_ptr<WorkerChannel> channel = registry_.SessionChannel(session);
  if (channel == nullptr) return;  // already disconnected
  if (absl::Status s = registry_.MayRegister(session, reg, clock_->Now()); !s.ok()) {
    TRAINCTL_LOG(WARNING) << "register refused: " << s.message();
    channel->Close(s);
    registry_.RemoveSession(session);
    return;
  }
  bool was_lost = false;
  WorkerNode& node = registry_.Register(session, reg, clock_->Now(), &was_lost);
  v1::CoordinatorMessage registered;
  registered.mutable_registered();
  node.channel->Send(std::move(registered));
  if (reg.has_topology()) {
    // Stored off the loop like any probe; a bad one costs the probe, not the registration.
    if (absl::Status s = CheckNodeTopology("register.topology", reg.topology()); !s.ok()) {
      TRAINCTL_LOG(WARNING) << "worker " << node.name
                            << ": topology probe dropped: " << s.message();
    } else {
      v1::WorkerMessage probe;
      *probe.mutable_topology() = reg.topology();
      ingester_->Submit(session, node.name, std::move(probe), [] {});
    }
  }
  TRAINCTL_LOG(INFO) << "worker " << node.name << " registered (" << node.address << ", "
                     << node.total_slots << (node.gpus > 0 ? " GPUs" : " CPU slots") << ", "
                     << reg.running_tasks_size() << " tasks" << (was_lost ? ", was lost" : "")
                     << ")";

  // Tasks the worker holds against those this coordinator expects on it.
  if (const int others = runner_.Reconcile(node, reg); others > 0) {
    CountRejected(absl::PermissionDeniedError("another node's task"), others);
  }
}

void Cluster::TopologyStored(const std::string& node) {
  absl::MutexLock lock(&topology_mu_);
  ++topologies_stored_[node];
}

absl::Status Cluster::RefreshTopology(const std::string& node, absl::Duration timeout) {
  int64_t before = 0;
  {
    absl::MutexLock lock(&topology_mu_);
    before = topologies_stored_[node];
  }
  std::promise<absl::Status> sent;
  Post([this, &node, &sent] {
    WorkerNode* n = registry_.Find(node);
    if (n == nullptr) {
      sent.set_value(absl::NotFoundError(absl::StrCat("node ", node, " is not known")));
    } else if (n->channel == nullptr) {
      sent.set_value(absl::FailedPreconditionError(
          absl::StrCat("node ", node, " is not connected (", n->lost ? "lost" : "disconnected",
                       "): it cannot probe its topology now")));
    } else {
      v1::CoordinatorMessage probe;
      probe.mutable_probe_topology();
      n->channel->Send(std::move(probe));
      sent.set_value(absl::OkStatus());
    }
  });
  if (absl::Status s = sent.get_future().get(); !s.ok()) return s;
  absl::MutexLock lock(&topology_mu_);
  auto stored = [this, &node, before]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(topology_mu_) {
    return topologies_stored_[node] > before;
  };
  if (!topology_mu_.AwaitWithTimeout(absl::Condition(&stored), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "node ", node, " sent no topology probe within ", absl::FormatDuration(timeout)));
  }
  return absl::OkStatus();
}

}  // namespace trainctl
