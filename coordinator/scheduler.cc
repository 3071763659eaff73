#include "coordinator/scheduler.h"

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <ext/pb_ds/assoc_container.hpp>
#include <ext/pb_ds/tree_policy.hpp>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace trainctl {
namespace {

using Selector = std::map<std::string, std::string>;

// A set of nodes ordered by (free slots, index), with order statistics: "how many have at least s
// free slots" and "the k with the fewest free slots among those" cost O(log n) and O(k + log n),
// whatever the slot counts are (a node may claim 2^31-1 slots).
class SlotIndex {
 public:
  void Insert(int node, int free) { set_.insert({free, node}); }
  void Erase(int node, int free) { set_.erase({free, node}); }
  // Moves `node` from `from` free slots to `to`.
  void Lower(int node, int from, int to) {
    Erase(node, from);
    Insert(node, to);
  }

  // Nodes with at least `slots` free slots.
  int CountAtLeast(int slots) const {
    return static_cast<int>(set_.size() - set_.order_of_key({slots, INT_MIN}));
  }

  // Appends the `k` nodes with the fewest free slots among those with at least `slots`, ties by
  // index, in that order. Requires CountAtLeast(slots) >= k.
  void BestFit(int k, int slots, std::vector<int>* out) const {
    for (auto it = set_.lower_bound({slots, INT_MIN}); it != set_.end() && k > 0; ++it, --k) {
      out->push_back(it->second);
    }
  }

 private:
  // (free slots, node index).
  __gnu_pbds::tree<std::pair<int, int>, __gnu_pbds::null_type, std::less<std::pair<int, int>>,
                   __gnu_pbds::rb_tree_tag, __gnu_pbds::tree_order_statistics_node_update>
      set_;
};

// The schedulable nodes carrying one selector (all of them for the empty selector).
struct NodeGroup {
  // Members with total_slots >= s.
  int TotalAtLeast(int s) const {
    return static_cast<int>(totals.end() - std::lower_bound(totals.begin(), totals.end(), s));
  }

  SlotIndex available;       // members not reserved for the blocked head
  std::vector<int> members;  // ascending
  std::vector<int> totals;   // the members' total_slots, ascending
};

// The state of one pass: the nodes' free slots as placements consume them, the reservation, and
// one NodeGroup per distinct selector seen so far, kept in step with both.
class Pass {
 public:
  explicit Pass(std::vector<SchedNode>& nodes)
      : nodes_(nodes),
        free_(nodes.size(), 0),
        reserved_(nodes.size(), false),
        groups_of_node_(nodes.size()) {
    for (const SchedNode& node : nodes_) {
      if (node.schedulable) max_slots_ = std::max(max_slots_, node.total_slots);
    }
    for (size_t i = 0; i < nodes_.size(); ++i) {
      free_[i] = std::clamp(nodes_[i].free_slots, 0, std::max(0, nodes_[i].total_slots));
    }
    AddGroup(Selector());
  }

  // Runs the policy of scheduler.h on one job, next in queue order.
  void Consider(const SchedJob& job, SchedulePass* out) {
    const int k = job.nodes;
    const int slots = job.slots_per_node;
    // Cheap necessary conditions first, so shapes that fit nowhere never look up a selector.
    if (k < 1 || slots < 1 || slots > max_slots_ || groups_[0].TotalAtLeast(slots) < k) {
      out->never_fits.push_back(job.id);
      return;
    }
    NodeGroup& group = job.node_selector.empty() ? groups_[0] : GroupFor(job.node_selector);
    if (group.TotalAtLeast(slots) < k) {
      out->never_fits.push_back(job.id);
      return;
    }
    if (group.available.CountAtLeast(slots) >= k) {
      Place(job, group, out);
    } else if (!has_head_) {
      has_head_ = true;
      out->blocked_head = job.id;
      Reserve(job, group, out);
    }
  }

