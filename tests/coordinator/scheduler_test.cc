#include "coordinator/scheduler.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainctl {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

SchedNode Node(int total, int free, std::map<std::string, std::string> labels = {}) {
  SchedNode node;
  node.total_slots = total;
  node.free_slots = free;
  node.labels = std::move(labels);
  return node;
}

std::vector<SchedNode> Nodes(std::initializer_list<std::pair<int, int>> total_free) {
  std::vector<SchedNode> nodes;
  for (const auto& [total, free] : total_free) {
    nodes.push_back(Node(total, free));
    nodes.back().name = "n" + std::to_string(nodes.size() - 1);
  }
  return nodes;
}

SchedJob Job(std::string id, int nodes, int slots, int priority = 0, int64_t order = 0,
             std::map<std::string, std::string> selector = {}) {
  SchedJob job;
  job.id = std::move(id);
  job.nodes = nodes;
  job.slots_per_node = slots;
  job.priority = priority;
  job.order = order;
  job.node_selector = std::move(selector);
  return job;
}

std::vector<std::string> PlacedIds(const SchedulePass& pass) {
  std::vector<std::string> ids;
  for (const Placement& p : pass.placements) ids.push_back(p.job_id);
  return ids;
}

std::vector<int> NodesOf(const SchedulePass& pass, const std::string& id) {
  for (const Placement& p : pass.placements) {
    if (p.job_id == id) return p.node_indices;
  }
  ADD_FAILURE() << id << " was not placed";
  return {};
}

std::vector<int> FreeSlots(const std::vector<SchedNode>& nodes) {
  std::vector<int> free;
  for (const SchedNode& n : nodes) free.push_back(n.free_slots);
  return free;
}

TEST(SchedulerTest, EmptyInputsGiveAnEmptyPass) {
  std::vector<SchedNode> nodes;
  SchedulePass pass = Schedule(nodes, {});
  EXPECT_THAT(pass.placements, IsEmpty());
  EXPECT_EQ(pass.blocked_head, "");
  EXPECT_THAT(pass.reserved_nodes, IsEmpty());
  EXPECT_THAT(pass.never_fits, IsEmpty());

  nodes = Nodes({{8, 8}});
  pass = Schedule(nodes, {});
  EXPECT_THAT(pass.placements, IsEmpty());
  EXPECT_EQ(nodes[0].free_slots, 8);
}

TEST(SchedulerTest, OrdersByPriorityThenFifoThenInputPosition) {
  // One node with room for three 1-slot jobs out of five: the order decides who starts.
  std::vector<SchedNode> nodes = Nodes({{3, 3}});
  SchedulePass pass = Schedule(
      nodes, {Job("low-early", 1, 1, 0, 1), Job("high-late", 1, 1, 5, 9),
              Job("high-early", 1, 1, 5, 2), Job("mid-a", 1, 1, 3, 4), Job("mid-b", 1, 1, 3, 4)});
  EXPECT_THAT(PlacedIds(pass), ElementsAre("high-early", "high-late", "mid-a"));
  EXPECT_EQ(pass.blocked_head, "mid-b");
  EXPECT_THAT(pass.reserved_nodes, ElementsAre(0));
}

TEST(SchedulerTest, GangIsAllOrNothingAcrossDistinctNodes) {
  // 2 x 4 needs two nodes with 4 free each: node 0 alone has 8 free, which is not enough.
  std::vector<SchedNode> nodes = Nodes({{8, 8}, {8, 3}});
  SchedulePass pass = Schedule(nodes, {Job("gang", 2, 4)});
  EXPECT_THAT(pass.placements, IsEmpty());
  EXPECT_EQ(pass.blocked_head, "gang");
  EXPECT_THAT(pass.never_fits, IsEmpty());
  EXPECT_THAT(FreeSlots(nodes), ElementsAre(8, 3));  // nothing partially taken

  nodes[1].free_slots = 4;
  pass = Schedule(nodes, {Job("gang", 2, 4)});
  EXPECT_THAT(NodesOf(pass, "gang"), ElementsAre(1, 0));
  EXPECT_THAT(FreeSlots(nodes), ElementsAre(4, 0));
}

