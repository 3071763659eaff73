// The Cluster test fixture: fake worker streams (they record what the coordinator sends), an
// in-memory store whose batch writes a test can hold back or fail, and a fake clock for leases.
// Shared by the cluster suites.
#ifndef TRAINCTL_TESTS_COORDINATOR_CLUSTER_FIXTURE_H_
#define TRAINCTL_TESTS_COORDINATOR_CLUSTER_FIXTURE_H_

#include <memory>
#include <string>
#include <vector>

#include "coordinator/cluster.h"
#include "coordinator/in_memory_job_store.h"
#include "coordinator/job_manager.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/gated_job_store.h"
#include "tests/testing/subprocess.h"

namespace trainctl::testing {

namespace v1 = trainctl::v1;

class FakeChannel final : public WorkerChannel {
 public:
  void Send(v1::CoordinatorMessage message) override {
    absl::MutexLock lock(&mu_);
    sent_.push_back(std::move(message));
  }
  void Close(const absl::Status& why) override {
    absl::MutexLock lock(&mu_);
    closed_ = why.ToString();
  }
  std::vector<v1::CoordinatorMessage> Take(v1::CoordinatorMessage::MsgCase kind) {
    absl::MutexLock lock(&mu_);
    std::vector<v1::CoordinatorMessage> out, rest;
    for (auto& m : sent_) (m.msg_case() == kind ? out : rest).push_back(std::move(m));
    sent_ = std::move(rest);
    return out;
  }
  std::string closed() {
    absl::MutexLock lock(&mu_);
    return closed_;
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::CoordinatorMessage> sent_;
  std::string closed_;
};

// One fake worker: its stream, its session and its seqs.
struct FakeWorker {
  std::shared_ptr<FakeChannel> channel = std::make_shared<FakeChannel>();
  int64_t session = 0;
  int64_t seq = 0;
};

// A task a registering worker reports as still running.
inline v1::RunningTask Running(const std::string& task_id, const std::string& job_id, int slots,
                               int master_port = 0) {
  v1::RunningTask rt;
  rt.set_task_id(task_id);
  rt.set_job_id(job_id);
  rt.set_node_rank(0);
  rt.set_slots(slots);
  rt.set_state(v1::TASK_STATE_RUNNING);
  rt.set_master_port(master_port);
  return rt;
}

// An SFT job "j" of `nodes` x `slots` ranks (nothing runs it: the workers here are fakes).
inline v1::JobSpec GangSpec(int nodes, int slots) {
  v1::JobSpec spec;
  spec.set_name("j");
  spec.set_kind(v1::JOB_KIND_SFT);
  spec.set_model_name_or_path("tiny");
  spec.set_data_path("/data");
  spec.set_output_dir("/out");
  spec.mutable_resources()->set_nodes(nodes);
  spec.mutable_resources()->set_slots_per_node(slots);
  return spec;
}

class ClusterTest : public ::testing::Test {
 protected:
  ClusterTest() { Restart(); }

  // A new Cluster over the same store (a coordinator restart).
  void Restart() {
    cluster_.reset();
    ClusterOptions options;
    options.lease_timeout = absl::Seconds(10);
    options.recovery_grace = absl::Seconds(15);
    options.metrics = metrics_;  // each registry takes one cluster's families
    options.tick = absl::Milliseconds(1);
    cluster_ = std::make_unique<Cluster>(&jobs_, &clock_, options);
    ASSERT_TRUE(cluster_->Start().ok());
  }

  FakeWorker Register(const std::string& name, int slots, std::vector<v1::RunningTask> running = {},
                      const std::string& boot = "b1") {
    FakeWorker w;
    w.session = cluster_->Connect(w.channel);
    v1::WorkerMessage m;
    auto* reg = m.mutable_register_();
    reg->set_node_name(name);
    reg->set_advertise_addr("10.0.0." + std::to_string(name.back() - 'a' + 1));
    reg->mutable_resources()->set_cpu_slots(slots);
    reg->set_boot_id(boot);
    for (auto& t : running) *reg->add_running_tasks() = t;
    Send(w, m, /*sequenced=*/false);
    return w;
  }

  void Send(FakeWorker& w, v1::WorkerMessage m, bool sequenced = true) {
    if (sequenced) m.set_seq(++w.seq);
    cluster_->Receive(w.session, std::move(m), [] {});
    cluster_->Flush();
  }

  void Status(FakeWorker& w, const v1::LaunchTask& launch, v1::TaskState state, int port = 0,
              int failed_rank = 0, int exit_code = 0) {
    v1::WorkerMessage m;
    auto* s = m.mutable_task_status();
    s->set_task_id(launch.task_id());
    s->set_job_id(launch.job_id());
    s->set_state(state);
    s->set_master_port(port);
    s->set_failed_rank(failed_rank);
    s->set_exit_code(exit_code);
    if (state == v1::TASK_STATE_FAILED) s->add_last_log_lines("boom: out of memory");
    Send(w, m);
  }

  std::string Submit(int nodes, int slots, int max_restarts = 0, int priority = 0) {
    v1::JobSpec spec = GangSpec(nodes, slots);
    spec.set_max_restarts(max_restarts);
    spec.set_priority(priority);
    auto r = jobs_.Submit(spec, "");
    EXPECT_TRUE(r.ok()) << r.status();
    cluster_->Flush();
    cluster_->Flush();  // the pass runs after the queued work
    return r.ok() ? r->job.id() : "";
  }

  v1::LaunchTask OneLaunch(FakeWorker& w) {
    std::vector<v1::CoordinatorMessage> launches;
    EXPECT_TRUE(testing::WaitFor(
        [&] {
          cluster_->Flush();
          for (auto& m : w.channel->Take(v1::CoordinatorMessage::kLaunch)) launches.push_back(m);
          return !launches.empty();
        },
        absl::Seconds(5)));
    EXPECT_EQ(launches.size(), 1u);
    return launches.empty() ? v1::LaunchTask() : launches[0].launch();
  }

  std::vector<v1::CancelTask> Cancels(FakeWorker& w) {
    cluster_->Flush();
    std::vector<v1::CancelTask> out;
    for (auto& m : w.channel->Take(v1::CoordinatorMessage::kCancel)) out.push_back(m.cancel());
    return out;
  }

  v1::Job WaitState(const std::string& id, v1::JobState state) {
    v1::Job job;
    EXPECT_TRUE(testing::WaitFor(
        [&] {
          cluster_->Flush();
          job = jobs_.Get(id).value();
          return job.state() == state;
        },
        absl::Seconds(5)))
        << v1::JobState_Name(job.state()) << ": " << job.message();
    return job;
  }

  testing::FakeClock clock_;
  GatedJobStore store_;
  JobManager jobs_{&store_, &clock_};
  std::unique_ptr<Cluster> cluster_;
  metrics::Registry* metrics_ = nullptr;  // set before a Restart to see the cluster's metrics
};

}  // namespace trainctl::testing

#endif  // TRAINCTL_TESTS_COORDINATOR_CLUSTER_FIXTURE_H_
