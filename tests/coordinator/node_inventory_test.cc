// NodeInventory (ListNodes): nodes with their stored topology probes, a refresh that comes or does
// not, a node known only from its stored probe, and bad requests. In-memory store, fake functions.
#include "coordinator/node_inventory.h"

#include "absl/strings/match.h"
#include "coordinator/in_memory_job_store.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_clock.h"

namespace trainctl {
namespace {

namespace v1 = trainctl::v1;

class NodeInventoryTest : public ::testing::Test {
 protected:
  NodeInventoryTest()
      : inventory_([this] { return nodes_; },
                   [this](const std::string& node, absl::Duration timeout) {
                     refreshed_.push_back(node);
                     timeout_ = timeout;
                     if (refresh_result_.ok()) Put(node, ++probes_);
                     return refresh_result_;
                   },
                   &store_, absl::Seconds(7)) {
    for (const char* name : {"gpu-1", "gpu-2"}) {
      v1::Node n;
      n.set_name(name);
      n.set_state("ready");
      nodes_.push_back(n);
    }
  }

  void Put(const std::string& node, int64_t seconds) {
    v1::NodeTopology t;
    t.set_node(node);
    t.mutable_probe_time()->set_seconds(seconds);
    ASSERT_TRUE(store_.PutNodeTopology(t).ok());
  }

  InMemoryJobStore store_;
  std::vector<v1::Node> nodes_;
  std::vector<std::string> refreshed_;
  absl::Duration timeout_;
  absl::Status refresh_result_;
  int64_t probes_ = 100;
  NodeInventory inventory_;
};

TEST_F(NodeInventoryTest, TopologyOnlyWhenAskedAndByName) {
  Put("gpu-1", 50);
  v1::ListNodesRequest request;
  auto all = inventory_.List(request);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->nodes_size(), 2);
  EXPECT_FALSE(all->nodes(0).has_topology());

  request.set_topology(true);
  all = inventory_.List(request);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->nodes(0).topology().probe_time().seconds(), 50);
  EXPECT_FALSE(all->nodes(1).has_topology());  // gpu-2 never sent one

  request.set_name("gpu-2");
  auto one = inventory_.List(request);
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->nodes_size(), 1);
  EXPECT_EQ(one->nodes(0).name(), "gpu-2");
  EXPECT_TRUE(refreshed_.empty());
}

TEST_F(NodeInventoryTest, RefreshAsksTheNodeThenReadsItsNewProbe) {
  Put("gpu-1", 50);
  v1::ListNodesRequest request;
  request.set_name("gpu-1");
  request.set_refresh(true);  // implies topology
  auto got = inventory_.List(request);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(refreshed_, std::vector<std::string>{"gpu-1"});
  EXPECT_EQ(timeout_, absl::Seconds(7));
  EXPECT_EQ(got->warnings_size(), 0);
  EXPECT_EQ(got->nodes(0).topology().probe_time().seconds(), 101);
}

TEST_F(NodeInventoryTest, ARefreshThatDoesNotComeShowsTheLastProbeWithAWarning) {
  Put("gpu-1", 50);
  refresh_result_ = absl::DeadlineExceededError("node gpu-1 sent no topology probe within 7s");
  v1::ListNodesRequest request;
  request.set_name("gpu-1");
  request.set_refresh(true);
  auto got = inventory_.List(request);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->warnings_size(), 1);
  EXPECT_TRUE(absl::StrContains(got->warnings(0), "no fresh topology probe from gpu-1"))
      << got->warnings(0);
  EXPECT_TRUE(absl::StrContains(got->warnings(0), "within 7s"));
  EXPECT_EQ(got->nodes(0).topology().probe_time().seconds(), 50);
}

TEST_F(NodeInventoryTest, ANodeNotConnectedIsShownFromItsStoredProbe) {
  Put("gone", 42);
  v1::ListNodesRequest request;
  request.set_name("gone");
  request.set_topology(true);
  auto got = inventory_.List(request);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->nodes_size(), 1);
  EXPECT_EQ(got->nodes(0).state(), "unknown");
  EXPECT_EQ(got->nodes(0).topology().probe_time().seconds(), 42);
  ASSERT_EQ(got->warnings_size(), 1);
  EXPECT_TRUE(absl::StrContains(got->warnings(0), "not connected"));
  // Without topology, or never probed: not known.
  request.set_topology(false);
  EXPECT_EQ(inventory_.List(request).status().code(), absl::StatusCode::kNotFound);
  request.set_name("never");
  request.set_topology(true);
  EXPECT_EQ(inventory_.List(request).status().code(), absl::StatusCode::kNotFound);
}

// Any caller with read access (a viewer too) may ask for a refresh, so each node is probed again
// at most once per interval: a refresh within it shows the last probe and says when it was asked.
TEST_F(NodeInventoryTest, RefreshesOfOneNodeAreAtMostOnePerInterval) {
  testing::FakeClock clock;
  int calls = 0;
  NodeInventory inventory([this] { return nodes_; },
                          [&](const std::string& node, absl::Duration) {
                            ++calls;
                            Put(node, ++probes_);
                            return absl::OkStatus();
                          },
                          &store_, absl::Seconds(7), absl::Seconds(10), &clock);
  v1::ListNodesRequest request;
  request.set_name("gpu-1");
  request.set_refresh(true);
  auto first = inventory.List(request);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(first->warnings_size(), 0);

  clock.Advance(absl::Seconds(3));
  auto again = inventory.List(request);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(calls, 1) << "the node is not probed again within 10s";
  ASSERT_EQ(again->warnings_size(), 1);
  EXPECT_EQ(again->warnings(0),
            "gpu-1 was asked for a fresh topology probe 3s ago (at most one per node every 10s); "
            "showing its last probe");
  EXPECT_EQ(again->nodes(0).topology().probe_time().seconds(), 101) << "the first refresh's probe";

  request.set_name("gpu-2");  // another node has its own interval
  ASSERT_TRUE(inventory.List(request).ok());
  EXPECT_EQ(calls, 2);

  clock.Advance(absl::Seconds(7));
  request.set_name("gpu-1");
  auto later = inventory.List(request);
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(later->warnings_size(), 0);
}

TEST_F(NodeInventoryTest, ARefreshNamesOneNode) {
  v1::ListNodesRequest request;
  request.set_refresh(true);
  EXPECT_EQ(inventory_.List(request).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(refreshed_.empty());
}

}  // namespace
}  // namespace trainctl