TEST(SchedulerTest, BestFitTakesFewestFreeSlotsThenLowestIndex) {
  std::vector<SchedNode> nodes = Nodes({{8, 8}, {8, 2}, {8, 5}, {8, 2}, {8, 1}, {8, 3}});
  // Nodes with >= 2 free, fewest first: 1 (2), 3 (2), 5 (3), 2 (5), 0 (8); node 4 is too small.
  SchedulePass pass = Schedule(nodes, {Job("a", 3, 2)});
  EXPECT_THAT(NodesOf(pass, "a"), ElementsAre(1, 3, 5));  // rank 0 on node 1
  EXPECT_THAT(FreeSlots(nodes), ElementsAre(8, 0, 5, 0, 1, 1));
}

TEST(SchedulerTest, LaterJobsSeeEarlierPlacements) {
  std::vector<SchedNode> nodes = Nodes({{8, 8}, {8, 4}});
  SchedulePass pass = Schedule(nodes, {Job("a", 1, 4, 0, 0), Job("b", 1, 4, 0, 1),
                                       Job("c", 1, 4, 0, 2), Job("d", 1, 4, 0, 3)});
  EXPECT_THAT(NodesOf(pass, "a"), ElementsAre(1));  // best fit keeps node 0 whole
  EXPECT_THAT(NodesOf(pass, "b"), ElementsAre(0));
  EXPECT_THAT(NodesOf(pass, "c"), ElementsAre(0));
  EXPECT_EQ(pass.blocked_head, "d");
  EXPECT_THAT(FreeSlots(nodes), ElementsAre(0, 0));
}

TEST(SchedulerTest, FreeSlotsAreDecrementedAndNothingElseChanges) {
  std::vector<SchedNode> nodes = Nodes({{8, 8}, {8, 6}, {4, 4}});
  nodes[0].labels = {{"zone", "a"}};
  const std::vector<SchedNode> before = nodes;
  SchedulePass pass = Schedule(nodes, {Job("a", 2, 3), Job("b", 1, 4)});
  EXPECT_THAT(NodesOf(pass, "a"), ElementsAre(2, 1));
  EXPECT_THAT(NodesOf(pass, "b"), ElementsAre(0));
  EXPECT_THAT(FreeSlots(nodes), ElementsAre(4, 3, 1));
  for (size_t i = 0; i < nodes.size(); ++i) {
    EXPECT_EQ(nodes[i].name, before[i].name);
    EXPECT_EQ(nodes[i].labels, before[i].labels);
    EXPECT_EQ(nodes[i].total_slots, before[i].total_slots);
    EXPECT_EQ(nodes[i].schedulable, before[i].schedulable);
  }
}

TEST(SchedulerTest, SelectorRequiresEveryLabel) {
  std::vector<SchedNode> nodes = {
      Node(8, 8, {{"gpu", "h100"}}), Node(8, 8, {{"gpu", "a100"}, {"zone", "b"}}),
      Node(8, 8, {{"gpu", "h100"}, {"zone", "b"}}), Node(8, 8, {{"gpu", "h100"}, {"zone", "a"}})};
  SchedulePass pass = Schedule(nodes, {Job("h100-b", 1, 8, 0, 0, {{"gpu", "h100"}, {"zone", "b"}}),
                                       Job("h100", 2, 8, 0, 1, {{"gpu", "h100"}}),
                                       Job("a100", 1, 2, 0, 2, {{"gpu", "a100"}})});
  EXPECT_THAT(NodesOf(pass, "h100-b"), ElementsAre(2));
  EXPECT_THAT(NodesOf(pass, "h100"), ElementsAre(0, 3));
  EXPECT_THAT(NodesOf(pass, "a100"), ElementsAre(1));
  EXPECT_EQ(pass.blocked_head, "");
}

TEST(SchedulerTest, SelectorMatchingNoNodeNeverFitsAndBlocksNobody) {
  std::vector<SchedNode> nodes = {Node(8, 8, {{"gpu", "h100"}}), Node(8, 8, {{"gpu", "a100"}})};
  SchedulePass pass = Schedule(
      nodes, {Job("tpu", 1, 1, 9, 0, {{"gpu", "tpu"}}), Job("no-key", 1, 1, 9, 1, {{"rack", "r1"}}),
              Job("two-h100", 2, 1, 9, 2, {{"gpu", "h100"}}), Job("any", 2, 8, 0, 3)});
  EXPECT_THAT(pass.never_fits, ElementsAre("tpu", "no-key", "two-h100"));
  EXPECT_THAT(NodesOf(pass, "any"), ElementsAre(0, 1));
  EXPECT_EQ(pass.blocked_head, "");
  EXPECT_THAT(pass.reserved_nodes, IsEmpty());
}

