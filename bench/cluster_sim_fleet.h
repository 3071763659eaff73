// bench/cluster_sim's simulated nodes and what they saw: a Fleet of SimSessions
// (tests/integration/ingest_load.h) driven by one timer thread, and the Timeline of every job
// (submitted, each node rank RUNNING, each SUCCEEDED) the report is computed from. Only
// cluster_sim.cc includes it.
#ifndef TRAINCTL_BENCH_CLUSTER_SIM_FLEET_H_
#define TRAINCTL_BENCH_CLUSTER_SIM_FLEET_H_

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/integration/ingest_load.h"

namespace trainctl::bench::cluster_sim {

namespace v1 = trainctl::v1;
using testing::Latency;
using testing::SimSession;
using testing::internal_load::Summarize;

inline double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

// What happened to each job, as the clients and the simulated nodes saw it.
class Timeline {
 public:
  void Submitted(const std::string& job, int index, absl::Time start, int nodes) {
    absl::MutexLock lock(&mu_);
    JobTimes& t = jobs_[job];
    t.index = index;
    t.submit = start;
    t.nodes = nodes;
  }
  void Running(const std::string& job, absl::Time at) {
    absl::MutexLock lock(&mu_);
    JobTimes& t = jobs_[job];
    ++t.running;
    t.last_running = std::max(t.last_running, at);
  }
  void Finished(const std::string& job, absl::Time at) {
    absl::MutexLock lock(&mu_);
    ++tasks_finished_;
    last_finish_ = at;
    if (first_finish_ == absl::InfiniteFuture()) first_finish_ = at;
    ++jobs_[job].finished;
  }
  void Idle(absl::Duration idle) {
    absl::MutexLock lock(&mu_);
    idle_ms_.push_back(Ms(idle));
  }
  int64_t tasks_finished() {
    absl::MutexLock lock(&mu_);
    return tasks_finished_;
  }

  struct Figures {
    Latency first_wave, all, idle;  // ms
    int64_t jobs_done = 0;
    double jobs_per_s = 0;
  };
  // `wave`: how many jobs, in submission order, fit the empty cluster.
  Figures Compute(int wave) {
    absl::MutexLock lock(&mu_);
    Figures f;
    std::vector<double> first, all;
    for (const auto& [id, t] : jobs_) {
      if (t.nodes == 0) continue;
      f.jobs_done += t.finished >= t.nodes ? 1 : 0;
      if (t.running < t.nodes) continue;
      const double ms = Ms(t.last_running - t.submit);
      all.push_back(ms);
      if (t.index < wave) first.push_back(ms);
    }
    f.first_wave = Summarize(first);
    f.all = Summarize(all);
    f.idle = Summarize(idle_ms_);
    const double span = absl::ToDoubleSeconds(last_finish_ - first_finish_);
    f.jobs_per_s = span > 0 ? static_cast<double>(f.jobs_done) / span : 0;
    return f;
  }

 private:
  struct JobTimes {
    int index = 0, nodes = 0, running = 0, finished = 0;
    absl::Time submit, last_running = absl::InfinitePast();
  };
  absl::Mutex mu_;
  std::map<std::string, JobTimes> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<double> idle_ms_ ABSL_GUARDED_BY(mu_);
  int64_t tasks_finished_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time first_finish_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  absl::Time last_finish_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
};

struct SimTask {
  std::string task, job;
  int attempt = 0, first_rank = 0, ranks = 0;
  int64_t lines = 0;
  absl::Time next_log, end;
};

struct FleetOptions {
  int slots = 8;
  absl::Duration heartbeat = absl::Seconds(2), log_interval = absl::Seconds(1),
                 job_time = absl::Seconds(2);
};

struct SimNode {
  std::unique_ptr<SimSession> session;
  absl::Mutex mu;
  absl::Time next_heartbeat ABSL_GUARDED_BY(mu);
  absl::Time idle_since ABSL_GUARDED_BY(mu) = absl::InfinitePast();
  std::vector<SimTask> tasks ABSL_GUARDED_BY(mu);
};

// The nodes and the one thread that runs every node's timers.
class Fleet {
 public:
  Fleet(const std::string& address, int count, const FleetOptions& options, Timeline* timeline)
      : timeline_(timeline),
        heartbeat_(options.heartbeat),
        log_interval_(options.log_interval),
        job_time_(options.job_time) {
    const absl::Time now = absl::Now();
    for (int i = 0; i < count; ++i) nodes_.push_back(std::make_unique<SimNode>());
    for (int i = 0; i < count; ++i) {
      SimNode* node = nodes_[i].get();
      {
        absl::MutexLock lock(&node->mu);
        node->next_heartbeat = now + heartbeat_ * (static_cast<double>(i) / count);
      }
      node->session = std::make_unique<SimSession>(
          address, absl::StrFormat("sim-%04d", i), options.slots,
          [this, node](const v1::LaunchTask& launch) { Launched(*node, launch); });
    }
    ticker_ = std::thread([this] { Run(); });
  }
  ~Fleet() {
    stop_ = true;
    ticker_.join();
    for (auto& n : nodes_) n->session->Stop();
  }

