// The cluster's loop thread (an actor), its public calls, leases and node listings (cluster.h);
// the session protocol is in cluster_sessions.cc, the runs in gang_runner.cc.
#include "coordinator/cluster.h"

#include <algorithm>
#include <future>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/worker_limits.h"
#include "coordinator/internal/cluster_metrics.h"
#include "google/protobuf/util/time_util.h"

namespace trainctl {
namespace v1 = trainctl::v1;
using google::protobuf::util::TimeUtil;

namespace {

// How long placed jobs wait for their workers after a start: recovery_grace, or by default a
// lease and the 10 s a worker's reconnect back-off may add (5 s at most by default).
absl::Duration RecoveryGrace(const ClusterOptions& o) {
  return o.recovery_grace > absl::ZeroDuration() ? o.recovery_grace
                                                 : o.lease_timeout + absl::Seconds(10);
}

}  // namespace

Cluster::Cluster(JobManager* jobs, Clock* clock, ClusterOptions options)
    : jobs_(jobs),
      clock_(clock),
      options_(std::move(options)),
      metrics_(options_.metrics != nullptr
                   ? std::make_unique<internal::ClusterMetrics>(options_.metrics)
                   : nullptr),
      registry_(options_.lease_timeout, metrics_ != nullptr ? &metrics_->lease_misses : nullptr),
      runner_(
          jobs, clock, &registry_,
          GangRunnerOptions{RecoveryGrace(options_), options_.launch_timeout, options_.metrics}) {
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

// Placed jobs wait for their workers (GangRunner::Recover), then the loop starts.
absl::Status Cluster::Start() {
  RETURN_IF_ERROR(runner_.Recover());
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
      ExpireLeases();
      runner_.Tick();
      next_tick = absl::Now() + options_.tick;
      if (options_.on_tick) options_.on_tick(Summary());
    }
    runner_.ScheduleIfNeeded();
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
  summary.placed_jobs = runner_.placed_jobs();
  summary.waiting_jobs = runner_.waiting_jobs();
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
  Post([this, job_id] { runner_.JobChanged(job_id); });
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
      const int used = runner_.UsedSlots(node);
      for (v1::NodeTask& task : runner_.TasksOn(node)) *n.add_tasks() = std::move(task);
      n.set_free_slots(std::max(0, node.total_slots - used));
      n.set_gpus(node.gpus);
      n.set_gpu_memory_bytes(node.gpu_memory_bytes);
      *n.mutable_last_seen() =
          TimeUtil::MicrosecondsToTimestamp(absl::ToUnixMicros(registry_.LastSeen(node, now)));
      out.push_back(std::move(n));
    }
    result.set_value(std::move(out));
  });
  return result.get_future().get();
}

void Cluster::ExpireLeases() {
  for (const auto& [name, silent] : registry_.ExpiredLeases(clock_->Now())) {
    WorkerNode& node = *registry_.Find(name);
    const std::string reason =
        absl::StrCat("node ", name, " lost: no heartbeat for ", absl::FormatDuration(silent));
    TRAINCTL_LOG(WARNING) << reason;
    node.lost = true;
    if (node.channel != nullptr) node.channel->Close(absl::UnavailableError(reason));
    registry_.Detach(node);
    runner_.NodeLost(node, reason);
  }
}

}  // namespace trainctl
