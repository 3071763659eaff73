// What the workers report about GangRunner's runs (gang_runner.h): who may speak for what, task
// statuses, and a registering worker's tasks reconciled against the runs.
#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "coordinator/gang_runner.h"
#include "coordinator/internal/cluster_tasks.h"
#include "coordinator/job_state.h"

namespace trainctl {

namespace v1 = trainctl::v1;
using internal::DescribeFailure;
using internal::TaskEnded;
using internal::TaskIdOf;

bool GangRunner::RanksOn(const Run& run, const std::string& node, int* first, int* last) const {
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

absl::Status GangRunner::MaySpeakFor(const WorkerNode& node, const v1::WorkerMessage& message) {
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

absl::Status GangRunner::TaskStatus(WorkerNode& node, const v1::TaskStatus& status) {
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

absl::Status GangRunner::MarkRunning(Run& run, const std::string& reason) {
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

int GangRunner::Reconcile(WorkerNode& node, const v1::RegisterWorker& reg) {
  std::set<std::string> reported;
  int rejected = 0;
  node.draining.clear();
  for (const v1::RunningTask& rt : reg.running_tasks()) {
    reported.insert(rt.task_id());
    if (!ReconcileReported(node, rt)) ++rejected;
  }
  EndTasksGoneFrom(node, reported);
  schedule_needed_ = true;
  return rejected;
}

bool GangRunner::ReconcileReported(WorkerNode& node, const v1::RunningTask& rt) {
  Task* task = FindTask(rt.task_id());
  if (task != nullptr && task->node != node.name) {
    // Another node's task: this worker may not speak for it. Whatever it runs under that id is
    // not the coordinator's, so it is stopped there, and only there.
    TRAINCTL_LOG(WARNING) << "worker " << node.name << " reported task " << rt.task_id()
                          << ", placed on " << task->node << ": ignored";
    if (!TaskEnded(rt.state())) {
      StopStale(node, rt.task_id(), rt.slots(), "the coordinator placed this task on another node");
    }
    return false;
  }
  if (task != nullptr && TaskEnded(task->state) && !TaskEnded(rt.state())) {
    // Given up on (its node was lost) while it kept running: stop it.
    SendCancel(*task, "the coordinator counted this task as failed");
    node.draining[rt.task_id()] = rt.slots();
    return true;
  }
  if (task != nullptr && !TaskEnded(task->state) && !TaskEnded(rt.state())) {
    // A stop sent while the worker was away may have been lost: send it again.
    const Run& run = runs_.at(task->job_id);
    if (run.failing || run.cancel_requested) {
      SendCancel(*task, run.cancel_requested ? run.job.message() : run.failure);
    }
    return true;
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
      return true;
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
  return true;
}

void GangRunner::EndTasksGoneFrom(WorkerNode& node, const std::set<std::string>& reported) {
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

void GangRunner::FailTaskOf(WorkerNode& node, const std::string& task_id, const std::string& why) {
  Task* task = FindTask(task_id);
  if (task == nullptr || task->node != node.name || TaskEnded(task->state)) return;
  const std::string job_id = task->job_id;
  EndTask(*task, v1::TASK_STATE_FAILED);
  auto run_it = runs_.find(job_id);
  if (run_it == runs_.end()) return;
  FailRun(run_it->second, why);
  MaybeFinish(job_id);
}

void GangRunner::StopStale(WorkerNode& node, const std::string& task_id, int slots,
                           const std::string& reason) {
  Task stale;
  stale.id = task_id;
  stale.node = node.name;
  SendCancel(stale, reason);
  if (slots > 0) node.draining[task_id] = slots;
}

std::vector<v1::NodeTask> GangRunner::TasksOn(const WorkerNode& node) const {
  std::vector<v1::NodeTask> out;
  for (const std::string& id : node.tasks) {
    const Task& task = tasks_.at(id);
    v1::NodeTask& t = out.emplace_back();
    t.set_task_id(task.id);
    t.set_job_id(task.job_id);
    t.set_node_rank(task.node_rank);
    t.set_slots(task.slots);
  }
  return out;
}

}  // namespace trainctl
