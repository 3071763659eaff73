// A load of chatty jobs on a real coordinator, shared by the ingest test (CI-sized) and
// bench/ingest_bench (the issue's scale): simulated workers speak the worker protocol over gRPC
// (register, take a launch, report RUNNING, then stream rank log batches, a metric event per step
// and a larger "topology" JSON event per rank per step, heartbeats, and finally SUCCEEDED), while a
// prober times ListJobs and ListNodes and watches for nodes declared lost. Afterwards it reads back
// what the coordinator stored. Header-only: the test and the benchmark both include it. SimSession,
// the same worker's session on gRPC's callback API (many sessions, few threads), is what
// bench/cluster_sim runs its simulated cluster on.
#ifndef TRAINCTL_TESTS_INTEGRATION_INGEST_LOAD_H_
#define TRAINCTL_TESTS_INTEGRATION_INGEST_LOAD_H_

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/job_client.h"
#include "trainctl/v1/worker.grpc.pb.h"

namespace trainctl::testing {

namespace v1 = trainctl::v1;

struct IngestLoad {
  int workers = 4;
  int ranks = 4;                // per worker; each worker runs one job of `ranks` ranks
  int lines_per_second = 1000;  // per rank; 0: none
  absl::Duration duration = absl::Seconds(6);
  absl::Duration step =
      absl::Milliseconds(100);  // a metric event per job, a topology event per rank
  int line_bytes = 100;
  int topology_bytes = 2048;  // 0: no topology events
};

struct Latency {
  int64_t count = 0;
  double p50_ms = 0, p99_ms = 0, max_ms = 0;
};

struct IngestReport {
  int64_t lines_sent = 0, lines_stored = 0;
  int64_t metric_events_sent = 0, topology_events_sent = 0;
  int64_t steps_stored = 0;  // sum over jobs of progress.step
  int64_t steps_sent = 0;
  double seconds = 0;  // first message sent .. last one acknowledged (everything stored)
  Latency list_jobs, list_nodes;
  std::set<std::string>
      lost_nodes;        // seen "lost" in ListNodes, or streams ended by the coordinator
  std::string problems;  // empty when the load ran as planned
};

namespace internal_load {

inline Latency Summarize(std::vector<double> ms) {
  Latency l;
  l.count = static_cast<int64_t>(ms.size());
  if (ms.empty()) return l;
  std::sort(ms.begin(), ms.end());
  auto at = [&](double q) {
    return ms[std::min(ms.size() - 1, static_cast<size_t>(q * static_cast<double>(ms.size())))];
  };
  l.p50_ms = at(0.5);
  l.p99_ms = at(0.99);
  l.max_ms = ms.back();
  return l;
}

// A worker's first message: a node of `slots` CPU slots on loopback, a fresh boot.
inline v1::WorkerMessage RegisterMessage(const std::string& name, int slots) {
  v1::WorkerMessage m;
  auto* reg = m.mutable_register_();
  reg->set_node_name(name);
  reg->set_advertise_addr("127.0.0.1");
  reg->mutable_resources()->set_cpu_slots(slots);
  reg->set_boot_id(absl::StrCat(name, "-", absl::ToUnixNanos(absl::Now())));
  return m;
}

// A task's status as a worker reports it (its node rank 0 "chose" rendezvous port 29500); the
// caller gives it a seq.
inline v1::WorkerMessage StatusMessage(const std::string& task, const std::string& job,
                                       v1::TaskState state, int attempt = 0) {
  v1::WorkerMessage m;
  auto* s = m.mutable_task_status();
  s->set_task_id(task);
  s->set_job_id(job);
  s->set_state(state);
  s->set_master_port(29500);
  s->set_attempt(attempt);
  return m;
}

// One simulated worker daemon on its own stream.
class SimWorker {
 public:
  SimWorker(const std::string& address, std::string name, const IngestLoad& load)
      : name_(std::move(name)), load_(load) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    stub_ = v1::WorkerService::NewStub(
        grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
    stream_ = stub_->Session(&context_);
    reader_ = std::thread([this] { Read(); });
  }
  ~SimWorker() {
    context_.TryCancel();
    if (reader_.joinable()) reader_.join();
  }

  bool Register() {
    if (!Write(RegisterMessage(name_, load_.ranks))) return false;
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&registered_), absl::Seconds(10));
  }

