// GangRunner alone, on one thread with no loop: a node registry with fake streams, an in-memory
// store and a fake clock. What the runner sends is what a worker would get; what it is told is
// what a worker's checked messages would say (the session protocol is Cluster's, cluster_test.cc).
#include "coordinator/gang_runner.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "coordinator/in_memory_job_store.h"
#include "coordinator/job_manager.h"
#include "gtest/gtest.h"
#include "tests/coordinator/cluster_fixture.h"
#include "tests/testing/fake_clock.h"

namespace trainctl {
namespace {

namespace v1 = trainctl::v1;
using testing::FakeChannel;

class GangRunnerTest : public ::testing::Test {
 protected:
  // A registered node with `slots` CPU slots and its stream.
  std::shared_ptr<FakeChannel> AddNode(const std::string& name, int slots) {
    auto channel = std::make_shared<FakeChannel>();
    const int64_t session = ++sessions_;
    nodes_.AddSession(session, channel);
    v1::RegisterWorker reg;
    reg.set_node_name(name);
    reg.set_advertise_addr("10.0.0." + std::to_string(sessions_));
    reg.mutable_resources()->set_cpu_slots(slots);
    reg.set_boot_id("b1");
    EXPECT_TRUE(nodes_.MayRegister(session, reg, clock_.Now()).ok());
    bool was_lost = false;
    nodes_.Register(session, reg, clock_.Now(), &was_lost);
    runner_.NeedSchedule();
    return channel;
  }

  std::string Submit(int nodes, int slots) {
    const v1::JobSpec spec = testing::GangSpec(nodes, slots);
    auto submitted = jobs_.Submit(spec, "");
    EXPECT_TRUE(submitted.ok()) << submitted.status();
    runner_.JobChanged(submitted->job.id());
    runner_.ScheduleIfNeeded();
    return submitted->job.id();
  }

  static std::vector<v1::LaunchTask> Launches(FakeChannel& channel) {
    std::vector<v1::LaunchTask> out;
    for (auto& m : channel.Take(v1::CoordinatorMessage::kLaunch)) out.push_back(m.launch());
    return out;
  }

  absl::Status Report(const std::string& node, const v1::LaunchTask& launch, v1::TaskState state,
                      int port = 0) {
    v1::TaskStatus status;
    status.set_task_id(launch.task_id());
    status.set_job_id(launch.job_id());
    status.set_state(state);
    status.set_master_port(port);
    return runner_.TaskStatus(*nodes_.Find(node), status);
  }

  testing::FakeClock clock_;
  InMemoryJobStore store_;
  JobManager jobs_{&store_, &clock_};
  NodeRegistry nodes_{absl::Seconds(10), nullptr};
  GangRunner runner_{&jobs_, &clock_, &nodes_,
                     GangRunnerOptions{absl::Seconds(15), absl::Minutes(2), nullptr}};
  int64_t sessions_ = 0;
};

// Node rank 0 first; the others once it reported its rendezvous port; the job succeeds when every
// task did.
TEST_F(GangRunnerTest, PlacesLaunchesRankZeroFirstAndFinishesTheGang) {
  auto a = AddNode("node-a", 2);
  auto b = AddNode("node-b", 2);
  const std::string id = Submit(2, 2);
  EXPECT_EQ(runner_.placed_jobs(), 1);
  const std::vector<v1::LaunchTask> on_a = Launches(*a), on_b = Launches(*b);
  ASSERT_EQ(on_a.size() + on_b.size(), 1u);  // node rank 0 only
  const bool zero_on_a = !on_a.empty();
  const v1::LaunchTask zero = zero_on_a ? on_a[0] : on_b[0];
  EXPECT_EQ(zero.node_rank(), 0);
  EXPECT_EQ(zero.world_size(), 4);
  EXPECT_EQ(zero.master_port(), 0);  // its worker picks it
  EXPECT_EQ(zero.spec().name(), "j");
  const std::string zero_node = zero_on_a ? "node-a" : "node-b";
  const std::string other_node = zero_on_a ? "node-b" : "node-a";
  FakeChannel& other = zero_on_a ? *b : *a;
  ASSERT_TRUE(Report(zero_node, zero, v1::TASK_STATE_RUNNING, 29500).ok());
  const std::vector<v1::LaunchTask> second = Launches(other);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].node_rank(), 1);
  EXPECT_EQ(second[0].first_rank(), 2);
  EXPECT_EQ(second[0].master_port(), 29500);
  EXPECT_EQ(second[0].master_addr(), zero.master_addr());
  ASSERT_TRUE(Report(other_node, second[0], v1::TASK_STATE_RUNNING).ok());
  EXPECT_EQ(jobs_.Get(id)->state(), v1::JOB_STATE_RUNNING);