TEST(SchedulerTest, ShapesNoNodeSetCouldHostNeverFitAndBlockNobody) {
  std::vector<SchedNode> nodes = Nodes({{8, 8}, {8, 8}, {4, 4}});
  SchedulePass pass =
      Schedule(nodes, {Job("too-many-nodes", 4, 1, 9, 0), Job("too-many-slots", 1, 16, 9, 1),
                       Job("big-nodes", 3, 8, 9, 2), Job("zero-nodes", 0, 1, 9, 3),
                       Job("zero-slots", 1, 0, 9, 4), Job("fits", 3, 4, 0, 5)});
  EXPECT_THAT(pass.never_fits, ElementsAre("too-many-nodes", "too-many-slots", "big-nodes",
                                           "zero-nodes", "zero-slots"));
  EXPECT_THAT(NodesOf(pass, "fits"), ElementsAre(2, 0, 1));
  EXPECT_EQ(pass.blocked_head, "");
}

TEST(SchedulerTest, JobThatFitsOnlyOnceNodesDrainIsBlockedNotNeverFits) {
  std::vector<SchedNode> nodes = Nodes({{8, 0}, {8, 1}});
  SchedulePass pass = Schedule(nodes, {Job("whole-cluster", 2, 8)});
  EXPECT_THAT(pass.never_fits, IsEmpty());
  EXPECT_EQ(pass.blocked_head, "whole-cluster");
  EXPECT_THAT(pass.reserved_nodes, ElementsAre(0, 1));
}

TEST(SchedulerTest, DeadNodesAreNeverPlacedOnReservedOrCounted) {
  std::vector<SchedNode> nodes = Nodes({{8, 8}, {8, 2}, {8, 8}});
  nodes[0].schedulable = false;
  nodes[2].schedulable = false;
  // A 3-node job fits only if the dead nodes count: never_fits. The 1 x 8 job can only wait for
  // node 1, so node 1 is its reservation, not a dead node with more free slots.
  SchedulePass pass = Schedule(
      nodes, {Job("three", 3, 1, 0, 0), Job("wide", 1, 8, 0, 1), Job("small", 1, 1, 0, 2)});
  EXPECT_THAT(pass.never_fits, ElementsAre("three"));
  EXPECT_EQ(pass.blocked_head, "wide");
  EXPECT_THAT(pass.reserved_nodes, ElementsAre(1));
  EXPECT_THAT(pass.placements, IsEmpty());  // "small" would delay "wide" on node 1
  EXPECT_THAT(FreeSlots(nodes), ElementsAre(8, 2, 8));
}

TEST(SchedulerTest, BackfillStartsLaterJobsOnNodesNotReservedForTheHead) {
  // Head: 2 x 8. Reserved: the two nodes with the most free slots (1 and 3). Later jobs may use
  // nodes 0 and 2, even those of lower priority.
  std::vector<SchedNode> nodes = Nodes({{8, 3}, {8, 6}, {8, 4}, {8, 6}});
  SchedulePass pass =
      Schedule(nodes, {Job("head", 2, 8, 5, 0), Job("small", 1, 2, 1, 1), Job("pair", 2, 1, 0, 2)});
  EXPECT_EQ(pass.blocked_head, "head");
  EXPECT_THAT(pass.reserved_nodes, ElementsAre(1, 3));
  EXPECT_THAT(NodesOf(pass, "small"), ElementsAre(0));
  EXPECT_THAT(NodesOf(pass, "pair"), ElementsAre(0, 2));
  EXPECT_THAT(FreeSlots(nodes), ElementsAre(0, 6, 3, 6)) << "reserved nodes untouched";
}