  // Nodes not registered within `timeout` (0: all are).
  int AwaitRegistered(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    int missing = 0;
    for (auto& n : nodes_) missing += n->session->AwaitRegistered(deadline - absl::Now()) ? 0 : 1;
    return missing;
  }
  int64_t heartbeats() const { return heartbeats_; }
  // Sessions the coordinator ended, with why (the first few).
  std::string Ended(int* count) {
    std::string why;
    *count = 0;
    for (auto& n : nodes_) {
      const std::string e = n->session->ended();
      if (e.empty()) continue;
      if (++*count <= 3) absl::StrAppend(&why, n->session->name(), ": ", e, "; ");
    }
    return why;
  }
  // The most messages any node still had waiting for their write.
  size_t MaxQueued() {
    size_t most = 0;
    for (auto& n : nodes_) most = std::max(most, n->session->queued());
    return most;
  }

 private:
  void Launched(SimNode& node, const v1::LaunchTask& launch) {
    const absl::Time now = absl::Now();
    {
      absl::MutexLock lock(&node.mu);
      for (const SimTask& t : node.tasks) {
        if (t.task == launch.task_id()) return;  // sent again
      }
      if (node.tasks.empty() && node.idle_since != absl::InfinitePast()) {
        timeline_->Idle(now - node.idle_since);
      }
      node.tasks.push_back(SimTask{launch.task_id(), launch.job_id(), launch.attempt(),
                                   launch.first_rank(), std::max(1, launch.slots()), 0,
                                   now + log_interval_, now + job_time_});
    }
    node.session->SendSequenced(testing::internal_load::StatusMessage(
        launch.task_id(), launch.job_id(), v1::TASK_STATE_RUNNING, launch.attempt()));
    timeline_->Running(launch.job_id(), now);
  }

  void Tick(SimNode& node, absl::Time now) {
    absl::MutexLock lock(&node.mu);
    if (now >= node.next_heartbeat) {
      v1::WorkerMessage hb;
      hb.mutable_heartbeat()->mutable_time()->set_seconds(absl::ToUnixSeconds(now));
      node.session->Send(std::move(hb));
      node.next_heartbeat += heartbeat_;
      ++heartbeats_;
    }
    for (auto it = node.tasks.begin(); it != node.tasks.end();) {
      if (now >= it->end) {
        node.session->SendSequenced(testing::internal_load::StatusMessage(
            it->task, it->job, v1::TASK_STATE_SUCCEEDED, it->attempt));
        timeline_->Finished(it->job, now);
        it = node.tasks.erase(it);
        if (node.tasks.empty()) node.idle_since = now;
        continue;
      }
      if (now >= it->next_log) SendLogs(node, *it, now);
      ++it;
    }
  }

  // A line per rank, as one batch (the worker batches what its ranks printed).
  void SendLogs(SimNode& node, SimTask& task, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(node.mu) {
    v1::WorkerMessage m;
    ++task.lines;
    for (int r = 0; r < task.ranks; ++r) {
      v1::LogLine* line = m.mutable_logs()->add_lines();
      line->set_job_id(task.job);
      line->set_rank(task.first_rank + r);
      line->set_stream("stdout");
      line->mutable_time()->set_seconds(absl::ToUnixSeconds(now));
      line->set_text(absl::StrCat("step ", task.lines, " rank ", task.first_rank + r,
                                  ": loss=0.6931 lr=2.0e-05 tokens/s=12345 (simulated rank)"));
    }
    node.session->SendSequenced(std::move(m));
    task.next_log += log_interval_;
  }

  void Run() {
    while (!stop_) {
      const absl::Time now = absl::Now();
      for (auto& n : nodes_) Tick(*n, now);
      absl::SleepFor(absl::Milliseconds(10));
    }
  }

  Timeline* const timeline_;
  const absl::Duration heartbeat_, log_interval_, job_time_;
  std::vector<std::unique_ptr<SimNode>> nodes_;
  std::atomic<int64_t> heartbeats_{0};
  std::atomic<bool> stop_{false};
  std::thread ticker_;
};

}  // namespace trainctl::bench::cluster_sim

#endif  // TRAINCTL_BENCH_CLUSTER_SIM_FLEET_H_