 private:
  NodeGroup& GroupFor(const Selector& selector) {
    auto it = group_index_.find(selector);
    if (it == group_index_.end()) it = group_index_.emplace(selector, AddGroup(selector)).first;
    return groups_[it->second];
  }

  static bool Matches(const SchedNode& node, const Selector& selector) {
    for (const auto& [key, value] : selector) {
      auto it = node.labels.find(key);
      if (it == node.labels.end() || it->second != value) return false;
    }
    return true;
  }

  // Builds the group of `selector` from the nodes as they are now (free slots, reservation).
  int AddGroup(const Selector& selector) {
    const int id = static_cast<int>(groups_.size());
    NodeGroup& group = groups_.emplace_back();
    for (size_t i = 0; i < nodes_.size(); ++i) {
      const SchedNode& node = nodes_[i];
      if (!node.schedulable || !Matches(node, selector)) continue;
      const int n = static_cast<int>(i);
      group.members.push_back(n);
      groups_of_node_[i].push_back(id);
      group.totals.push_back(node.total_slots);
      if (!reserved_[i]) group.available.Insert(n, free_[i]);
    }
    std::sort(group.totals.begin(), group.totals.end());
    return id;
  }

  void Place(const SchedJob& job, const NodeGroup& group, SchedulePass* out) {
    Placement placement{job.id, {}};
    placement.node_indices.reserve(job.nodes);
    group.available.BestFit(job.nodes, job.slots_per_node, &placement.node_indices);
    for (int n : placement.node_indices) {
      const int left = free_[n] - job.slots_per_node;
      for (int g : groups_of_node_[n]) groups_[g].available.Lower(n, free_[n], left);
      free_[n] = left;
      nodes_[n].free_slots = left;
    }
    out->placements.push_back(std::move(placement));
  }

  // Holds back for the blocked head the nodes that will fit it soonest without run-time estimates:
  // of the nodes that could ever host it, the ones with the most free slots now.
  void Reserve(const SchedJob& job, const NodeGroup& group, SchedulePass* out) {
    std::vector<int> candidates;
    for (int n : group.members) {
      if (nodes_[n].total_slots >= job.slots_per_node) candidates.push_back(n);
    }
    const auto most_free = [this](int a, int b) {
      return free_[a] != free_[b] ? free_[a] > free_[b] : a < b;
    };
    std::partial_sort(candidates.begin(), candidates.begin() + job.nodes, candidates.end(),
                      most_free);
    candidates.resize(job.nodes);
    std::sort(candidates.begin(), candidates.end());
    for (int n : candidates) {
      reserved_[n] = true;
      for (int g : groups_of_node_[n]) groups_[g].available.Erase(n, free_[n]);
    }
    out->reserved_nodes = std::move(candidates);
  }

  std::vector<SchedNode>& nodes_;
  int max_slots_ = 0;  // the largest total_slots of a schedulable node
  std::vector<int> free_;
  std::vector<bool> reserved_;
  std::vector<std::vector<int>> groups_of_node_;  // indices into groups_
  std::vector<NodeGroup> groups_;                 // [0]: the empty selector
  std::map<Selector, int> group_index_;           // non-empty selector -> index into groups_
  bool has_head_ = false;
};

}  // namespace

SchedulePass Schedule(std::vector<SchedNode>& nodes, std::vector<SchedJob> jobs) {
  // Sorting compact keys rather than the jobs keeps the sort in cache on long queues.
  struct QueueKey {
    int priority;
    int64_t order;
    int index;
  };
  std::vector<QueueKey> queue(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    queue[i] = {jobs[i].priority, jobs[i].order, static_cast<int>(i)};
  }
  std::sort(queue.begin(), queue.end(), [](const QueueKey& a, const QueueKey& b) {
    if (a.priority != b.priority) return a.priority > b.priority;
    if (a.order != b.order) return a.order < b.order;
    return a.index < b.index;
  });
  SchedulePass out;
  Pass pass(nodes);
  for (const QueueKey& key : queue) pass.Consider(jobs[key.index], &out);
  return out;
}

}  // namespace trainctl