TEST(SchedulerTest, BackfillIsRefusedWhenItWouldUseTheHeadsReservedNodes) {
  // Nodes 1 and 2 have room for "later" right now, but they are the head's reservation: starting
  // "later" there would delay the head. Node 0 is too full for it.
  std::vector<SchedNode> nodes = Nodes({{8, 1}, {8, 7}, {8, 6}});
  SchedulePass pass =
      Schedule(nodes, {Job("head", 2, 8, 1, 0), Job("later", 1, 2, 0, 1), Job("tiny", 1, 1, 0, 2)});
  EXPECT_EQ(pass.blocked_head, "head");
  EXPECT_THAT(pass.reserved_nodes, ElementsAre(1, 2));
  EXPECT_THAT(PlacedIds(pass), ElementsAre("tiny"));
  EXPECT_THAT(NodesOf(pass, "tiny"), ElementsAre(0));
  EXPECT_THAT(FreeSlots(nodes), ElementsAre(0, 7, 6));
}

TEST(SchedulerTest, OnlyTheFirstBlockedJobGetsAReservation) {
  std::vector<SchedNode> nodes = Nodes({{8, 4}, {8, 5}, {8, 3}, {8, 2}});
  SchedulePass pass = Schedule(nodes, {Job("head", 1, 8, 0, 0), Job("second", 1, 6, 0, 1),
                                       Job("fill", 3, 2, 0, 2), Job("fill2", 1, 1, 0, 3)});
  EXPECT_EQ(pass.blocked_head, "head");
  EXPECT_THAT(pass.reserved_nodes, ElementsAre(1));  // the most free slots
  // "second" waits without a reservation, so "fill" may take the nodes it would want.
  EXPECT_THAT(NodesOf(pass, "fill"), ElementsAre(3, 2, 0));
  EXPECT_THAT(NodesOf(pass, "fill2"), ElementsAre(2));
  EXPECT_THAT(FreeSlots(nodes), ElementsAre(2, 5, 0, 0));
}

TEST(SchedulerTest, ReservationFollowsTheHeadsSelectorAndNodeSizes) {
  // The head wants 2 x 4 on zone=a. Candidates: nodes 0, 2, 3 (node 4 is zone b; node 1 has only 2
  // slots in all). Most free first, ties by index: 2 (3 free), then 0 and 3 (1 free) -> 0.
  std::vector<SchedNode> nodes = {Node(8, 1, {{"zone", "a"}}), Node(2, 2, {{"zone", "a"}}),
                                  Node(8, 3, {{"zone", "a"}}), Node(8, 1, {{"zone", "a"}}),
                                  Node(8, 8, {{"zone", "b"}})};
  SchedulePass pass =
      Schedule(nodes, {Job("head", 2, 4, 0, 0, {{"zone", "a"}}), Job("b", 1, 8, 0, 1)});
  EXPECT_EQ(pass.blocked_head, "head");
  EXPECT_THAT(pass.reserved_nodes, ElementsAre(0, 2));
  EXPECT_THAT(NodesOf(pass, "b"), ElementsAre(4));
}

TEST(SchedulerTest, OutOfRangeFreeSlotsAreClamped) {
  std::vector<SchedNode> nodes = Nodes({{4, 9}, {4, -3}});
  SchedulePass pass = Schedule(nodes, {Job("a", 1, 4), Job("b", 1, 1)});
  EXPECT_THAT(NodesOf(pass, "a"), ElementsAre(0));
  EXPECT_EQ(pass.blocked_head, "b");
  EXPECT_EQ(nodes[0].free_slots, 0);
}

// A node's slot count costs nothing: a node claiming 2^31-1 slots used to abort the pass
// (std::length_error from per-slot buckets) and 10^9 took ~20 s and ~19 GB.
TEST(SchedulerTest, HugeSlotCountsCostNothing) {
  constexpr int kMax = 2147483647;
  std::vector<SchedNode> nodes = Nodes({{kMax, kMax}, {kMax, 5}, {8, 8}});
  nodes[1].labels = {{"pool", "big"}};
  const absl::Time start = absl::Now();
  SchedulePass pass =
      Schedule(nodes, {Job("huge", 1, kMax), Job("sel", 1, 5, 0, 1, {{"pool", "big"}}),
                       Job("two", 2, 8, 0, 2), Job("never", 2, 1, 0, 3, {{"pool", "big"}})});
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_THAT(NodesOf(pass, "huge"), ElementsAre(0));
  EXPECT_THAT(NodesOf(pass, "sel"), ElementsAre(1));
  EXPECT_THAT(pass.never_fits, ElementsAre("never"));
  EXPECT_EQ(pass.blocked_head, "two");  // nodes 0 and 1 are full now; 2 and 0 could host it
  EXPECT_THAT(pass.reserved_nodes, ElementsAre(0, 2));
  EXPECT_THAT(FreeSlots(nodes), ElementsAre(0, 0, 8));
}

