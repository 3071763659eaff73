// Cluster and node topology probes: the probe in a register and a worker's answer to ProbeTopology
// are stored off the loop under the session's node name; a bad probe costs the probe, never the
// registration; RefreshTopology asks the node and waits for its answer, or says why not.
#include <future>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "coordinator/cluster.h"
#include "gtest/gtest.h"
#include "tests/coordinator/cluster_fixture.h"

namespace trainctl {
namespace {

namespace v1 = trainctl::v1;
using testing::ClusterTest;
using testing::FakeWorker;
using testing::WaitFor;

v1::NodeTopology Probe(int64_t seconds, const std::string& port_state) {
  v1::NodeTopology t;
  t.set_node("whatever-the-worker-says");
  t.mutable_probe_time()->set_seconds(seconds);
  for (const char* name : {"GPU0", "GPU1"}) {
    v1::TopologyDevice* d = t.add_devices();
    d->set_name(name);
    d->set_is_gpu(true);
  }
  v1::TopologyLink* l = t.add_links();
  l->set_a(0);
  l->set_b(1);
  l->set_type(v1::LINK_TYPE_NVLINK);
  l->set_nvlinks(18);
  v1::RdmaPort* p = t.add_rdma_ports();
  p->set_device("mlx5_0");
  p->set_port(1);
  p->set_state(port_state);
  return t;
}

class ClusterTopologyTest : public ClusterTest {
 protected:
  FakeWorker RegisterWithProbe(const std::string& name, const v1::NodeTopology& probe) {
    FakeWorker w;
    w.session = cluster_->Connect(w.channel);
    v1::WorkerMessage m;
    auto* reg = m.mutable_register_();
    reg->set_node_name(name);
    reg->set_advertise_addr("10.0.0.1");
    reg->mutable_resources()->set_cpu_slots(1);
    reg->set_boot_id("b1");
    *reg->mutable_topology() = probe;
    Send(w, m, /*sequenced=*/false);
    return w;
  }

  std::optional<v1::NodeTopology> Stored(const std::string& node) {
    return store_.GetNodeTopology(node).value();
  }
};

TEST_F(ClusterTopologyTest, TheRegisterProbeIsStoredUnderTheSessionsNode) {
  RegisterWithProbe("node-a", Probe(100, "ACTIVE"));
  cluster_->Flush();
  std::optional<v1::NodeTopology> t = Stored("node-a");
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->node(), "node-a");
  EXPECT_EQ(t->links(0).nvlinks(), 18);
  EXPECT_FALSE(Stored("whatever-the-worker-says").has_value());
}

TEST_F(ClusterTopologyTest, ABadRegisterProbeIsDroppedAndTheNodeStillRegisters) {
  v1::NodeTopology bad = Probe(100, "ACTIVE");
  bad.mutable_links(0)->set_b(7);  // no device 7
  FakeWorker w = RegisterWithProbe("node-a", bad);
  cluster_->Flush();
  EXPECT_EQ(w.channel->Take(v1::CoordinatorMessage::kRegistered).size(), 1u);
  EXPECT_EQ(w.channel->closed(), "");
  ASSERT_EQ(cluster_->ListNodes().size(), 1u);
  EXPECT_EQ(cluster_->ListNodes()[0].state(), "ready");
  EXPECT_FALSE(Stored("node-a").has_value());
}

TEST_F(ClusterTopologyTest, RefreshAsksTheNodeAndReturnsOnceItsAnswerIsStored) {
  FakeWorker w = RegisterWithProbe("node-a", Probe(100, "ACTIVE"));
  cluster_->Flush();
  std::future<absl::Status> refresh = std::async(std::launch::async, [this] {
    return cluster_->RefreshTopology("node-a", absl::Seconds(20));
  });
  ASSERT_TRUE(
      WaitFor([&] { return !w.channel->Take(v1::CoordinatorMessage::kProbeTopology).empty(); },
              absl::Seconds(5)));
  EXPECT_EQ(refresh.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout);
  v1::WorkerMessage answer;
  *answer.mutable_topology() = Probe(200, "DOWN");
  Send(w, answer);
  ASSERT_EQ(refresh.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_TRUE(refresh.get().ok());
  EXPECT_EQ(Stored("node-a")->rdma_ports(0).state(), "DOWN");
  // The answer is acknowledged like any sequenced message.
  const auto acks = w.channel->Take(v1::CoordinatorMessage::kAck);
  ASSERT_FALSE(acks.empty());
  EXPECT_EQ(acks.back().ack().through_seq(), w.seq);
}

TEST_F(ClusterTopologyTest, RefreshSaysWhyItCannotBeHad) {
  EXPECT_EQ(cluster_->RefreshTopology("nobody", absl::Seconds(1)).code(),
            absl::StatusCode::kNotFound);
  FakeWorker w = RegisterWithProbe("node-a", Probe(100, "ACTIVE"));
  cluster_->Flush();
  // Connected, but the worker never answers.
  absl::Status late = cluster_->RefreshTopology("node-a", absl::Milliseconds(50));
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded) << late;
  // Its stream ended: nobody to ask.
  cluster_->Disconnect(w.session);
  cluster_->Flush();
  absl::Status gone = cluster_->RefreshTopology("node-a", absl::Seconds(1));
  EXPECT_EQ(gone.code(), absl::StatusCode::kFailedPrecondition) << gone;
  EXPECT_TRUE(absl::StrContains(gone.message(), "not connected")) << gone;
}

TEST_F(ClusterTopologyTest, ABadAnswerIsRejectedAndNotStored) {
  FakeWorker w = RegisterWithProbe("node-a", Probe(100, "ACTIVE"));
  cluster_->Flush();
  v1::WorkerMessage answer;
  *answer.mutable_topology() = Probe(200, "DOWN");
  answer.mutable_topology()->mutable_links(0)->set_type(static_cast<v1::LinkType>(99));
  Send(w, answer);
  const auto rejects = w.channel->Take(v1::CoordinatorMessage::kReject);
  ASSERT_EQ(rejects.size(), 1u);
  EXPECT_TRUE(absl::StrContains(rejects[0].reject().reason(), "topology.links[0].type"))
      << rejects[0].reject().reason();
  EXPECT_EQ(Stored("node-a")->rdma_ports(0).state(), "ACTIVE");
}

}  // namespace
}  // namespace trainctl
