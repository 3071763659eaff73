// The cluster's side of worker sessions: register (who may take a node's name), every message a
// worker sends (checked, applied, acknowledged once stored, rejected or left for a resend) and
// what those messages change: task life cycles and trainer events. The rest of Cluster (runs,
// scheduling, leases) is in cluster.cc.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/json_proto.h"
#include "common/logging.h"
#include "common/worker_limits.h"
#include "coordinator/cluster.h"
#include "coordinator/internal/cluster_tasks.h"
#include "coordinator/job_state.h"
#include "nlohmann/json.hpp"

namespace trainctl {

namespace v1 = trainctl::v1;
using internal::DescribeFailure;
using internal::TaskEnded;
using internal::TaskIdOf;

void Cluster::HandleMessage(int64_t session, const v1::WorkerMessage& message) {
  if (message.has_register_()) {
    HandleRegister(session, message.register_());
    return;
  }
  Node* node = NodeForSession(session);
  if (node == nullptr) {
    auto it = sessions_.find(session);
    if (it != sessions_.end()) {
      it->second->Close(
          absl::FailedPreconditionError("the first message of a session must be register"));
      sessions_.erase(it);
    }
    return;
  }
  node->last_seen = clock_->Now();
  if (absl::Status s = CheckWorkerMessage(message); !s.ok()) {
    RejectMessage(*node, message, s);
    return;
  }
  if (message.has_heartbeat()) return;
  if (message.seq() > 0 && message.seq() <= node->applied_seq) {
    // Sent again after a reconnect; already applied.
  } else {
    absl::Status stored;
    if (message.has_task_status()) {
      stored = HandleTaskStatus(*node, message.task_status());
    } else if (message.has_logs()) {
      std::vector<LogLine> lines(message.logs().lines().begin(), message.logs().lines().end());
      stored = jobs_->AppendLogs(std::move(lines));
      if (!stored.ok() && !IsTransientStoreError(stored)) {
        TRAINCTL_LOG(WARNING) << "logs from " << node->name << " dropped: " << stored.message();
        stored = absl::OkStatus();
      }
    } else if (message.has_event()) {
      stored = HandleTrainerEvent(message.event());
    } else if (message.has_warning()) {
      HandleWarning(*node, message.warning());
    }
    node = NodeForSession(session);  // handlers may not invalidate it, but stay safe
    if (node == nullptr) return;
    if (!stored.ok()) {
      RetryLater(*node, session, message, stored);
      return;
    }
    if (message.seq() > 0) node->applied_seq = message.seq();
  }
  if (message.seq() > 0 && node->channel != nullptr) {
    v1::CoordinatorMessage ack;
    ack.mutable_ack()->set_through_seq(message.seq());
    node->channel->Send(std::move(ack));
  }
}

void Cluster::RejectMessage(Node& node, const v1::WorkerMessage& message, const absl::Status& why) {
  TRAINCTL_LOG(WARNING) << "worker " << node.name << ": message " << message.seq()
                        << " rejected: " << why.message();
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
  v1::CoordinatorMessage ack;
  ack.mutable_ack()->set_through_seq(message.seq());
  node.channel->Send(std::move(ack));
}

void Cluster::FailTaskOf(Node& node, const std::string& task_id, const std::string& why) {
  Task* task = FindTask(task_id);
  if (task == nullptr || task->node != node.name || TaskEnded(task->state)) return;
  const std::string job_id = task->job_id;
  EndTask(*task, v1::TASK_STATE_FAILED);
  auto run_it = runs_.find(job_id);
  if (run_it == runs_.end()) return;
  FailRun(run_it->second, why);
  MaybeFinish(job_id);
}

void Cluster::HandleWarning(Node& node, const v1::WorkerWarning& warning) {
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

absl::Status Cluster::MayRegister(int64_t session, const v1::RegisterWorker& reg) {
  if (absl::Status s = CheckRegisterWorker(reg); !s.ok()) return s;
  if (Node* current = NodeForSession(session)) {
    return absl::FailedPreconditionError(absl::StrCat("register: this session is already node ",
                                                      current->name, "; one register per session"));
  }
  auto it = nodes_.find(reg.node_name());
  if (it == nodes_.end()) return absl::OkStatus();
  Node& node = it->second;
  if (node.session == 0 || node.channel == nullptr) return absl::OkStatus();
  const absl::Duration silent = clock_->Now() - node.last_seen;
  if (node.boot_id == reg.boot_id()) {
    // The same worker process, reconnecting before its old stream was seen to break.
    node.channel->Close(absl::UnavailableError("replaced by a newer session of the same worker"));
    return absl::OkStatus();
  }
  if (!node.lost && silent <= options_.lease_timeout) {
    return absl::AlreadyExistsError(absl::StrCat(
        "register: node ", node.name, " has a live session (another worker process, heard from ",
        absl::FormatDuration(silent), " ago; lease ", absl::FormatDuration(options_.lease_timeout),
        "); a second worker cannot take its name while it lives"));
  }
  node.channel->Close(absl::FailedPreconditionError(absl::StrCat(
      "node ", node.name, " was taken over by another worker process (", reg.advertise_addr(),
      ") after this session sent nothing for ", absl::FormatDuration(silent))));
  return absl::OkStatus();
}

void Cluster::RetryLater(Node& node, int64_t session, const v1::WorkerMessage& message,
                         const absl::Status& why) {
  const char* what = message.has_task_status() ? "task status"
                     : message.has_logs()      ? "log batch"
                                               : "trainer event";
  TRAINCTL_LOG(WARNING) << "worker " << node.name << ": " << what << " seq " << message.seq()
                        << " not stored, so not acknowledged (" << why.message()
                        << "); the worker sends it again when it reconnects";
  if (node.channel != nullptr) {
    // With the store's own code (RESOURCE_EXHAUSTED or UNAVAILABLE), which the worker does not
    // count against the message (Worker::CountStrike is for messages that end sessions).
    node.channel->Close(absl::Status(
        why.code(), absl::StrCat("the coordinator could not store message ", message.seq(), " (",
                                 why.message(), "); send it again")));
  }
  sessions_.erase(session);
  node.session = 0;
  node.channel = nullptr;
}

void Cluster::HandleRegister(int64_t session, const v1::RegisterWorker& reg) {
  auto channel_it = sessions_.find(session);
  if (channel_it == sessions_.end()) return;  // already disconnected
  if (absl::Status s = MayRegister(session, reg); !s.ok()) {
    TRAINCTL_LOG(WARNING) << "register refused: " << s.message();
    channel_it->second->Close(s);
    sessions_.erase(channel_it);
    return;
  }
  Node& node = nodes_[reg.node_name()];
  const bool new_boot = node.boot_id != reg.boot_id();
  node.name = reg.node_name();
  node.address = reg.advertise_addr();
  node.labels = {reg.labels().begin(), reg.labels().end()};
  node.gpus = reg.resources().gpus_size();
  node.total_slots = node.gpus > 0 ? node.gpus : reg.resources().cpu_slots();
  node.session = session;
  node.channel = channel_it->second;
  node.last_seen = clock_->Now();
  if (new_boot) {
    node.boot_id = reg.boot_id();
    node.applied_seq = 0;
  }
  const bool was_lost = node.lost;
  node.lost = false;
  v1::CoordinatorMessage registered;
  registered.mutable_registered();
  node.channel->Send(std::move(registered));
  TRAINCTL_LOG(INFO) << "worker " << node.name << " registered (" << node.address << ", "
                     << node.total_slots << (node.gpus > 0 ? " GPUs" : " CPU slots") << ", "
                     << reg.running_tasks_size() << " tasks" << (was_lost ? ", was lost" : "")
                     << ")";

  // Reconcile: tasks the worker holds against tasks this coordinator expects on it.
  std::set<std::string> reported;
  node.draining.clear();
  for (const v1::RunningTask& rt : reg.running_tasks()) {
    reported.insert(rt.task_id());
    Task* task = FindTask(rt.task_id());
    if (task != nullptr && TaskEnded(task->state) && !TaskEnded(rt.state())) {
      // Given up on (its node was lost) while it kept running: stop it.
      SendCancel(*task, "the coordinator counted this task as failed");
      node.draining[rt.task_id()] = rt.slots();
      continue;
    }
    if (task != nullptr && !TaskEnded(task->state) && !TaskEnded(rt.state())) {
      // A stop sent while the worker was away may have been lost: send it again.
      const Run& run = runs_.at(task->job_id);
      if (run.failing || run.cancel_requested) {
        SendCancel(*task, run.cancel_requested ? run.job.message() : run.failure);
      }
      continue;
    }
    if (task == nullptr) {
      auto run_it = runs_.find(rt.job_id());
      // By id: it names the attempt and, for a pipeline, the stage (an ended task of an earlier
      // stage, still in the worker's outbox, is not the current stage's).
      const bool adoptable = run_it != runs_.end() &&
                             run_it->second.job.attempt() == rt.attempt() &&
                             rt.task_id() == TaskIdOf(run_it->second.job, rt.node_rank()) &&
                             run_it->second.recover_until > clock_->Now() && rt.node_rank() >= 0 &&
                             rt.node_rank() < static_cast<int>(run_it->second.task_ids.size()) &&
                             run_it->second.task_ids[rt.node_rank()].empty();
      if (!adoptable) {
        if (!TaskEnded(rt.state())) {
          Task stale;
          stale.id = rt.task_id();
          stale.node = node.name;
          SendCancel(stale, "the coordinator no longer runs this task");
          node.draining[rt.task_id()] = rt.slots();
        }
        continue;
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
  schedule_needed_ = true;
}

absl::Status Cluster::HandleTaskStatus(Node& node, const v1::TaskStatus& status) {
  Task* task = FindTask(status.task_id());
  if (TaskEnded(status.state()) && node.draining.erase(status.task_id()) > 0) {
    schedule_needed_ = true;  // its slots are free now
  }
  if (task == nullptr) {
    if (!TaskEnded(status.state())) {
      Task stale;
      stale.id = status.task_id();
      stale.node = node.name;
      SendCancel(stale, "the coordinator no longer runs this task");
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
      if (all_running && run.job.state() == v1::JOB_STATE_SCHEDULED) {
        auto job = jobs_->Transition(
            job_id, v1::JOB_STATE_RUNNING,
            absl::StrCat("all ", run.task_ids.size() * static_cast<size_t>(task->slots),
                         " ranks running"));
        if (job.ok()) {
          run.job = *job;
        } else if (IsTransientStoreError(job.status())) {
          return job.status();  // the status comes again; all_running is computed anew then
        } else {
          TRAINCTL_LOG(WARNING) << job_id << ": " << job.status().message();
        }
      }
      return absl::OkStatus();
    }
    case v1::TASK_STATE_SUCCEEDED:
      EndTask(*task, v1::TASK_STATE_SUCCEEDED);
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
      FailRun(run, DescribeFailure(node.name, status));
      break;
  }
  return FinishRun(job_id);
}

absl::Status Cluster::HandleTrainerEvent(const v1::TrainerEvent& event) {
  nlohmann::json j = nlohmann::json::parse(event.json(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    TRAINCTL_LOG(WARNING) << event.job_id() << " rank " << event.rank()
                          << ": unreadable trainer event dropped: " << event.json().substr(0, 200);
    return absl::OkStatus();
  }
  const std::string type = j["type"];
  absl::Status s;
  if (type == "metric") {
    v1::MetricSample sample;
    sample.set_step(j.value("step", int64_t{0}));
    if (j.contains("values") && j["values"].is_object()) {
      for (const auto& [key, value] : j["values"].items()) {
        if (value.is_number()) (*sample.mutable_values())[key] = value.get<double>();
      }
    }
    s = jobs_->RecordMetric(event.job_id(), sample).status();
  } else if (type == "checkpoint") {
    v1::Checkpoint checkpoint;
    checkpoint.set_step(j.value("step", int64_t{0}));
    checkpoint.set_path(j.value("path", std::string()));
    s = jobs_->RecordCheckpoint(event.job_id(), checkpoint).status();
  }
  if (IsTransientStoreError(s)) return s;
  if (!s.ok()) {
    TRAINCTL_LOG(WARNING) << event.job_id() << ": " << type << " event dropped: " << s.message();
  }
  return absl::OkStatus();
}

}  // namespace trainctl