  // Waits for a launch and reports the task running.
  bool Launched(absl::Duration timeout) {
    {
      absl::MutexLock lock(&mu_);
      auto launched = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !task_.empty(); };
      if (!mu_.AwaitWithTimeout(absl::Condition(&launched), timeout)) return false;
    }
    return Status(v1::TASK_STATE_RUNNING);
  }

  // Streams the load until `end`, then reports the task succeeded.
  void Stream(absl::Time end, IngestReport* totals, absl::Mutex* totals_mu) {
    const int per_step =
        load_.lines_per_second <= 0
            ? 0
            : std::max<int>(
                  1, static_cast<int>(load_.lines_per_second * absl::ToDoubleSeconds(load_.step)));
    const std::string pad(static_cast<size_t>(std::max(0, load_.line_bytes - 40)), 'x');
    const std::string topology_pad(static_cast<size_t>(std::max(0, load_.topology_bytes)), 't');
    int64_t lines = 0, metrics = 0, topologies = 0, step = 0;
    absl::Time next = absl::Now();
    while (absl::Now() < end && !broken_) {
      ++step;
      v1::WorkerMessage batch;
      size_t bytes = 0;
      for (int rank = 0; rank < load_.ranks; ++rank) {
        for (int i = 0; i < per_step; ++i) {
          v1::LogLine* line = batch.mutable_logs()->add_lines();
          line->set_job_id(job_);
          line->set_rank(rank);
          line->set_stream("stdout");
          line->set_text(absl::StrCat("rank ", rank, " step ", step, " line ", i, " ", pad));
          bytes += line->text().size() + 32;
          ++lines;
          if (batch.logs().lines_size() == 4096 || bytes > (900 << 10)) {
            if (!Sequenced(&batch)) return;
            batch.Clear();
            bytes = 0;
          }
        }
      }
      if (batch.logs().lines_size() > 0 && !Sequenced(&batch)) return;
      v1::WorkerMessage metric;
      metric.mutable_event()->set_job_id(job_);
      metric.mutable_event()->set_json(absl::StrCat(
          R"({"type":"metric","step":)", step, R"(,"values":{"loss":)", 1.0 / step,
          R"(,"learning_rate":2e-5,"grad_norm":1.5,"tokens_per_second":12345,"total_steps":)",
          1000000, "}}"));
      if (!Sequenced(&metric)) return;
      ++metrics;
      for (int rank = 0; load_.topology_bytes > 0 && rank < load_.ranks; ++rank) {
        v1::WorkerMessage topology;
        topology.mutable_event()->set_job_id(job_);
        topology.mutable_event()->set_rank(rank);
        topology.mutable_event()->set_json(absl::StrCat(R"({"type":"topology","rank":)", rank,
                                                        R"(,"links":")", topology_pad, R"("})"));
        if (!Sequenced(&topology)) return;
        ++topologies;
      }
      v1::WorkerMessage heartbeat;
      heartbeat.mutable_heartbeat();
      if (!Write(heartbeat)) return;
      next += load_.step;
      const absl::Time now = absl::Now();
      if (next > now) absl::SleepFor(next - now);
    }
    if (!Status(v1::TASK_STATE_SUCCEEDED)) return;
    absl::MutexLock lock(totals_mu);
    totals->lines_sent += lines;
    totals->metric_events_sent += metrics;
    totals->topology_events_sent += topologies;
    totals->steps_sent += step;
  }

  // Waits until everything sent is acknowledged; false on timeout or a broken stream.
  bool AllAcknowledged(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto acked = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return acked_ >= seq_.load() || broken_;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&acked), timeout) && !broken_;
  }

  std::string job() {
    absl::MutexLock lock(&mu_);
    return job_;
  }
  // Why the coordinator ended the stream ("" while it lives).
  std::string ended() {
    absl::MutexLock lock(&mu_);
    return ended_;
  }

 private:
  bool Write(const v1::WorkerMessage& m) {
    absl::MutexLock lock(&write_mu_);
    if (!stream_->Write(m)) {
      broken_ = true;
      return false;
    }
    return true;
  }
  bool Sequenced(v1::WorkerMessage* m) {
    m->set_seq(++seq_);
    return Write(*m);
  }
  bool Status(v1::TaskState state) {
    v1::WorkerMessage m;
    {
      absl::MutexLock lock(&mu_);
      m = StatusMessage(task_, job_, state);
    }
    return Sequenced(&m);
  }
  void Read() {
    v1::CoordinatorMessage m;
    while (stream_->Read(&m)) {
      absl::MutexLock lock(&mu_);
      if (m.has_registered()) registered_ = true;
      if (m.has_launch()) {
        task_ = m.launch().task_id();
        job_ = m.launch().job_id();
      }
      if (m.has_ack()) acked_ = std::max(acked_, m.ack().through_seq());
    }
    grpc::Status status = stream_->Finish();
    absl::MutexLock lock(&mu_);
    broken_ = true;
    ended_ = status.ok() ? "ended" : status.error_message();
  }

  const std::string name_;
  const IngestLoad load_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>> stream_;
  absl::Mutex write_mu_;
  std::atomic<int64_t> seq_{0};
  std::atomic<bool> broken_{false};
  absl::Mutex mu_;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  std::string task_ ABSL_GUARDED_BY(mu_), job_ ABSL_GUARDED_BY(mu_);
  int64_t acked_ ABSL_GUARDED_BY(mu_) = 0;
  std::string ended_ ABSL_GUARDED_BY(mu_);
  std::thread reader_;
};

