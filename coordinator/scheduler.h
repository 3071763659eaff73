// Schedule: one gang-scheduling pass over the waiting jobs, deciding which start now and on which
// nodes. Pure and in-process: no store, no gRPC, no clock, no threads. The caller snapshots its
// nodes and waiting jobs, runs the pass, and applies the placements (and the reservation, only as
// information) to its own state. Keeps no state between calls: concurrent calls are safe as long as
// they do not share a `nodes` vector.
//
// Policy, in order:
//   - the queue is ordered by priority (higher first), then `order` (smaller first), then the
//     position in `jobs`;
//   - a job is a gang: it starts only if `nodes` distinct schedulable nodes carrying its selector
//     each have `slots_per_node` free slots now, and then on the best-fitting ones (fewest free
//     slots, ties by node index) to limit fragmentation;
//   - backfill without run-time estimates (conservative EASY): the first job in queue order that
//     cannot start now becomes the blocked head and gets the nodes it would need once they drain
//     reserved (those with the most free slots); jobs after it may start only on other nodes, so
//     they can never delay it. Only the head gets a reservation; later jobs that do not fit wait;
//   - a job no combination of schedulable nodes could ever host, even empty, is reported in
//     `never_fits` and blocks nobody.
//
// Cost, for J jobs, N nodes and S distinct selectors, independent of the nodes' slot counts (a
// node may claim 2^31-1 slots): O(J log J) to order the queue; O(log N) per job that cannot start,
// plus a selector lookup (O(log S)) for a job that has one; O(N log N) once per distinct selector
// to find its nodes; per placement of k nodes, O(k log N) for each selector group a chosen node
// belongs to. Memory: O(N) per distinct selector.
#ifndef TRAINCTL_COORDINATOR_SCHEDULER_H_
#define TRAINCTL_COORDINATOR_SCHEDULER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace trainctl {

// One worker node as the scheduler sees it.
struct SchedNode {
  std::string name;
  std::map<std::string, std::string> labels;
  int total_slots = 0;  // GPUs, or CPU slots
  // Total minus the slots of the tasks still on it. Read clamped into [0, total_slots].
  int free_slots = 0;
  bool schedulable = true;  // false: dead or draining; never placed on, never reserved
};

// One job waiting for placement (pending, or restarting after a failure).
struct SchedJob {
  std::string id;
  int priority = 0;   // higher first
  int64_t order = 0;  // FIFO key within a priority: smaller was submitted earlier
  // A gang: `nodes` distinct nodes, each with `slots_per_node` free slots, all at once or not at
  // all. A shape below 1 x 1 can never be placed and is reported in never_fits.
  int nodes = 1;
  int slots_per_node = 1;
  std::map<std::string, std::string> node_selector;  // a node must carry every label key=value
};

struct Placement {
  std::string job_id;
  // Indices into the `nodes` passed to Schedule, one per node rank: [i] hosts node_rank i, so [0]
  // hosts rank 0. In best-fit order: fewest free slots (before this placement) first, then index.
  std::vector<int> node_indices;
};

struct SchedulePass {
  std::vector<Placement> placements;  // in the order they were decided (queue order)
  std::string blocked_head;  // the first job in queue order that cannot start now; "" if none
  // Nodes held back for blocked_head, ascending; empty when there is no blocked head.
  std::vector<int> reserved_nodes;
  // Jobs no combination of schedulable nodes could host even if all were empty: too many nodes,
  // too many slots per node, no node matching the selector, or a shape below 1 x 1. Queue order.
  std::vector<std::string> never_fits;
};

// Decides which of `jobs` start now. For each placement, the free_slots of its nodes in `nodes` are
// decremented by the job's slots_per_node (from the clamped value), so the caller's snapshot
// reflects the pass. Nothing else in `nodes` changes. Deterministic: the same input always gives
// the same pass. Job ids are not interpreted and need not be unique.
SchedulePass Schedule(std::vector<SchedNode>& nodes, std::vector<SchedJob> jobs);

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_SCHEDULER_H_