  ASSERT_TRUE(Report(zero_node, zero, v1::TASK_STATE_SUCCEEDED).ok());
  EXPECT_EQ(jobs_.Get(id)->state(), v1::JOB_STATE_RUNNING);  // one task still runs
  ASSERT_TRUE(Report(other_node, second[0], v1::TASK_STATE_SUCCEEDED).ok());
  EXPECT_EQ(jobs_.Get(id)->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(runner_.placed_jobs(), 0);
  EXPECT_EQ(runner_.UsedSlots(*nodes_.Find("node-a")), 0);
}

// A node reports only on what was placed on it.
TEST_F(GangRunnerTest, ANodeMaySpeakOnlyForItsOwnTasksAndRanks) {
  auto a = AddNode("node-a", 1);
  auto b = AddNode("node-b", 1);
  Submit(1, 1);
  std::vector<v1::LaunchTask> launched = Launches(*a);
  const bool on_a = !launched.empty();
  if (!on_a) launched = Launches(*b);
  ASSERT_EQ(launched.size(), 1u);
  WorkerNode& owner = *nodes_.Find(on_a ? "node-a" : "node-b");
  WorkerNode& stranger = *nodes_.Find(on_a ? "node-b" : "node-a");

  v1::WorkerMessage status;
  status.mutable_task_status()->set_task_id(launched[0].task_id());
  EXPECT_TRUE(runner_.MaySpeakFor(owner, status).ok());
  const absl::Status denied = runner_.MaySpeakFor(stranger, status);
  EXPECT_TRUE(absl::IsPermissionDenied(denied)) << denied;
  EXPECT_TRUE(absl::StrContains(denied.message(), launched[0].task_id())) << denied;

  v1::WorkerMessage event;
  event.mutable_event()->set_job_id(launched[0].job_id());
  event.mutable_event()->set_rank(0);
  EXPECT_TRUE(runner_.MaySpeakFor(owner, event).ok());
  event.mutable_event()->set_rank(1);  // the job has one rank
  EXPECT_TRUE(absl::IsPermissionDenied(runner_.MaySpeakFor(owner, event)));
}

// A launch the worker never confirms fails the job at the next tick past launch_timeout.
TEST_F(GangRunnerTest, AnUnconfirmedLaunchFailsTheJobAfterTheTimeout) {
  auto a = AddNode("node-a", 1);
  const std::string id = Submit(1, 1);
  ASSERT_EQ(Launches(*a).size(), 1u);
  clock_.Advance(absl::Minutes(1));
  runner_.Tick();
  EXPECT_EQ(jobs_.Get(id)->state(), v1::JOB_STATE_SCHEDULED);
  clock_.Advance(absl::Minutes(2));
  runner_.Tick();
  const v1::Job job = *jobs_.Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_TRUE(absl::StrContains(job.message(), "did not confirm the launch")) << job.message();
  EXPECT_EQ(a->Take(v1::CoordinatorMessage::kCancel).size(), 1u);
}

// A lost node's tasks fail, and with them the run.
TEST_F(GangRunnerTest, ALostNodeFailsItsRun) {
  auto a = AddNode("node-a", 1);
  const std::string id = Submit(1, 1);
  const std::vector<v1::LaunchTask> launched = Launches(*a);
  ASSERT_EQ(launched.size(), 1u);
  ASSERT_TRUE(Report("node-a", launched[0], v1::TASK_STATE_RUNNING, 29500).ok());
  runner_.NodeLost(*nodes_.Find("node-a"), "node node-a lost: no heartbeat for 10s");
  const v1::Job job = *jobs_.Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_TRUE(absl::StrContains(job.message(), "node node-a lost")) << job.message();
}

}  // namespace
}  // namespace trainctl
