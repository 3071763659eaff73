#include "coordinator/cluster.h"

#include <algorithm>
#include <future>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_spec.h"
#include "common/json_proto.h"
#include "common/logging.h"
#include "common/pipeline_spec.h"
#include "common/remedies_spec.h"
#include "common/worker_limits.h"
#include "coordinator/internal/cluster_metrics.h"
#include "coordinator/internal/cluster_tasks.h"
#include "coordinator/job_launch.h"
#include "coordinator/job_stages.h"
#include "coordinator/job_state.h"
#include "coordinator/remedy_ladder.h"
#include "google/protobuf/util/time_util.h"
#include "nlohmann/json.hpp"

namespace trainctl {
namespace {

namespace v1 = trainctl::v1;
using google::protobuf::util::TimeUtil;
using internal::TaskEnded;
using internal::TaskIdOf;

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
                                        const std::string& detail) {
  if (job.spec().kind() == v1::JOB_KIND_PIPELINE) return std::nullopt;
  AttemptFailure failure;
  failure.attempt = job.attempt();
  failure.exit_code = exit_code;
  failure.rank = rank;
  failure.detail = detail;
  failure.last_checkpoint_step = job.last_checkpoint().step();
  return NextRemedy(job.spec(), job.remedies(), failure);
}

}  // namespace

int Cluster::UsedSlots(const WorkerNode& node) const {
  int used = 0;
  for (const std::string& id : node.tasks) used += tasks_.at(id).slots;
  for (const auto& [id, slots] : node.draining) used += slots;
  return used;
}

Cluster::Cluster(JobManager* jobs, Clock* clock, ClusterOptions options)
    : jobs_(jobs),
      clock_(clock),
      options_(std::move(options)),
      metrics_(options_.metrics != nullptr ? std::make_unique<Metrics>(options_.metrics) : nullptr),
      registry_(options_.lease_timeout, metrics_ != nullptr ? &metrics_->lease_misses : nullptr) {
  EventIngesterOptions ingest = options_.ingest;
  ingest.metrics = options_.metrics;
  ingester_ = std::make_unique<EventIngester>(
      jobs_, ingest, [this](std::vector<EventIngester::Outcome> outcomes) {
        Post([this, outcomes = std::move(outcomes)] { HandleStored(outcomes); });
      });
  jobs_->AddObserver(this);
}

Cluster::~Cluster() {
  Stop();  // its loop and ingester, which call into the manager, are joined first
  jobs_->RemoveObserver(this);
}

absl::Status Cluster::Start() {
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
  const absl::Duration grace = options_.recovery_grace > absl::ZeroDuration()
                                   ? options_.recovery_grace
                                   : options_.lease_timeout + absl::Seconds(10);
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
  loop_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void Cluster::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  if (loop_.joinable()) loop_.join();
  // What was handed to it is stored; its reports run on its thread now (Post after the loop).
  ingester_->Stop();
}

void Cluster::Post(std::function<void()> work) {
  {
    absl::MutexLock lock(&mu_);
    if (!loop_exited_) {
      queue_.push_back(std::move(work));
      return;
    }
  }
  // The loop is gone (stopping): run it here, one at a time, so no caller waits forever.
  absl::MutexLock lock(&late_mu_);
  work();
}

void Cluster::Loop() {
  absl::Time next_tick = absl::Now();
  while (true) {
    std::deque<std::function<void()>> work;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.AwaitWithDeadline(absl::Condition(&ready), next_tick);
      if (stopping_) break;
      work.swap(queue_);
    }
    for (auto& w : work) w();
    if (absl::Now() >= next_tick) {
      Tick();
      next_tick = absl::Now() + options_.tick;
      if (options_.on_tick) options_.on_tick(Summary());
    }
    if (schedule_needed_) SchedulePass();
    if (metrics_ != nullptr) metrics_->queue_depth.Set(static_cast<double>(waiting_.size()));
  }
  // Run what is still queued (streams wait on their `done`, ListNodes on its answer); later posts
  // run on their callers' threads.
  absl::MutexLock late(&late_mu_);
  std::deque<std::function<void()>> rest;
  {
    absl::MutexLock lock(&mu_);
    loop_exited_ = true;
    rest.swap(queue_);
  }
  for (auto& w : rest) w();
}