inline v1::JobSpec LoadJobSpec(int ranks, int n, int nodes = 1) {
  v1::JobSpec spec;
  spec.set_kind(v1::JOB_KIND_SFT);
  spec.set_name(absl::StrCat("chatty-", n));
  spec.set_model_name_or_path("tiny");
  spec.set_data_path("/tmp/trainctl-ingest-load/data");
  spec.set_output_dir(absl::StrCat("/tmp/trainctl-ingest-load/out-", n));
  spec.mutable_resources()->set_nodes(nodes);
  spec.mutable_resources()->set_slots_per_node(ranks);
  return spec;
}

}  // namespace internal_load

// A simulated worker's session on gRPC's callback API, for loads of many nodes (bench/cluster_sim
// runs 1,000 of them on two cores): the sessions share gRPC's few callback threads instead of
// holding threads of their own. Each has its own channel, so its own TCP connection as a worker
// daemon has. It registers, writes what it is given in order (one write in flight, the rest
// queued, seqs given in queue order) and hands every LaunchTask to `on_launch` on a callback
// thread. Its creator owns it; destroying it stops the call and waits until gRPC lets go.
class SimSession final : public grpc::ClientBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage> {
 public:
  using OnLaunch = std::function<void(const v1::LaunchTask&)>;

  SimSession(const std::string& address, std::string name, int slots, OnLaunch on_launch)
      : name_(std::move(name)), on_launch_(std::move(on_launch)) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
    args.SetMaxReceiveMessageSize(64 << 20);
    channel_ = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
    stub_ = v1::WorkerService::NewStub(channel_);
    stub_->async()->Session(&context_, this);
    StartRead(&in_);
    Send(internal_load::RegisterMessage(name_, slots));
    StartCall();
  }
  ~SimSession() override { Stop(); }

  const std::string& name() const { return name_; }

  // Queues `m` (a heartbeat, or a message with a seq already set).
  void Send(v1::WorkerMessage m) {
    absl::MutexLock lock(&mu_);
    QueueLocked(std::move(m));
  }
  // Gives `m` the next seq and queues it.
  void SendSequenced(v1::WorkerMessage m) {
    absl::MutexLock lock(&mu_);
    m.set_seq(++seq_);
    QueueLocked(std::move(m));
  }

  bool AwaitRegistered(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto up = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return registered_ || done_; };
    return mu_.AwaitWithTimeout(absl::Condition(&up), timeout) && registered_ && !done_;
  }
  // Messages with a seq not yet acknowledged.
  int64_t unacked() {
    absl::MutexLock lock(&mu_);
    return seq_ - acked_;
  }
  // Messages waiting for their write (the coordinator reads a session's next message only when it
  // is done with the last).
  size_t queued() {
    absl::MutexLock lock(&mu_);
    return queue_.size();
  }
  // Why the stream ended ("" while it lives; "cancelled" after Stop).
  std::string ended() {
    absl::MutexLock lock(&mu_);
    return ended_;
  }

  // Cancels the call and waits until gRPC is done with this reactor.
  void Stop() {
    context_.TryCancel();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
  }

 private:
  void QueueLocked(v1::WorkerMessage m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (done_) return;
    queue_.push_back(std::move(m));
    if (writing_) return;
    writing_ = true;
    StartWrite(&queue_.front());  // deque references stay valid across push_back
  }
  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    queue_.pop_front();
    writing_ = ok && !queue_.empty();
    if (!ok) queue_.clear();
    if (writing_) StartWrite(&queue_.front());
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended; OnDone has its status
    if (in_.has_launch()) on_launch_(in_.launch());
    {
      absl::MutexLock lock(&mu_);
      if (in_.has_registered()) registered_ = true;
      if (in_.has_ack()) acked_ = std::max(acked_, in_.ack().through_seq());
    }
    StartRead(&in_);
  }
  void OnDone(const grpc::Status& status) override {
    absl::MutexLock lock(&mu_);
    ended_ = status.ok() ? "ended" : status.error_message();
    done_ = true;
  }

  const std::string name_;
  const OnLaunch on_launch_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  grpc::ClientContext context_;
  v1::CoordinatorMessage in_;
  absl::Mutex mu_;
  std::deque<v1::WorkerMessage> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  int64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t acked_ ABSL_GUARDED_BY(mu_) = 0;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::string ended_ ABSL_GUARDED_BY(mu_);
};

