// GangRunner's runs: placement, launch, their end, deadlines and recovery (gang_runner.h). What the
// workers report about them is in gang_runner_reports.cc.
#include "coordinator/gang_runner.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_spec.h"
#include "common/logging.h"
#include "common/memory_plan.h"
#include "common/remedies_spec.h"
#include "coordinator/internal/cluster_tasks.h"
#include "coordinator/job_launch.h"
#include "coordinator/job_stages.h"
#include "coordinator/job_state.h"
#include "coordinator/remedy_ladder.h"

namespace trainctl {

namespace v1 = trainctl::v1;
using internal::TaskEnded;
using internal::TaskIdOf;

struct GangRunner::Metrics {
  explicit Metrics(metrics::Registry* r)
      : pass(r->AddHistogram("trainctl_scheduler_pass_duration_seconds",
                             "Duration of one scheduling pass over the waiting jobs.")
                 .Add({}, metrics::ExponentialBuckets(0.00001, 4, 12))),
        queue_depth(
            r->AddGauge("trainctl_scheduler_queue_depth", "Jobs waiting to be placed.").Add({})) {}
  prometheus::Histogram& pass;
  prometheus::Gauge& queue_depth;
};

namespace {

SchedJob ToSchedJob(const Job& job) {
  SchedJob s;
  s.id = job.id();
  s.priority = job.spec().priority();
  s.order = ParseJobId(job.id()).value_or(0);
  s.nodes = std::max(1, job.spec().resources().nodes());
  s.slots_per_node = std::max(1, job.spec().resources().slots_per_node());
  s.node_selector.insert(job.spec().node_selector().begin(), job.spec().node_selector().end());
  return s;
}

// "stage sft (2/4): " before a pipeline's messages; "" for other jobs.
std::string StagePrefix(const Job& job) {
  const std::string label = CurrentStageLabel(job);
  return label.empty() ? "" : absl::StrCat("stage ", label, ": ");
}

// The remedy for the run's failure (coordinator/remedy_ladder.h), if its spec asks for one. `job`
// as stored now: its last checkpoint is the one the next attempt resumes from.
std::optional<v1::Remedy> NextRemedyFor(const Job& job, int rank, int exit_code,
                                        const std::string& detail,
                                        std::optional<int64_t> gpu_bytes) {
  if (job.spec().kind() == v1::JOB_KIND_PIPELINE) return std::nullopt;
  AttemptFailure failure;
  if (gpu_bytes.has_value() && job.has_memory_plan()) {
    failure.fits = [limit = *gpu_bytes](const v1::JobSpec& spec) {
      absl::StatusOr<ValidatedJobSpec> validated = ValidateJobSpec(spec);
      if (!validated.ok()) return false;
      absl::StatusOr<v1::MemoryPlan> plan =
          PlanJobMemory(validated->spec, validated->resolved_deepspeed_config, MemoryPlanOptions{});
      return plan.ok() && plan->gpu_bytes() <= limit;
    };
  }
  failure.attempt = job.attempt();
  failure.exit_code = exit_code;
  failure.rank = rank;
  failure.detail = detail;
  failure.last_checkpoint_step = job.last_checkpoint().step();
  return NextRemedy(job.spec(), job.remedies(), failure);
}

}  // namespace

GangRunner::GangRunner(JobManager* jobs, Clock* clock, NodeRegistry* nodes,
                       GangRunnerOptions options)
    : jobs_(jobs),
      clock_(clock),
      nodes_(nodes),
      options_(std::move(options)),
      metrics_(options_.metrics != nullptr ? std::make_unique<Metrics>(options_.metrics)
                                           : nullptr) {}

GangRunner::~GangRunner() = default;

int GangRunner::UsedSlots(const WorkerNode& node) const {
  int used = 0;
  for (const std::string& id : node.tasks) used += tasks_.at(id).slots;
  for (const auto& [id, slots] : node.draining) used += slots;
  return used;
}

absl::Status GangRunner::Recover() {
  // Waiting and placed jobs, oldest first (the store lists newest first).
  std::vector<Job> live;
  JobFilter filter;
  filter.states = {v1::JOB_STATE_PENDING, v1::JOB_STATE_RESTARTING, v1::JOB_STATE_SCHEDULED,
                   v1::JOB_STATE_RUNNING};
  filter.page_size = 1000;
  while (true) {
    auto page = jobs_->List(filter);
    if (!page.ok()) return page.status();
    for (Job& job : page->jobs) live.push_back(std::move(job));
    if (page->next_before_id == 0) break;
    filter.before_id = page->next_before_id;
  }
  const absl::Duration grace = options_.recovery_grace;
  const absl::Time now = clock_->Now();
  for (auto it = live.rbegin(); it != live.rend(); ++it) {
    const Job& job = *it;
    if (job.state() == v1::JOB_STATE_PENDING || job.state() == v1::JOB_STATE_RESTARTING) {
      Enqueue(job);
      continue;
    }
    Run& run = runs_[job.id()];
    run.job = job;
    run.cancel_requested = job.cancel_requested();
    run.recover_until = now + grace;
    run.task_ids.resize(std::max(1, job.spec().resources().nodes()));
    run.nodes.assign(job.nodes().begin(), job.nodes().end());
    TRAINCTL_LOG(INFO) << "recovering " << job.id() << " (" << JobStateName(job.state())
                       << ", attempt " << job.attempt() << "): waiting up to " << grace
                       << " for its workers";
  }
  schedule_needed_ = true;
  return absl::OkStatus();
}

GangRunner::Task* GangRunner::FindTask(const std::string& id) {
  auto it = tasks_.find(id);
  return it == tasks_.end() ? nullptr : &it->second;
}

void GangRunner::Enqueue(const Job& job) {
  waiting_[job.id()] = ToSchedJob(job);
  // A restarting job keeps its restart reason as its message.
  if (job.state() == v1::JOB_STATE_RESTARTING) told_never_fits_.insert(job.id());
  schedule_needed_ = true;
}

absl::Status GangRunner::FinishRun(std::string job_id) {
  MaybeFinish(job_id);
  auto run = runs_.find(job_id);
  return run == runs_.end() ? absl::OkStatus() : run->second.finish_error;
}

void GangRunner::JobChanged(const std::string& job_id) {
  auto job = jobs_->Get(job_id);
  if (!job.ok()) return;
  if (job->state() == v1::JOB_STATE_PENDING && !runs_.count(job_id)) {
    Enqueue(*job);
    return;
  }
  if (IsTerminal(job->state())) {
    waiting_.erase(job_id);
    told_never_fits_.erase(job_id);
    return;
  }
  auto run_it = runs_.find(job_id);
  if (job->cancel_requested() && run_it != runs_.end() && !run_it->second.cancel_requested) {
    run_it->second.job.set_message(job->message());
    CancelRun(run_it->second, job->message());
    MaybeFinish(job_id);
  }
}

void GangRunner::Tick() {
  const absl::Time now = clock_->Now();
  std::vector<std::string> unconfirmed;
  for (const auto& [id, task] : tasks_) {
    if (task.launched && task.state == v1::TASK_STATE_STARTING &&
        now - task.launched_at > options_.launch_timeout) {
      unconfirmed.push_back(id);
    }
  }
  for (const std::string& id : unconfirmed) {
    Task* found = FindTask(id);  // an earlier one of the same job may have ended the run
    if (found == nullptr || TaskEnded(found->state)) continue;
    Task& task = *found;
    const std::string job_id = task.job_id;
    SendCancel(task, "launch not confirmed in time");
    EndTask(task, v1::TASK_STATE_FAILED);
    if (WorkerNode* node = nodes_->Find(task.node)) {
      node->draining[id] = task.slots;  // until its worker says otherwise
    }
    FailRun(runs_.at(job_id),
            absl::StrCat("the worker on ", task.node, " did not confirm the launch of task ", id,
                         " within ", absl::FormatDuration(options_.launch_timeout)));
    MaybeFinish(job_id);
  }
  std::vector<std::string> expired;
  for (auto& [id, run] : runs_) {
    if (run.recover_until != absl::InfinitePast() && now >= run.recover_until) {
      expired.push_back(id);
    }
  }
  for (const std::string& id : expired) EndRecovery(id, "");
  // Job ends and placements the store could not take: try them again.
  std::vector<std::string> unfinished;
  for (const auto& [id, run] : runs_) {
    if (!run.finish_error.ok()) unfinished.push_back(id);
  }
  for (const std::string& id : unfinished) MaybeFinish(id);
  if (place_retry_) {
    place_retry_ = false;
    schedule_needed_ = true;
  }
}

void GangRunner::ScheduleIfNeeded() {
  if (schedule_needed_) SchedulePass();
  if (metrics_ != nullptr) metrics_->queue_depth.Set(static_cast<double>(waiting_.size()));
}

void GangRunner::EndRecovery(const std::string& job_id, const std::string& reason) {
  Run& run = runs_.at(job_id);
  run.recover_until = absl::InfinitePast();
  std::vector<std::string> missing;
  for (size_t r = 0; r < run.task_ids.size(); ++r) {
    if (run.task_ids[r].empty()) missing.push_back(absl::StrCat(r));
  }
  // Stand-ins for the tasks nobody reported, so the run can end.
  for (const std::string& r : missing) {
    const int node_rank = std::stoi(r);
    Task& t = tasks_[TaskIdOf(run.job, node_rank)];
    t.id = TaskIdOf(run.job, node_rank);
    t.job_id = job_id;
    t.attempt = run.job.attempt();
    t.node_rank = node_rank;
    t.state = v1::TASK_STATE_FAILED;
    run.task_ids[node_rank] = t.id;
  }
  if (!missing.empty()) {
    FailRun(run, !reason.empty()
                     ? reason
                     : absl::StrCat("node ranks ", absl::StrJoin(missing, ","), " of attempt ",
                                    run.job.attempt(),
                                    " were not reported by any worker after the coordinator "
                                    "restarted"));
  }
  MaybeFinish(job_id);
}

void GangRunner::NodeLost(WorkerNode& node, const std::string& reason) {
  std::vector<std::string> ids(node.tasks.begin(), node.tasks.end());
  for (const std::string& id : ids) {
    Task& task = tasks_.at(id);
    const std::string job_id = task.job_id;
    EndTask(task, v1::TASK_STATE_FAILED);
    auto run_it = runs_.find(job_id);
    if (run_it != runs_.end()) {
      FailRun(run_it->second, reason);
      MaybeFinish(job_id);
    }
  }
}

void GangRunner::SchedulePass() {
  schedule_needed_ = false;
  if (waiting_.empty()) return;
  const absl::Time start = absl::Now();
  std::vector<SchedNode> sched_nodes;
  std::vector<std::string> names;
  for (const auto& [name, node] : nodes_->nodes()) {
    SchedNode s;
    s.name = name;
    s.labels = node.labels;
    s.total_slots = node.total_slots;
    s.free_slots = std::max(0, node.total_slots - UsedSlots(node));
    s.schedulable = !node.lost && node.session != 0;
    sched_nodes.push_back(std::move(s));
    names.push_back(name);
  }
  std::vector<SchedJob> jobs;
  jobs.reserve(waiting_.size());
  for (const auto& [id, job] : waiting_) jobs.push_back(job);
  auto pass = Schedule(sched_nodes, std::move(jobs));
  if (metrics_ != nullptr) metrics_->pass.Observe(absl::ToDoubleSeconds(absl::Now() - start));
  for (const std::string& id : pass.never_fits) {
    if (!told_never_fits_.insert(id).second) continue;
    const SchedJob& job = waiting_.at(id);
    std::string selector;
    for (const auto& [k, v] : job.node_selector) absl::StrAppend(&selector, " ", k, "=", v);
    const std::string why = absl::StrCat("waiting: no set of ", job.nodes, " ready nodes",
                                         selector.empty() ? "" : " labelled", selector, " has ",
                                         job.slots_per_node, " slots each (see trainctl nodes)");
    TRAINCTL_LOG(INFO) << id << " " << why;
    (void)jobs_->SetMessage(id, why);
  }
  for (const Placement& placement : pass.placements) {
    std::vector<std::string> chosen;
    for (int index : placement.node_indices) chosen.push_back(names[index]);
    Place(placement.job_id, chosen);
  }
}

void GangRunner::Place(const std::string& job_id, const std::vector<std::string>& nodes) {
  auto job = jobs_->Place(job_id, nodes, absl::StrCat("placed on ", absl::StrJoin(nodes, ",")));
  if (!job.ok() && IsTransientStoreError(job.status())) {
    TRAINCTL_LOG(WARNING) << job_id << " not placed yet: " << job.status().message();
    place_retry_ = true;  // it stays waiting
    return;
  }
  waiting_.erase(job_id);
  told_never_fits_.erase(job_id);
  if (!job.ok()) {
    TRAINCTL_LOG(INFO) << job_id << " not placed: " << job.status().message();
    return;
  }
  Run& run = runs_[job_id];
  run = Run();
  run.job = *job;
  run.nodes = nodes;
  run.master_addr = nodes_->nodes().at(nodes[0]).address;
  const int slots = std::max(1, job->spec().resources().slots_per_node());
  for (size_t r = 0; r < nodes.size(); ++r) {
    const std::string id = TaskIdOf(*job, static_cast<int>(r));
    Task& task = tasks_[id];
    task.id = id;
    task.job_id = job_id;
    task.node = nodes[r];
    task.attempt = job->attempt();
    task.node_rank = static_cast<int>(r);
    task.slots = slots;
    run.task_ids.push_back(id);
    nodes_->nodes().at(nodes[r]).tasks.insert(id);
  }
  TRAINCTL_LOG(INFO) << job_id << " attempt " << job->attempt() << " placed on "
                     << absl::StrJoin(nodes, ",");
  LaunchTask(run, tasks_.at(run.task_ids[0]));
}

void GangRunner::LaunchTask(Run& run, Task& task) {
  if (TaskEnded(task.state)) return;  // stopped before it was sent
  WorkerNode& node = nodes_->nodes().at(task.node);
  task.launched = true;
  task.launched_at = clock_->Now();
  if (node.channel == nullptr) {
    EndTask(task, v1::TASK_STATE_FAILED);
    FailRun(run, absl::StrCat("node ", node.name, " disconnected before its task was launched"));
    MaybeFinish(run.job.id());
    return;
  }
  v1::CoordinatorMessage message;
  v1::LaunchTask* launch = message.mutable_launch();
  absl::StatusOr<JobLaunch> resolved = ResolveJobLaunch(run.job);
  if (!resolved.ok()) {
    EndTask(task, v1::TASK_STATE_FAILED);
    FailRun(run, absl::StrCat("cannot launch: ", resolved.status().message()));
    MaybeFinish(run.job.id());
    return;
  }
  *launch->mutable_spec() = std::move(resolved->spec);
  launch->set_resolved_deepspeed_config_json(std::move(resolved->resolved_deepspeed_config));
  launch->set_task_id(task.id);
  launch->set_job_id(task.job_id);
  launch->set_attempt(task.attempt);
  launch->set_node_rank(task.node_rank);
  launch->set_first_rank(task.node_rank * task.slots);
  launch->set_world_size(static_cast<int>(run.task_ids.size()) * task.slots);
  launch->set_master_addr(run.master_addr);
  launch->set_master_port(run.master_port);
  launch->set_nodes(static_cast<int>(run.task_ids.size()));
  launch->set_slots(task.slots);
  node.channel->Send(std::move(message));
}

void GangRunner::SendCancel(const Task& task, const std::string& reason) {
  WorkerNode* node = task.node.empty() ? nullptr : nodes_->Find(task.node);
  v1::CoordinatorMessage message;
  message.mutable_cancel()->set_task_id(task.id);
  message.mutable_cancel()->set_reason(reason);
  if (node != nullptr) {
    if (node->channel != nullptr) node->channel->Send(std::move(message));
    return;
  }
  // A stale task of whichever node reported it: every live session gets it (ids are unique).
  for (auto& [name, n] : nodes_->nodes()) {
    if (n.channel != nullptr) n.channel->Send(message);
  }
}

void GangRunner::EndTask(Task& task, v1::TaskState state) {
  task.state = state;
  if (WorkerNode* node = nodes_->Find(task.node)) node->tasks.erase(task.id);
  schedule_needed_ = true;
}

void GangRunner::FailRun(Run& run, const std::string& reason) {
  if (run.failing || run.cancel_requested) return;
  run.failing = true;
  run.failure = reason;
  TRAINCTL_LOG(WARNING) << run.job.id() << " attempt " << run.job.attempt()
                        << " failing: " << reason;
  StopTasks(run, absl::StrCat("another task of the job failed: ", reason));
}

void GangRunner::CancelRun(Run& run, const std::string& reason) {
  run.cancel_requested = true;
  StopTasks(run, reason);
}

void GangRunner::StopTasks(Run& run, const std::string& reason) {
  for (const std::string& id : run.task_ids) {
    Task* task = FindTask(id);
    if (task == nullptr || TaskEnded(task->state)) continue;
    if (!task->launched) {
      EndTask(*task, v1::TASK_STATE_CANCELLED);  // never sent: nothing to stop
    } else {
      SendCancel(*task, reason);
    }
  }
}

Job GangRunner::Stored(const Job& placed) {
  absl::StatusOr<Job> job = jobs_->Get(placed.id());
  return job.ok() ? *std::move(job) : placed;
}

std::optional<int64_t> GangRunner::GpuBytesOf(const Job& placed) {
  std::optional<int64_t> least;
  for (const std::string& name : placed.nodes()) {
    const WorkerNode* node = nodes_->Find(name);
    if (node == nullptr || node->gpu_memory_bytes <= 0) return std::nullopt;
    least = std::min(least.value_or(node->gpu_memory_bytes), node->gpu_memory_bytes);
  }
  return least;
}

void GangRunner::MaybeFinish(std::string job_id) {
  auto run_it = runs_.find(job_id);
  if (run_it == runs_.end()) return;
  Run& run = run_it->second;
  if (run.recover_until != absl::InfinitePast()) return;
  for (const std::string& id : run.task_ids) {
    const Task* task = FindTask(id);
    if (task == nullptr || !TaskEnded(task->state)) return;
  }
  // Every task has ended: decide the job's fate.
  absl::StatusOr<Job> job;
  std::optional<v1::Remedy> remedy;
  const int max_restarts = run.job.spec().max_restarts();
  if (run.cancel_requested) {
    job = jobs_->Transition(job_id, v1::JOB_STATE_CANCELLED,
                            run.job.message().empty() ? "cancelled" : run.job.message());
  } else if (run.failing && run.job.attempt() < max_restarts &&
             (remedy = NextRemedyFor(Stored(run.job), run.failed_rank, run.failed_exit_code,
                                     run.failed_detail, GpuBytesOf(run.job)))
                 .has_value()) {
    job = jobs_->RestartWithRemedy(
        job_id, *remedy,
        absl::StrCat("attempt ", run.job.attempt(), " failed (", run.failure, "); restart ",
                     run.job.attempt() + 1, " of ", max_restarts,
                     " with a remedy: ", RemedyLine(*remedy)));
  } else if (run.failing && run.job.attempt() < max_restarts) {
    // A pipeline restarts its current stage only, which resumes from its own checkpoints.
    job = jobs_->Transition(
        job_id, v1::JOB_STATE_RESTARTING,
        absl::StrCat(StagePrefix(run.job), "attempt ", run.job.attempt(), " failed (", run.failure,
                     "); restart ", run.job.attempt() + 1, " of ", max_restarts,
                     " from the last checkpoint"));
  } else if (run.failing) {
    job = jobs_->Transition(
        job_id, v1::JOB_STATE_FAILED,
        absl::StrCat(StagePrefix(run.job), run.failure,
                     max_restarts > 0 ? absl::StrCat(" (after ", max_restarts, " restarts)") : ""));
  } else if (absl::Status s = MarkRunning(run, "every task ended before all were seen running");
             !s.ok()) {
    job = s;  // the job passes through running, whatever order the reports came in
  } else if (HasNextStage(run.job)) {
    job = jobs_->AdvanceStage(job_id, "every rank exited 0");
  } else {
    job = jobs_->Transition(job_id, v1::JOB_STATE_SUCCEEDED, "every rank exited 0");
  }
  if (!job.ok() && IsTransientStoreError(job.status())) {
    if (run.finish_error.ok()) {
      TRAINCTL_LOG(WARNING) << job_id
                            << ": its end is not stored yet, retrying: " << job.status().message();
    }
    run.finish_error = job.status();
    return;
  }
  for (const std::string& id : run.task_ids) tasks_.erase(id);
  runs_.erase(run_it);
  if (!job.ok()) {
    // A user cancel raced the end; the store has the final word.
    TRAINCTL_LOG(WARNING) << job_id << ": " << job.status().message();
    auto current = jobs_->Get(job_id);
    if (current.ok() && current->cancel_requested() && !IsTerminal(current->state())) {
      (void)jobs_->Transition(job_id, v1::JOB_STATE_CANCELLED, current->message());
    }
    return;
  }
  TRAINCTL_LOG(INFO) << job_id << " -> " << JobStateName(job->state());
  if (job->state() == v1::JOB_STATE_RESTARTING || job->state() == v1::JOB_STATE_PENDING) {
    // A cancel may have landed between our read and the transition.
    if (job->cancel_requested()) {
      (void)jobs_->Transition(job_id, v1::JOB_STATE_CANCELLED, job->message());
      return;
    }
    Enqueue(*job);
  }
  schedule_needed_ = true;
}

}  // namespace trainctl