TEST(SchedulerTest, ABillionSlotsPlaceAsFastAsEight) {
  std::vector<SchedNode> nodes = Nodes({{1000000000, 1000000000}, {8, 8}});
  const absl::Time start = absl::Now();
  SchedulePass pass = Schedule(nodes, {Job("a", 1, 8), Job("b", 1, 999999999), Job("c", 2, 1)});
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_THAT(NodesOf(pass, "a"), ElementsAre(1));  // best fit: the node with fewer free slots
  EXPECT_THAT(NodesOf(pass, "b"), ElementsAre(0));
  EXPECT_EQ(pass.blocked_head, "c");
  EXPECT_THAT(FreeSlots(nodes), ElementsAre(1, 0));
}

// ---- Against a reference: the policy written as directly as possible, scanning every node. ----

bool Matches(const SchedNode& node, const std::map<std::string, std::string>& selector) {
  for (const auto& [k, v] : selector) {
    auto it = node.labels.find(k);
    if (it == node.labels.end() || it->second != v) return false;
  }
  return true;
}

SchedulePass ReferenceSchedule(std::vector<SchedNode>& nodes, std::vector<SchedJob> jobs) {
  std::vector<int> free;
  for (const SchedNode& n : nodes) free.push_back(std::clamp(n.free_slots, 0, n.total_slots));
  std::vector<bool> reserved(nodes.size(), false);
  std::vector<int> queue;
  for (size_t i = 0; i < jobs.size(); ++i) queue.push_back(static_cast<int>(i));
  std::stable_sort(queue.begin(), queue.end(), [&](int a, int b) {
    if (jobs[a].priority != jobs[b].priority) return jobs[a].priority > jobs[b].priority;
    return jobs[a].order < jobs[b].order;
  });
  SchedulePass out;
  for (int j : queue) {
    const SchedJob& job = jobs[j];
    std::vector<int> could, now;
    for (size_t n = 0; n < nodes.size(); ++n) {
      if (!nodes[n].schedulable || !Matches(nodes[n], job.node_selector)) continue;
      if (nodes[n].total_slots < job.slots_per_node) continue;
      could.push_back(static_cast<int>(n));
      if (!reserved[n] && free[n] >= job.slots_per_node) now.push_back(static_cast<int>(n));
    }
    if (job.nodes < 1 || job.slots_per_node < 1 || static_cast<int>(could.size()) < job.nodes) {
      out.never_fits.push_back(job.id);
    } else if (static_cast<int>(now.size()) >= job.nodes) {
      std::stable_sort(now.begin(), now.end(), [&](int a, int b) { return free[a] < free[b]; });
      now.resize(job.nodes);
      for (int n : now) nodes[n].free_slots = free[n] -= job.slots_per_node;
      out.placements.push_back({job.id, now});
    } else if (out.blocked_head.empty()) {
      out.blocked_head = job.id;
      std::stable_sort(could.begin(), could.end(), [&](int a, int b) { return free[a] > free[b]; });
      could.resize(job.nodes);
      std::sort(could.begin(), could.end());
      for (int n : could) reserved[n] = true;
      out.reserved_nodes = could;
    }
  }
  return out;
}

std::string Describe(const SchedulePass& pass) {
  std::string s = "head=" + pass.blocked_head + " reserved=";
  for (int n : pass.reserved_nodes) s += std::to_string(n) + ",";
  s += " never=";
  for (const auto& id : pass.never_fits) s += id + ",";
  for (const Placement& p : pass.placements) {
    s += " " + p.job_id + ":";
    for (int n : p.node_indices) s += std::to_string(n) + ",";
  }
  return s;
}

// Random clusters and queues from a fixed seed (std::mt19937 is fully specified; only its raw
// output is used, so the cases are the same on every platform).
class RandomCase {
 public:
  explicit RandomCase(uint32_t seed) : rng_(seed) {}

