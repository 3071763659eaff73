// Cluster with its event ingester: log batches and trainer events are stored off the loop, and a
// worker's messages are acknowledged only once everything up to them is stored; a store that holds
// writes back never costs a worker its lease.
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/cluster.h"
#include "gtest/gtest.h"
#include "tests/coordinator/cluster_fixture.h"

namespace trainctl {
namespace {

namespace v1 = trainctl::v1;
using testing::ClusterTest;
using testing::FakeWorker;
using testing::WaitFor;

class ClusterIngestTest : public ClusterTest {
 protected:
  ~ClusterIngestTest() override { store_.Open(); }  // the cluster stores what it holds as it stops

  v1::WorkerMessage LogMessage(const std::string& job_id, const std::string& text) {
    v1::WorkerMessage m;
    auto* line = m.mutable_logs()->add_lines();
    line->set_job_id(job_id);
    line->set_stream("stdout");
    line->set_text(text);
    return m;
  }

  // Hands `m` to the cluster as the worker's next message without waiting for the store; `done`
  // is set once the cluster lets the stream read on.
  void SendAsync(FakeWorker& w, v1::WorkerMessage m, std::shared_ptr<std::atomic<bool>> done) {
    m.set_seq(++w.seq);
    cluster_->Receive(w.session, std::move(m), [done] { *done = true; });
    (void)cluster_->ListNodes();  // a round trip through the loop: the message was handled
  }

  std::vector<int64_t> Acks(FakeWorker& w) {
    std::vector<int64_t> out;
    for (auto& m : w.channel->Take(v1::CoordinatorMessage::kAck)) {
      out.push_back(m.ack().through_seq());
    }
    return out;
  }

  // A running one-slot job on `w`.
  // A job of `slots` ranks, all on `w`, running.
  std::string RunningJob(FakeWorker& w, int slots = 1) {
    const std::string id = Submit(1, slots);
    const v1::LaunchTask launch = OneLaunch(w);
    Status(w, launch, v1::TASK_STATE_RUNNING, 1000);
    WaitState(id, v1::JOB_STATE_RUNNING);
    launch_ = launch;
    Acks(w);
    return id;
  }

