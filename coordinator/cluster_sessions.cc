// The cluster's side of worker sessions: register (and reconciling the tasks a worker reports),
// every message a worker sends (routed to the event ingester or applied here, acknowledged once
// stored, rejected, or left for a resend) and what task statuses change. The rest of Cluster
// (runs, scheduling, leases) is in cluster.cc; who may take a node's name is NodeRegistry's.
#include <algorithm>
#include <future>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/json_proto.h"
#include "common/logging.h"
#include "common/worker_limits.h"
#include "coordinator/cluster.h"
#include "coordinator/internal/cluster_metrics.h"
#include "coordinator/internal/cluster_tasks.h"
#include "coordinator/job_state.h"

namespace trainctl {

namespace v1 = trainctl::v1;
using internal::DescribeFailure;
using internal::TaskEnded;
using internal::TaskIdOf;

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
    if (absl::Status s = CheckSender(*node, message); !s.ok()) {
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
  if (absl::Status s = CheckSender(node, message); !s.ok()) {
    RejectMessage(node, session, message, s);
    return;
  }
  absl::Status stored;
  if (message.has_task_status()) {
    stored = HandleTaskStatus(node, message.task_status());
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

bool Cluster::RanksOn(const Run& run, const std::string& node, int* first, int* last) const {
  const int slots = std::max(1, run.job.spec().resources().slots_per_node());
  // A run placed by an older version has no nodes: its tasks say where they run.
  const size_t n = run.nodes.empty() ? run.task_ids.size() : run.nodes.size();
  for (size_t r = 0; r < n; ++r) {
    bool here = false;
    if (!run.nodes.empty()) {
      here = run.nodes[r] == node;
    } else if (const auto it = tasks_.find(run.task_ids[r]); it != tasks_.end()) {
      here = it->second.node == node;
    }
    if (!here) continue;
    *first = static_cast<int>(r) * slots;
    *last = *first + slots;
    return true;
  }
  return false;
}

absl::Status Cluster::CheckSender(const WorkerNode& node, const v1::WorkerMessage& message) {
  auto denied = [&node](const std::string& what) {
    return absl::PermissionDeniedError(
        absl::StrCat(what, ", which the coordinator did not place on node ", node.name,
                     ": a node reports only on its own tasks"));
  };
  // A rank of the job's current run on this node; `attempt` < 0: any (log lines carry none).
  auto rank_here = [&](const std::string& job_id, int rank, int attempt) {
    const auto run = runs_.find(job_id);
    int first = 0, last = 0;
    if (run == runs_.end() || !RanksOn(run->second, node.name, &first, &last)) {
      return denied(absl::StrCat("it names job ", job_id));
    }
    if (attempt >= 0 && attempt != run->second.job.attempt()) {
      return denied(absl::StrCat("it names attempt ", attempt, " of job ", job_id,
                                 " (the current one is ", run->second.job.attempt(), ")"));
    }
    if (rank < first || rank >= last) {
      return denied(absl::StrCat("it names rank ", rank, " of job ", job_id, " (this node runs ",
                                 first, " to ", last - 1, ")"));
    }
    return absl::OkStatus();
  };
  if (message.has_task_status()) {
    const Task* task = FindTask(message.task_status().task_id());
    // A task the coordinator does not know is the node's own business (stale: it is stopped).
    if (task != nullptr && task->node != node.name) {
      return denied(absl::StrCat("it names task ", task->id));
    }
    return absl::OkStatus();
  }
  if (message.has_warning()) {
    const v1::WorkerWarning& warning = message.warning();
    const Task* task = warning.task_id().empty() ? nullptr : FindTask(warning.task_id());
    if (task != nullptr && task->node != node.name) {
      return denied(absl::StrCat("it names task ", task->id));
    }
    if (warning.job_id().empty()) return absl::OkStatus();
    const auto run = runs_.find(warning.job_id());
    int first = 0, last = 0;
    if (run == runs_.end() || !RanksOn(run->second, node.name, &first, &last)) {
      return denied(absl::StrCat("it names job ", warning.job_id()));
    }
    return absl::OkStatus();
  }
  if (message.has_event()) {
    const v1::TrainerEvent& event = message.event();
    return rank_here(event.job_id(), event.rank(), event.attempt());
  }
  if (message.has_logs()) {
    for (const v1::LogLine& line : message.logs().lines()) {
      if (absl::Status s = rank_here(line.job_id(), line.rank(), -1); !s.ok()) return s;
    }
  }
  return absl::OkStatus();  // a topology probe is stored under the sender's own name
}

void Cluster::CountRejected(const absl::Status& why) {
  if (metrics_ == nullptr) return;
  metrics_->rejected
      .Add({{"reason", absl::IsPermissionDenied(why) ? "not_placed_here" : "invalid"}})
      .Increment();
}

void Cluster::RejectMessage(WorkerNode& node, int64_t session, const v1::WorkerMessage& message,
                            const absl::Status& why) {
  TRAINCTL_LOG(WARNING) << "worker " << node.name << ": message " << message.seq()
                        << " rejected: " << why.message();
  CountRejected(why);
  if (message.has_task_status()) {
    FailTaskOf(node, message.task_status().task_id(),
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

void Cluster::FailTaskOf(WorkerNode& node, const std::string& task_id, const std::string& why) {
  Task* task = FindTask(task_id);
  if (task == nullptr || task->node != node.name || TaskEnded(task->state)) return;
  const std::string job_id = task->job_id;
  EndTask(*task, v1::TASK_STATE_FAILED);
  auto run_it = runs_.find(job_id);
  if (run_it == runs_.end()) return;
  FailRun(run_it->second, why);
  MaybeFinish(job_id);
}

void Cluster::HandleWarning(WorkerNode& node, const v1::WorkerWarning& warning) {
  TRAINCTL_LOG(WARNING) << "worker " << node.name
                        << (warning.job_id().empty() ? ""
                                                     : absl::StrCat(" (", warning.job_id(), ")"))
                        << ": " << warning.message();
  if (!warning.task_id().empty()) FailTaskOf(node, warning.task_id(), warning.message());
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

void Cluster::StopStale(WorkerNode& node, const std::string& task_id, int slots,
                        const std::string& reason) {
  Task stale;
  stale.id = task_id;
  stale.node = node.name;
  SendCancel(stale, reason);
  if (slots > 0) node.draining[task_id] = slots;
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

  // Reconcile: tasks the worker holds against tasks this coordinator expects on it.
  std::set<std::string> reported;
  node.draining.clear();
  for (const v1::RunningTask& rt : reg.running_tasks()) {
    reported.insert(rt.task_id());
    ReconcileReported(node, rt);
  }
  EndTasksGoneFrom(node, reported);
  schedule_needed_ = true;
}

void Cluster::ReconcileReported(WorkerNode& node, const v1::RunningTask& rt) {
  Task* task = FindTask(rt.task_id());
  if (task != nullptr && task->node != node.name) {
    // Another node's task: this worker may not speak for it. Whatever it runs under that id is
    // not the coordinator's, so it is stopped there, and only there.
    TRAINCTL_LOG(WARNING) << "worker " << node.name << " reported task " << rt.task_id()
                          << ", placed on " << task->node << ": ignored";
    CountRejected(absl::PermissionDeniedError("another node's task"));
    if (!TaskEnded(rt.state())) {
      StopStale(node, rt.task_id(), rt.slots(), "the coordinator placed this task on another node");
    }
    return;
  }
  if (task != nullptr && TaskEnded(task->state) && !TaskEnded(rt.state())) {
    // Given up on (its node was lost) while it kept running: stop it.
    SendCancel(*task, "the coordinator counted this task as failed");
    node.draining[rt.task_id()] = rt.slots();
    return;
  }
  if (task != nullptr && !TaskEnded(task->state) && !TaskEnded(rt.state())) {
    // A stop sent while the worker was away may have been lost: send it again.
    const Run& run = runs_.at(task->job_id);
    if (run.failing || run.cancel_requested) {
      SendCancel(*task, run.cancel_requested ? run.job.message() : run.failure);
    }
    return;
  }
  if (task == nullptr) {
    auto run_it = runs_.find(rt.job_id());
    // By id: it names the attempt and, for a pipeline, the stage (an ended task of an earlier
    // stage, still in the worker's outbox, is not the current stage's).
    const bool adoptable = run_it != runs_.end() && run_it->second.job.attempt() == rt.attempt() &&
                           rt.task_id() == TaskIdOf(run_it->second.job, rt.node_rank()) &&
                           run_it->second.recover_until > clock_->Now() && rt.node_rank() >= 0 &&
                           rt.node_rank() < static_cast<int>(run_it->second.task_ids.size()) &&
                           run_it->second.task_ids[rt.node_rank()].empty() &&
                           (run_it->second.nodes.empty() ||
                            (rt.node_rank() < static_cast<int>(run_it->second.nodes.size()) &&
                             run_it->second.nodes[rt.node_rank()] == node.name));
    if (!adoptable) {
      if (!TaskEnded(rt.state())) {
        StopStale(node, rt.task_id(), rt.slots(), "the coordinator no longer runs this task");
      }
      return;
    }
    Run& run = run_it->second;
    Task& t = tasks_[rt.task_id()];
    t.id = rt.task_id();
    t.job_id = rt.job_id();
    t.node = node.name;
    t.attempt = rt.attempt();
    t.node_rank = rt.node_rank();
    t.slots = rt.slots();
    // An ended task's final status is still in the worker's outbox (it is reported until
    // acknowledged) and is replayed after this, behind the task's last logs and events.
    t.state = TaskEnded(rt.state()) ? v1::TASK_STATE_RUNNING : rt.state();
    t.launched = true;
    t.launched_at = clock_->Now();
    run.task_ids[rt.node_rank()] = t.id;
    if (rt.node_rank() == 0) {
      run.master_addr = node.address;
      run.master_port = rt.master_port();
    }
    node.tasks.insert(t.id);
    TRAINCTL_LOG(INFO) << "adopted task " << t.id << " on " << node.name;
    bool complete = true;
    for (const std::string& id : run.task_ids) complete = complete && !id.empty();
    if (complete) run.recover_until = absl::InfinitePast();
    if (run.cancel_requested && !TaskEnded(t.state)) SendCancel(t, "job cancelled");
  }
}

void Cluster::EndTasksGoneFrom(WorkerNode& node, const std::set<std::string>& reported) {
  // Recovering runs placed on this node whose task its worker does not report: the worker
  // restarted (or never got the launch) while the coordinator was away, so the task is gone. No
  // need to wait out the recovery grace.
  std::vector<std::pair<std::string, std::string>> gone;  // job id, task id
  for (const auto& [job_id, run] : runs_) {
    if (run.recover_until == absl::InfinitePast()) continue;
    for (size_t r = 0; r < run.nodes.size() && r < run.task_ids.size(); ++r) {
      const std::string id = TaskIdOf(run.job, static_cast<int>(r));
      if (run.nodes[r] == node.name && run.task_ids[r].empty() && !reported.count(id)) {
        gone.emplace_back(job_id, id);
        break;
      }
    }
  }
  for (const auto& [job_id, id] : gone) {
    EndRecovery(job_id,
                absl::StrCat("worker on ", node.name, " restarted and no longer runs task ", id));
  }
  // Tasks this node should hold that its worker no longer has (it restarted): they are gone.
  std::vector<std::string> missing;
  for (const std::string& id : node.tasks) {
    if (!reported.count(id)) missing.push_back(id);
  }
  for (const std::string& id : missing) {
    Task& task = tasks_.at(id);
    if (!task.launched) continue;  // not sent yet
    auto run_it = runs_.find(task.job_id);
    EndTask(task, v1::TASK_STATE_FAILED);
    if (run_it != runs_.end()) {
      FailRun(run_it->second,
              absl::StrCat("worker on ", node.name, " restarted and no longer runs task ", id));
      MaybeFinish(task.job_id);
    }
  }
}

absl::Status Cluster::HandleTaskStatus(WorkerNode& node, const v1::TaskStatus& status) {
  Task* task = FindTask(status.task_id());
  if (TaskEnded(status.state()) && node.draining.erase(status.task_id()) > 0) {
    schedule_needed_ = true;  // its slots are free now
  }
  if (task == nullptr) {
    if (!TaskEnded(status.state())) {
      StopStale(node, status.task_id(), 0, "the coordinator no longer runs this task");
    }
    return absl::OkStatus();
  }
  // Ended already: a status sent again because the job's end could not be stored then.
  if (TaskEnded(task->state)) return FinishRun(task->job_id);
  Run& run = runs_.at(task->job_id);
  const std::string job_id = task->job_id;
  switch (status.state()) {
    case v1::TASK_STATE_STARTING:
      return absl::OkStatus();
    case v1::TASK_STATE_RUNNING: {
      task->state = v1::TASK_STATE_RUNNING;
      if (task->node_rank == 0 && run.master_port == 0) {
        run.master_port = status.master_port();
        if (run.master_port <= 0) {
          FailRun(run, absl::StrCat("worker on ", node.name, " reported no rendezvous port"));
          return absl::OkStatus();
        }
        if (!run.failing && !run.cancel_requested) {
          for (const std::string& id : run.task_ids) {
            Task* other = FindTask(id);
            if (other != nullptr && !other->launched && !TaskEnded(other->state)) {
              LaunchTask(run, *other);
            }
            if (run.failing) break;  // a launch failed: the rest were stopped
          }
        }
      }
      bool all_running = true;
      for (const std::string& id : run.task_ids) {
        const Task* t = FindTask(id);
        all_running = all_running && t != nullptr && t->state == v1::TASK_STATE_RUNNING;
      }
      if (!all_running) return absl::OkStatus();
      // A transient store error: the status comes again; all_running is computed anew then.
      return MarkRunning(
          run, absl::StrCat("all ", run.task_ids.size() * static_cast<size_t>(task->slots),
                            " ranks running"));
    }
    case v1::TASK_STATE_SUCCEEDED:
      EndTask(*task, v1::TASK_STATE_SUCCEEDED);
      if (task->node_rank == 0 && run.master_port == 0 && run.task_ids.size() > 1) {
        // It ended before its worker reported it running: no rendezvous port, so the job's other
        // nodes were never launched, and a gang of one node is no success.
        FailRun(run, absl::StrCat("task ", status.task_id(), " on ", node.name,
                                  " ended before it reported its rendezvous port; the job's other "
                                  "nodes were never launched"));
      }
      break;
    case v1::TASK_STATE_CANCELLED:
      EndTask(*task, v1::TASK_STATE_CANCELLED);
      if (!run.cancel_requested && !run.failing) {
        FailRun(run, absl::StrCat("task ", status.task_id(), " on ", node.name,
                                  " was stopped: ", status.message()));
      }
      break;
    case v1::TASK_STATE_FAILED:
    default:
      EndTask(*task, v1::TASK_STATE_FAILED);
      if (!run.failing && !run.cancel_requested) {
        run.failed_rank = status.failed_rank();
        run.failed_exit_code = status.exit_code();
        run.failed_detail = status.last_log_lines().empty()
                                ? std::string()
                                : status.last_log_lines(status.last_log_lines_size() - 1);
      }
      FailRun(run, DescribeFailure(node.name, status));
      break;
  }
  return FinishRun(job_id);
}

absl::Status Cluster::MarkRunning(Run& run, const std::string& reason) {
  if (run.job.state() != v1::JOB_STATE_SCHEDULED) return absl::OkStatus();
  auto job = jobs_->Transition(run.job.id(), v1::JOB_STATE_RUNNING, reason);
  if (job.ok()) {
    run.job = *job;
    return absl::OkStatus();
  }
  if (IsTransientStoreError(job.status())) return job.status();
  TRAINCTL_LOG(WARNING) << run.job.id() << ": " << job.status().message();
  return absl::OkStatus();
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