ClusterSummary Cluster::Summary() {
  ClusterSummary summary;
  for (const auto& [name, node] : registry_.nodes()) summary.nodes += node.lost ? 0 : 1;
  summary.placed_jobs = static_cast<int>(runs_.size());
  summary.waiting_jobs = static_cast<int>(waiting_.size());
  return summary;
}

void Cluster::Flush() {
  auto run_queued = [this] {
    std::promise<void> done;
    Post([&done] { done.set_value(); });
    done.get_future().wait();
  };
  run_queued();
  ingester_->Flush();
  run_queued();  // the ingester's reports
}

int64_t Cluster::Connect(std::shared_ptr<WorkerChannel> channel) {
  int64_t id;
  {
    absl::MutexLock lock(&mu_);
    id = ++next_session_;
  }
  Post([this, id, channel = std::move(channel)] { registry_.AddSession(id, channel); });
  return id;
}

void Cluster::Receive(int64_t session, v1::WorkerMessage message, std::function<void()> done) {
  // Here, not on the loop: a backed-up loop must not make a live worker look silent, and the
  // checks of a large log batch need not take the loop's time.
  const absl::Time arrived = clock_->Now();
  registry_.MessageArrived(session, arrived);
  absl::Status checked = message.has_register_() ? absl::OkStatus() : CheckWorkerMessage(message);
  std::function<void()> release = [this, session, done = std::move(done)] {
    registry_.MessageReleased(session, clock_->Now());
    done();
  };
  Post([this, session, message = std::move(message), checked = std::move(checked), arrived,
        release = std::move(release)]() mutable {
    HandleMessage(session, std::move(message), std::move(checked), arrived, std::move(release));
  });
}

void Cluster::Disconnect(int64_t session) {
  registry_.SessionEnded(session);
  Post([this, session] {
    if (WorkerNode* node = registry_.ForSession(session)) {
      TRAINCTL_LOG(INFO) << "worker " << node->name << " disconnected; lease runs for "
                         << options_.lease_timeout;
    }
    registry_.RemoveSession(session);
  });
}

void Cluster::JobChanged(const std::string& job_id) {
  Post([this, job_id] { HandleJobChanged(job_id); });
}

std::vector<v1::Node> Cluster::ListNodes() {
  std::promise<std::vector<v1::Node>> result;
  Post([this, &result] {
    std::vector<v1::Node> out;
    const absl::Time now = clock_->Now();
    for (const auto& [name, node] : registry_.nodes()) {
      v1::Node n;
      n.set_name(name);
      n.set_address(node.address);
      n.set_state(node.lost ? "lost" : node.session == 0 ? "disconnected" : "ready");
      n.mutable_labels()->insert(node.labels.begin(), node.labels.end());
      n.set_total_slots(node.total_slots);
      const int used = UsedSlots(node);
      for (const std::string& id : node.tasks) {
        const Task& task = tasks_.at(id);
        v1::NodeTask* t = n.add_tasks();
        t->set_task_id(task.id);
        t->set_job_id(task.job_id);
        t->set_node_rank(task.node_rank);
        t->set_slots(task.slots);
      }
      n.set_free_slots(std::max(0, node.total_slots - used));
      n.set_gpus(node.gpus);
      *n.mutable_last_seen() =
          TimeUtil::MicrosecondsToTimestamp(absl::ToUnixMicros(registry_.LastSeen(node, now)));
      out.push_back(std::move(n));
    }
    result.set_value(std::move(out));
  });
  return result.get_future().get();
}

Cluster::Task* Cluster::FindTask(const std::string& id) {
  auto it = tasks_.find(id);
  return it == tasks_.end() ? nullptr : &it->second;
}

