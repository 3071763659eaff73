// Cluster on its own: fake worker streams (they record what the coordinator sends), an in-memory
// store and a fake clock for leases. The real daemons together: tests/integration/worker_test.cc.
#include "coordinator/cluster.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/coordinator/cluster_fixture.h"

namespace trainctl {
namespace {

namespace v1 = trainctl::v1;
using testing::ClusterTest;
using testing::FakeWorker;
using testing::Running;

TEST_F(ClusterTest, PlacesLaunchesAndFollowsAJobToSuccess) {
  FakeWorker a = Register("node-a", 2);
  const std::string id = Submit(1, 2);
  const v1::LaunchTask launch = OneLaunch(a);
  EXPECT_EQ(launch.job_id(), id);
  EXPECT_EQ(launch.world_size(), 2);
  EXPECT_EQ(launch.slots(), 2);
  EXPECT_EQ(launch.first_rank(), 0);
  EXPECT_EQ(launch.master_addr(), "10.0.0.1");
  EXPECT_EQ(launch.master_port(), 0) << "rank 0's worker picks the port";
  EXPECT_EQ(jobs_.Get(id)->state(), v1::JOB_STATE_SCHEDULED);
  Status(a, launch, v1::TASK_STATE_RUNNING, 29500);
  WaitState(id, v1::JOB_STATE_RUNNING);
  // Every sequenced message is acknowledged once applied.
  auto acks = a.channel->Take(v1::CoordinatorMessage::kAck);
  ASSERT_FALSE(acks.empty());
  EXPECT_EQ(acks.back().ack().through_seq(), a.seq);
  auto nodes = cluster_->ListNodes();
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_EQ(nodes[0].free_slots(), 0);
  ASSERT_EQ(nodes[0].tasks_size(), 1);
  Status(a, launch, v1::TASK_STATE_SUCCEEDED);
  WaitState(id, v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(cluster_->ListNodes()[0].free_slots(), 2);
}

TEST_F(ClusterTest, OtherNodesLaunchOnlyOnceRankZeroReportedItsPort) {
  FakeWorker a = Register("node-a", 1);
  FakeWorker b = Register("node-b", 1);
  const std::string id = Submit(2, 1);
  // Best fit is by free slots then index: node-a hosts node rank 0.
  const v1::LaunchTask first = OneLaunch(a);
  EXPECT_EQ(first.node_rank(), 0);
  EXPECT_TRUE(b.channel->Take(v1::CoordinatorMessage::kLaunch).empty());
  Status(a, first, v1::TASK_STATE_RUNNING, 31337);
  const v1::LaunchTask second = OneLaunch(b);
  EXPECT_EQ(second.node_rank(), 1);
  EXPECT_EQ(second.first_rank(), 1);
  EXPECT_EQ(second.world_size(), 2);
  EXPECT_EQ(second.master_addr(), "10.0.0.1");
  EXPECT_EQ(second.master_port(), 31337);
  EXPECT_EQ(jobs_.Get(id)->state(), v1::JOB_STATE_SCHEDULED) << "until every task runs";
  Status(b, second, v1::TASK_STATE_RUNNING);
  WaitState(id, v1::JOB_STATE_RUNNING);
}

TEST_F(ClusterTest, AFailedTaskStopsTheOthersAndFailsTheJobWithItsReason) {
  FakeWorker a = Register("node-a", 1);
  FakeWorker b = Register("node-b", 1);
  const std::string id = Submit(2, 1);
  const v1::LaunchTask ta = OneLaunch(a);
  Status(a, ta, v1::TASK_STATE_RUNNING, 1000);
  const v1::LaunchTask tb = OneLaunch(b);
  Status(b, tb, v1::TASK_STATE_RUNNING);
  Status(b, tb, v1::TASK_STATE_FAILED, 0, /*failed_rank=*/1, /*exit_code=*/3);
  auto cancels = Cancels(a);
  ASSERT_EQ(cancels.size(), 1u);
  EXPECT_EQ(cancels[0].task_id(), ta.task_id());
  EXPECT_EQ(jobs_.Get(id)->state(), v1::JOB_STATE_RUNNING) << "until node-a's task has ended";
  Status(a, ta, v1::TASK_STATE_CANCELLED);
  const v1::Job job = WaitState(id, v1::JOB_STATE_FAILED);
  EXPECT_TRUE(absl::StrContains(job.message(), "rank 1 on node-b exited with code 3"))
      << job.message();
  EXPECT_TRUE(absl::StrContains(job.message(), "boom: out of memory")) << job.message();
}

TEST_F(ClusterTest, AnExpiredLeaseRestartsTheJobOnOtherNodes) {
  FakeWorker a = Register("node-a", 1);
  const std::string id = Submit(1, 1, /*max_restarts=*/1);
  const v1::LaunchTask first = OneLaunch(a);
  Status(a, first, v1::TASK_STATE_RUNNING, 1000);
  WaitState(id, v1::JOB_STATE_RUNNING);
  FakeWorker b = Register("node-b", 1);
  clock_.Advance(absl::Seconds(6));
  v1::WorkerMessage hb;
  hb.mutable_heartbeat();
  Send(b, hb, false);  // node-b stays alive; node-a says nothing
  clock_.Advance(absl::Seconds(6));
  // node-a is lost: the job restarts (attempt 1) on node-b.
  const v1::LaunchTask second = OneLaunch(b);
  EXPECT_EQ(second.attempt(), 1);
  EXPECT_TRUE(absl::StrContains(a.channel->closed(), "node node-a lost")) << a.channel->closed();
  const v1::Job job = jobs_.Get(id).value();
  EXPECT_EQ(job.attempt(), 1);
  EXPECT_EQ(job.state(), v1::JOB_STATE_SCHEDULED);
  auto nodes = cluster_->ListNodes();
  EXPECT_EQ(nodes[0].state(), "lost");
}

TEST_F(ClusterTest, ALaunchTheWorkerNeverConfirmsFailsTheJob) {
  FakeWorker a = Register("node-a", 1);
  const std::string id = Submit(1, 1);
  OneLaunch(a);
  v1::WorkerMessage hb;
  hb.mutable_heartbeat();
  for (int i = 0; i < 13; ++i) {  // alive, but silent about the task for 130 s
    clock_.Advance(absl::Seconds(10));
    Send(a, hb, false);
  }
  const v1::Job job = WaitState(id, v1::JOB_STATE_FAILED);
  EXPECT_TRUE(absl::StrContains(job.message(), "did not confirm the launch")) << job.message();
  EXPECT_EQ(Cancels(a).size(), 1u);
}

TEST_F(ClusterTest, UserCancelStopsTheTasksThenCancelsTheJob) {
  FakeWorker a = Register("node-a", 2);
  const std::string id = Submit(1, 2);
  const v1::LaunchTask launch = OneLaunch(a);
  Status(a, launch, v1::TASK_STATE_RUNNING, 1000);
  ASSERT_TRUE(jobs_.Cancel(id, "wrong data").ok());
  auto cancels = Cancels(a);
  ASSERT_EQ(cancels.size(), 1u);
  EXPECT_EQ(cancels[0].task_id(), launch.task_id());
  Status(a, launch, v1::TASK_STATE_CANCELLED);
  const v1::Job job = WaitState(id, v1::JOB_STATE_CANCELLED);
  EXPECT_TRUE(absl::StrContains(job.message(), "wrong data")) << job.message();
}

TEST_F(ClusterTest, ARestartedCoordinatorAdoptsReportedTasksAndFailsUnreportedOnes) {
  FakeWorker a = Register("node-a", 1);
  const std::string kept = Submit(1, 1);
  const v1::LaunchTask kept_launch = OneLaunch(a);
  Status(a, kept_launch, v1::TASK_STATE_RUNNING, 1000);
  FakeWorker b = Register("node-b", 1);
  const std::string lost = Submit(1, 1, /*max_restarts=*/0);
  const v1::LaunchTask lost_launch = OneLaunch(b);
  Status(b, lost_launch, v1::TASK_STATE_RUNNING, 1000);
  WaitState(kept, v1::JOB_STATE_RUNNING);
  WaitState(lost, v1::JOB_STATE_RUNNING);

  Restart();
  // node-a's worker comes back with its task; node-b never does.
  FakeWorker a2 = Register("node-a", 1, {Running(kept_launch.task_id(), kept, 1, 1000)});
  EXPECT_TRUE(Cancels(a2).empty()) << "adopted, not cancelled";
  v1::WorkerMessage hb;
  hb.mutable_heartbeat();
  clock_.Advance(absl::Seconds(8));
  Send(a2, hb, false);
  clock_.Advance(absl::Seconds(8));  // past the 15 s grace, within node-a's lease
  const v1::Job failed = WaitState(lost, v1::JOB_STATE_FAILED);
  EXPECT_TRUE(absl::StrContains(failed.message(), "not reported")) << failed.message();
  EXPECT_EQ(jobs_.Get(kept)->state(), v1::JOB_STATE_RUNNING);
  Status(a2, kept_launch, v1::TASK_STATE_SUCCEEDED);
  WaitState(kept, v1::JOB_STATE_SUCCEEDED);
}

TEST_F(ClusterTest, ATaskNobodyRunsAnyMoreIsCancelledOnItsWorker) {
  FakeWorker a = Register("node-a", 1, {Running("job-77.0.0", "job-77", 1)});
  auto cancels = Cancels(a);
  ASSERT_EQ(cancels.size(), 1u);
  EXPECT_EQ(cancels[0].task_id(), "job-77.0.0");
}

TEST_F(ClusterTest, MessagesSentAgainAfterAReconnectAreAppliedOnce) {
  FakeWorker a = Register("node-a", 1);
  const std::string id = Submit(1, 1);
  const v1::LaunchTask launch = OneLaunch(a);
  Status(a, launch, v1::TASK_STATE_RUNNING, 1000);
  const std::vector<v1::RunningTask> holds = {Running(launch.task_id(), id, 1, 1000)};
  v1::WorkerMessage logs;
  auto* line = logs.mutable_logs()->add_lines();
  line->set_job_id(id);
  line->set_stream("stdout");
  line->set_text("hello");
  Send(a, logs);
  // The worker reconnects (same boot) and replays seq 1.
  FakeWorker again = Register("node-a", 1, holds, "b1");
  again.seq = 0;
  Send(again, logs);
  EXPECT_EQ(store_.ListLogs(id, LogQuery())->size(), 1u);
  // A new boot (its old stream gone: the process restarted) starts its seqs again: applied.
  cluster_->Disconnect(again.session);
  FakeWorker reborn = Register("node-a", 1, holds, "b2");
  Send(reborn, logs);
  EXPECT_EQ(store_.ListLogs(id, LogQuery())->size(), 2u);
}

TEST_F(ClusterTest, HigherPriorityRunsFirstWhenASlotFrees) {
  FakeWorker a = Register("node-a", 1);
  // Hold the only slot so both jobs queue.
  const std::string running = Submit(1, 1);
  const v1::LaunchTask hold = OneLaunch(a);
  EXPECT_EQ(hold.job_id(), running);
  Status(a, hold, v1::TASK_STATE_RUNNING, 1000);
  const std::string low = Submit(1, 1, 0, /*priority=*/0);
  const std::string high = Submit(1, 1, 0, /*priority=*/5);
  Status(a, hold, v1::TASK_STATE_SUCCEEDED);
  const v1::LaunchTask next = OneLaunch(a);
  EXPECT_EQ(next.job_id(), high);
  EXPECT_EQ(jobs_.Get(low)->state(), v1::JOB_STATE_PENDING);
}

TEST_F(ClusterTest, AStopLostWhileTheWorkerWasAwayIsSentAgainOnReconnect) {
  FakeWorker a = Register("node-a", 2);
  const std::string id = Submit(1, 2);
  const v1::LaunchTask launch = OneLaunch(a);
  Status(a, launch, v1::TASK_STATE_RUNNING, 1000);
  cluster_->Disconnect(a.session);
  cluster_->Flush();
  ASSERT_TRUE(jobs_.Cancel(id, "stop it").ok());  // the cancel finds no stream to go to
  EXPECT_TRUE(Cancels(a).empty());
  FakeWorker back = Register("node-a", 2, {Running(launch.task_id(), id, 2)});
  back.seq = a.seq;  // the same worker process goes on numbering
  auto cancels = Cancels(back);
  ASSERT_EQ(cancels.size(), 1u);
  EXPECT_EQ(cancels[0].task_id(), launch.task_id());
  Status(back, launch, v1::TASK_STATE_CANCELLED);
  WaitState(id, v1::JOB_STATE_CANCELLED);
}

TEST_F(ClusterTest, SlotsOfATaskStillStoppingOnItsWorkerAreNotFree) {
  FakeWorker a = Register("node-a", 2);
  const std::string first = Submit(1, 2);
  const v1::LaunchTask launch = OneLaunch(a);
  Status(a, launch, v1::TASK_STATE_RUNNING, 1000);
  clock_.Advance(absl::Seconds(11));  // node-a is lost; the job fails
  WaitState(first, v1::JOB_STATE_FAILED);
  // The partition heals: the worker still runs the old task, which is told to stop.
  FakeWorker back = Register("node-a", 2, {Running(launch.task_id(), first, 2)});
  back.seq = a.seq;  // the same worker process goes on numbering
  EXPECT_EQ(Cancels(back).size(), 1u);
  const std::string second = Submit(1, 2);
  EXPECT_TRUE(back.channel->Take(v1::CoordinatorMessage::kLaunch).empty())
      << "placed on slots the old task still holds";
  EXPECT_EQ(cluster_->ListNodes()[0].free_slots(), 0);
  Status(back, launch, v1::TASK_STATE_CANCELLED);
  const v1::LaunchTask next = OneLaunch(back);
  EXPECT_EQ(next.job_id(), second);
}

}  // namespace
}  // namespace trainctl