  v1::LaunchTask launch_;
};

TEST_F(ClusterIngestTest, AStatusWaitsForTheLinesBeforeItAndAcksFollowTheStore) {
  FakeWorker a = Register("node-a", 1);
  const std::string id = RunningJob(a);
  store_.Close();
  auto logs_done = std::make_shared<std::atomic<bool>>(false);
  SendAsync(a, LogMessage(id, "last line"), logs_done);
  ASSERT_TRUE(WaitFor([&] { return logs_done->load(); }, absl::Seconds(5)))
      << "a log batch is released once queued, before it is stored";
  v1::WorkerMessage end;
  end.mutable_task_status()->set_task_id(launch_.task_id());
  end.mutable_task_status()->set_job_id(id);
  end.mutable_task_status()->set_state(v1::TASK_STATE_SUCCEEDED);
  auto end_done = std::make_shared<std::atomic<bool>>(false);
  SendAsync(a, end, end_done);

  // The task's end waits behind its last line; nothing is acknowledged.
  EXPECT_FALSE(end_done->load());
  EXPECT_EQ(jobs_.Get(id)->state(), v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(Acks(a).empty());
  EXPECT_TRUE(store_.ListLogs(id, LogQuery())->empty());

  store_.Open();
  cluster_->Flush();
  EXPECT_TRUE(end_done->load());
  EXPECT_EQ(jobs_.Get(id)->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(store_.ListLogs(id, LogQuery())->size(), 1u);
  const std::vector<int64_t> acks = Acks(a);
  ASSERT_FALSE(acks.empty());
  EXPECT_EQ(acks.back(), a.seq);
  for (size_t i = 1; i < acks.size(); ++i) EXPECT_LT(acks[i - 1], acks[i]);
}

TEST_F(ClusterIngestTest, LinesTheStoreCannotTakeAreSentAgainAndStoredOnce) {
  FakeWorker a = Register("node-a", 1);
  const std::string id = RunningJob(a);
  store_.FailNextBatches(1);
  Send(a, LogMessage(id, "kept once"));  // seq n: not stored
  EXPECT_TRUE(Acks(a).empty());
  EXPECT_TRUE(absl::StrContains(a.channel->closed(), "RESOURCE_EXHAUSTED")) << a.channel->closed();
  EXPECT_TRUE(store_.ListLogs(id, LogQuery())->empty());

  // The worker reconnects (same process) and sends it again: now stored, once, and acknowledged.
  const int64_t seq = a.seq;
  FakeWorker again = Register("node-a", 1, {testing::Running(launch_.task_id(), id, 1, 1000)});
  again.seq = seq - 1;
  Send(again, LogMessage(id, "kept once"));
  EXPECT_EQ(store_.ListLogs(id, LogQuery())->size(), 1u);
  const std::vector<int64_t> acks = Acks(again);
  ASSERT_FALSE(acks.empty());
  EXPECT_EQ(acks.back(), seq);
  // Sent once more (the Ack was lost): acknowledged, not stored again.
  again.seq = seq - 1;
  Send(again, LogMessage(id, "kept once"));
  EXPECT_EQ(store_.ListLogs(id, LogQuery())->size(), 1u);
  EXPECT_EQ(Acks(again).back(), seq);
}

TEST_F(ClusterIngestTest, MetricEventsAreStoredAndAcknowledged) {
  FakeWorker a = Register("node-a", 1);
  const std::string id = RunningJob(a);
  for (int step = 1; step <= 3; ++step) {
    v1::WorkerMessage m;
    m.mutable_event()->set_job_id(id);
    m.mutable_event()->set_json(
        absl::StrCat(R"({"type":"metric","step":)", step, R"(,"values":{"loss":0.5}})"));
    Send(a, m);
  }
  v1::WorkerMessage unreadable;
  unreadable.mutable_event()->set_job_id(id);
  unreadable.mutable_event()->set_json("not json");
  Send(a, unreadable);  // dropped, but acknowledged: it would never parse
  EXPECT_EQ(jobs_.Get(id)->progress().step(), 3);
  EXPECT_EQ(Acks(a).back(), a.seq);
}

TEST_F(ClusterIngestTest, TopologyAndBandwidthEventsBecomeTypedJobEvents) {
  FakeWorker a = Register("node-a", 4);
  const std::string id = RunningJob(a, 4);
  auto send = [&](int rank, const std::string& json) {
    v1::WorkerMessage m;
    m.mutable_event()->set_job_id(id);
    m.mutable_event()->set_rank(rank);
    m.mutable_event()->set_json(json);
    Send(a, m);
  };
  send(2, R"({"type":"topology","rank":2,"report":{"rank":2,"host":"node-a","nccl_version":)"
          R"("2.18.3+cuda12.2","nranks":4,"connections":[{"channel":1,"from_rank":2,"to_rank":)"
          R"(3,"transport":"NCCL_TRANSPORT_NET_IB","via":"NET/IB/0/GDRDMA","gdrdma":true}],)"
          R"("gdr_state":"enabled"}})");
  send(0, R"({"type":"bandwidth","report":{"world_size":2,"nodes":1,"backend":"gloo","rows":)"
          R"([{"collective":"all_reduce","bytes":"4096","time_us":20,"algbw_gbps":0.2048,)"
          R"("busbw_gbps":0.2048,"rank_time_us":[19,20]}],"rank_hosts":["node-a","node-a"]}})");
  send(1, R"({"type":"topology","report":{"connections":[{"from_rank":-5}]}})");  // broken
  EXPECT_EQ(Acks(a).back(), a.seq);
  auto events = jobs_.store()->ListEvents(id, 0, 1000);
  ASSERT_TRUE(events.ok()) << events.status();
  const v1::JobEvent* nccl = nullptr;
  const v1::JobEvent* bandwidth = nullptr;
  const v1::JobEvent* warning = nullptr;
  for (const v1::JobEvent& e : *events) {
    if (e.has_nccl()) nccl = &e;
    if (e.has_bandwidth()) bandwidth = &e;
    if (e.has_warning()) warning = &e;
  }
  ASSERT_NE(nccl, nullptr);
  EXPECT_EQ(nccl->nccl().rank(), 2);
  EXPECT_EQ(nccl->nccl().nranks(), 4);
  EXPECT_EQ(nccl->nccl().connections(0).transport(), v1::NCCL_TRANSPORT_NET_IB);
  EXPECT_TRUE(nccl->nccl().connections(0).gdrdma());
  ASSERT_NE(bandwidth, nullptr);
  EXPECT_EQ(bandwidth->bandwidth().rows(0).bytes(), 4096);
  EXPECT_EQ(bandwidth->bandwidth().rows(0).rank_time_us(1), 20);
  ASSERT_NE(warning, nullptr);
  EXPECT_EQ(warning->warning().source(), "rank 1");
  EXPECT_TRUE(absl::StrContains(warning->warning().message(), "connections[0].from_rank"))
      << warning->warning().message();
}

// The lead rank's setup, with the DeepSpeed values only the trainer could fill, is kept; fields
// of the wrong type are left out rather than failing the event.
TEST_F(ClusterIngestTest, SetupEventsKeepWhatTheTrainerFilled) {
  FakeWorker a = Register("node-a", 1);
  const std::string id = RunningJob(a);
  v1::WorkerMessage m;
  m.mutable_event()->set_job_id(id);
  m.mutable_event()->set_json(
      R"({"type":"setup","device":"cpu","backend":"gloo","attention":"sdpa","hidden_size":64,)"
      R"("deepspeed_filled":{"zero_optimization.reduce_bucket_size":4096,"bad":"x"}})");
  Send(a, m);
  EXPECT_EQ(Acks(a).back(), a.seq);
  auto events = jobs_.store()->ListEvents(id, 0, 1000);
  ASSERT_TRUE(events.ok()) << events.status();
  const v1::JobEvent* setup = nullptr;
  for (const v1::JobEvent& e : *events) {
    if (e.has_setup()) setup = &e;
  }
  ASSERT_NE(setup, nullptr);
  EXPECT_EQ(setup->setup().device(), "cpu");
  EXPECT_EQ(setup->setup().backend(), "gloo");
  EXPECT_EQ(setup->setup().hidden_size(), 64);
  ASSERT_EQ(setup->setup().deepspeed_filled_size(), 1);
  const auto bucket =
      setup->setup().deepspeed_filled().find("zero_optimization.reduce_bucket_size");
  ASSERT_NE(bucket, setup->setup().deepspeed_filled().end()) << setup->DebugString();
  EXPECT_EQ(bucket->second, 4096);
}

TEST_F(ClusterIngestTest, AWorkerWhoseMessageTheCoordinatorHoldsKeepsItsLease) {
  FakeWorker a = Register("node-a", 1);
  const std::string id = RunningJob(a);
  FakeWorker b = Register("node-b", 1);  // silent: a witness that leases were checked
  store_.Close();
  auto logs_done = std::make_shared<std::atomic<bool>>(false);
  SendAsync(a, LogMessage(id, "line"), logs_done);
  v1::WorkerMessage end;
  end.mutable_task_status()->set_task_id(launch_.task_id());
  end.mutable_task_status()->set_job_id(id);
  end.mutable_task_status()->set_state(v1::TASK_STATE_SUCCEEDED);
  auto end_done = std::make_shared<std::atomic<bool>>(false);
  SendAsync(a, end, end_done);  // held: node-a's stream reads nothing more

  clock_.Advance(absl::Seconds(30));  // three leases
  auto state = [&](const std::string& name) {
    for (const auto& n : cluster_->ListNodes()) {
      if (n.name() == name) return n.state();
    }
    return std::string();
  };
  ASSERT_TRUE(WaitFor([&] { return state("node-b") == "lost"; }, absl::Seconds(5)));
  EXPECT_EQ(state("node-a"), "ready") << "its silence is the coordinator's doing";

  store_.Open();
  cluster_->Flush();
  EXPECT_TRUE(end_done->load());
  EXPECT_EQ(state("node-a"), "ready");  // released just now: a new lease from here
  clock_.Advance(absl::Seconds(11));
  EXPECT_TRUE(WaitFor([&] { return state("node-a") == "lost"; }, absl::Seconds(5)));
}

TEST_F(ClusterIngestTest, CountsWhatItStoresAndWhatItSchedules) {
  metrics::Registry registry;
  metrics_ = &registry;
  Restart();
  FakeWorker a = Register("node-a", 1);
  const std::string id = RunningJob(a);
  v1::WorkerMessage logs = LogMessage(id, "one");
  *logs.mutable_logs()->add_lines() = logs.logs().lines(0);
  Send(a, logs);
  v1::WorkerMessage metric;
  metric.mutable_event()->set_job_id(id);
  metric.mutable_event()->set_json(R"({"type":"metric","step":1,"values":{"loss":1}})");
  Send(a, metric);
  const std::string text = registry.Render();
  for (const char* want :
       {"trainctl_log_lines_ingested_total 2", "trainctl_events_ingested_total{type=\"metric\"} 1",
        "trainctl_ingest_queue_depth 0", "trainctl_node_lease_misses_total 0",
        "trainctl_scheduler_queue_depth 0", "trainctl_scheduler_pass_duration_seconds_count 1",
        "trainctl_store_commit_duration_seconds_count{op=\"logs\"} 1",
        "trainctl_store_commit_duration_seconds_count{op=\"events\"} 1"}) {
    EXPECT_TRUE(absl::StrContains(text, want)) << want << " not in\n" << text;
  }
  cluster_.reset();  // before the registry it counts into
}

}  // namespace
}  // namespace trainctl