void Cluster::Enqueue(const Job& job) {
  waiting_[job.id()] = ToSchedJob(job);
  // A restarting job keeps its restart reason as its message.
  if (job.state() == v1::JOB_STATE_RESTARTING) told_never_fits_.insert(job.id());
  schedule_needed_ = true;
}

absl::Status Cluster::FinishRun(std::string job_id) {
  MaybeFinish(job_id);
  auto run = runs_.find(job_id);
  return run == runs_.end() ? absl::OkStatus() : run->second.finish_error;
}

void Cluster::HandleJobChanged(const std::string& job_id) {
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

void Cluster::Tick() {
  const absl::Time now = clock_->Now();
  for (const auto& [name, silent] : registry_.ExpiredLeases(now)) {
    LoseNode(*registry_.Find(name),
             absl::StrCat("node ", name, " lost: no heartbeat for ", absl::FormatDuration(silent)));
  }
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
    if (WorkerNode* node = registry_.Find(task.node)) {
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

void Cluster::EndRecovery(const std::string& job_id, const std::string& reason) {
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

void Cluster::LoseNode(WorkerNode& node, const std::string& reason) {
  TRAINCTL_LOG(WARNING) << reason;
  node.lost = true;
  if (node.channel != nullptr) node.channel->Close(absl::UnavailableError(reason));
  registry_.Detach(node);
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

void Cluster::SchedulePass() {
  schedule_needed_ = false;
  if (waiting_.empty()) return;
  const absl::Time start = absl::Now();
  std::vector<SchedNode> sched_nodes;
  std::vector<std::string> names;
  for (const auto& [name, node] : registry_.nodes()) {
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

void Cluster::Place(const std::string& job_id, const std::vector<std::string>& nodes) {
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
  run.master_addr = registry_.nodes().at(nodes[0]).address;
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
    registry_.nodes().at(nodes[r]).tasks.insert(id);
  }
  TRAINCTL_LOG(INFO) << job_id << " attempt " << job->attempt() << " placed on "
                     << absl::StrJoin(nodes, ",");
  LaunchTask(run, tasks_.at(run.task_ids[0]));
}

void Cluster::LaunchTask(Run& run, Task& task) {
  if (TaskEnded(task.state)) return;  // stopped before it was sent
  WorkerNode& node = registry_.nodes().at(task.node);
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

void Cluster::SendCancel(const Task& task, const std::string& reason) {
  WorkerNode* node = task.node.empty() ? nullptr : registry_.Find(task.node);
  v1::CoordinatorMessage message;
  message.mutable_cancel()->set_task_id(task.id);
  message.mutable_cancel()->set_reason(reason);
  if (node != nullptr) {
    if (node->channel != nullptr) node->channel->Send(std::move(message));
    return;
  }
  // A stale task of whichever node reported it: every live session gets it (ids are unique).
  for (auto& [name, n] : registry_.nodes()) {
    if (n.channel != nullptr) n.channel->Send(message);
  }
}

void Cluster::EndTask(Task& task, v1::TaskState state) {
  task.state = state;
  if (WorkerNode* node = registry_.Find(task.node)) node->tasks.erase(task.id);
  schedule_needed_ = true;
}

void Cluster::FailRun(Run& run, const std::string& reason) {
  if (run.failing || run.cancel_requested) return;
  run.failing = true;
  run.failure = reason;
  TRAINCTL_LOG(WARNING) << run.job.id() << " attempt " << run.job.attempt()
                        << " failing: " << reason;
  StopTasks(run, absl::StrCat("another task of the job failed: ", reason));
}

void Cluster::CancelRun(Run& run, const std::string& reason) {
  run.cancel_requested = true;
  StopTasks(run, reason);
}

void Cluster::StopTasks(Run& run, const std::string& reason) {
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

Job Cluster::Stored(const Job& placed) {
  absl::StatusOr<Job> job = jobs_->Get(placed.id());
  return job.ok() ? *std::move(job) : placed;
}

void Cluster::MaybeFinish(std::string job_id) {
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
                                     run.failed_detail))
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