// Runs `load` against the coordinator at `address` (with no other workers or jobs).
inline IngestReport RunIngestLoad(const std::string& address, const IngestLoad& load) {
  using internal_load::SimWorker;
  IngestReport report;
  std::vector<std::unique_ptr<SimWorker>> workers;
  for (int w = 0; w < load.workers; ++w) {
    workers.push_back(std::make_unique<SimWorker>(address, absl::StrCat("sim-", w), load));
    if (!workers.back()->Register()) {
      report.problems = absl::StrCat("worker sim-", w, " was not registered");
      return report;
    }
  }
  cli::JobClient client(address);
  std::vector<std::string> jobs;
  for (int w = 0; w < load.workers; ++w) {
    v1::SubmitJobRequest request;
    *request.mutable_spec() = internal_load::LoadJobSpec(load.ranks, w);
    auto submitted = client.Submit(request);
    if (!submitted.ok()) {
      report.problems = absl::StrCat("submit: ", submitted.status().ToString());
      return report;
    }
    jobs.push_back(submitted->job().id());
  }
  for (auto& w : workers) {
    if (!w->Launched(absl::Seconds(30))) {
      report.problems = "a worker got no launch";
      return report;
    }
  }

  // The prober: ListJobs and ListNodes as `trainctl ls` and `trainctl nodes` would call them.
  std::atomic<bool> probing{true};
  std::vector<double> list_ms, nodes_ms;
  std::set<std::string> lost;
  std::thread prober([&] {
    cli::JobClient probe(address);
    while (probing) {
      const absl::Time t0 = absl::Now();
      v1::ListJobsRequest request;
      request.set_page_size(100);
      const bool listed = probe.List(request).ok();
      const absl::Time t1 = absl::Now();
      auto nodes = probe.ListNodes();
      const absl::Time t2 = absl::Now();
      if (listed) list_ms.push_back(absl::ToDoubleMilliseconds(t1 - t0));
      if (nodes.ok()) {
        nodes_ms.push_back(absl::ToDoubleMilliseconds(t2 - t1));
        for (const auto& n : nodes->nodes()) {
          if (n.state() == "lost") lost.insert(n.name());
        }
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  });

  absl::Mutex totals_mu;
  const absl::Time start = absl::Now();
  const absl::Time end = start + load.duration;
  std::vector<std::thread> senders;
  for (auto& w : workers) {
    SimWorker* worker = w.get();
    senders.emplace_back([&, worker] { worker->Stream(end, &report, &totals_mu); });
  }
  for (auto& t : senders) t.join();
  bool all_acked = true;
  for (auto& w : workers) all_acked = w->AllAcknowledged(absl::Seconds(120)) && all_acked;
  report.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  probing = false;
  prober.join();
  report.list_jobs = internal_load::Summarize(list_ms);
  report.list_nodes = internal_load::Summarize(nodes_ms);
  report.lost_nodes = lost;
  for (int w = 0; w < load.workers; ++w) {
    const std::string why = workers[w]->ended();
    if (!why.empty() && why != "ended")
      report.lost_nodes.insert(absl::StrCat("sim-", w, ": ", why));
  }
  if (!all_acked) report.problems = "not every message was acknowledged within 120 s";

  // What was stored.
  for (const std::string& id : jobs) {
    v1::StreamLogsRequest request;
    request.set_id(id);
    int64_t n = 0;
    if (!client.Logs(request, [&n](const v1::LogLine&) { ++n; }).ok()) {
      report.problems += " cannot read the logs of " + id;
    }
    report.lines_stored += n;
    auto job = client.Get(id);
    if (job.ok()) report.steps_stored += job->progress().step();
  }
  return report;
}

}  // namespace trainctl::testing

#endif  // TRAINCTL_TESTS_INTEGRATION_INGEST_LOAD_H_