  int Uniform(int n) { return static_cast<int>(rng_() % static_cast<uint32_t>(n)); }

  std::vector<SchedNode> MakeNodes() {
    std::vector<SchedNode> nodes(2 + Uniform(12));
    for (size_t i = 0; i < nodes.size(); ++i) {
      SchedNode& n = nodes[i];
      n.name = "n" + std::to_string(i);
      n.total_slots = std::vector<int>{1, 2, 4, 8, 8, 8}[Uniform(6)];
      n.free_slots = Uniform(n.total_slots + 1);
      n.schedulable = Uniform(8) != 0;
      if (Uniform(2)) n.labels["gpu"] = Uniform(2) ? "h100" : "a100";
      if (Uniform(2)) n.labels["zone"] = Uniform(2) ? "a" : "b";
    }
    return nodes;
  }

  std::vector<SchedJob> MakeJobs(int count) {
    std::vector<SchedJob> jobs(count);
    for (size_t i = 0; i < jobs.size(); ++i) {
      SchedJob& j = jobs[i];
      j.id = "j" + std::to_string(i);
      j.priority = Uniform(3);
      j.order = Uniform(20);  // duplicates on purpose: ties fall back to input position
      j.nodes = std::vector<int>{1, 1, 1, 2, 2, 3, 4}[Uniform(7)];
      j.slots_per_node = std::vector<int>{1, 1, 2, 2, 4, 4, 8, 16}[Uniform(8)];
      if (Uniform(3) == 0) j.node_selector["gpu"] = Uniform(2) ? "h100" : "a100";
      if (Uniform(5) == 0) j.node_selector["zone"] = Uniform(3) ? "a" : "c";
    }
    return jobs;
  }

 private:
  std::mt19937 rng_;
};

// Placements of jobs queued after the blocked head: the backfilled ones. RandomCase ids are "j<i>".
int Backfilled(const SchedulePass& pass, const std::vector<SchedJob>& jobs) {
  if (pass.blocked_head.empty()) return 0;
  const auto key = [&jobs](const std::string& id) {
    const int i = std::stoi(id.substr(1));
    return std::make_tuple(-jobs[i].priority, jobs[i].order, i);
  };
  int count = 0;
  for (const Placement& p : pass.placements) count += key(p.job_id) > key(pass.blocked_head);
  return count;
}

TEST(SchedulerTest, AgreesWithAReferenceScanOnRandomCases) {
  int heads = 0, placements = 0, never = 0, backfilled = 0;
  for (uint32_t seed = 1; seed <= 2000; ++seed) {
    RandomCase random(seed);
    std::vector<SchedNode> nodes = random.MakeNodes();
    const std::vector<SchedJob> jobs = random.MakeJobs(random.Uniform(30));
    std::vector<SchedNode> expected_nodes = nodes;
    const SchedulePass expected = ReferenceSchedule(expected_nodes, jobs);
    const SchedulePass got = Schedule(nodes, jobs);
    ASSERT_EQ(Describe(got), Describe(expected)) << "seed " << seed;
    ASSERT_EQ(FreeSlots(nodes), FreeSlots(expected_nodes)) << "seed " << seed;
    heads += !got.blocked_head.empty();
    placements += static_cast<int>(got.placements.size());
    never += static_cast<int>(got.never_fits.size());
    backfilled += Backfilled(got, jobs);
  }
  // The cases exercise every outcome, not only one.
  EXPECT_GT(heads, 800);
  EXPECT_GT(placements, 2500);
  EXPECT_GT(never, 5000);
  EXPECT_GT(backfilled, 1000);
}

TEST(SchedulerTest, IsDeterministic) {
  RandomCase random(42);
  std::vector<SchedNode> nodes = random.MakeNodes();
  const std::vector<SchedJob> jobs = random.MakeJobs(60);
  std::vector<SchedNode> nodes2 = nodes;
  const SchedulePass first = Schedule(nodes, jobs);
  const SchedulePass second = Schedule(nodes2, jobs);
  EXPECT_EQ(Describe(first), Describe(second));
  EXPECT_EQ(FreeSlots(nodes), FreeSlots(nodes2));
}

}  // namespace
}  // namespace trainctl
