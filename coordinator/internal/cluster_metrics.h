// The worker sessions' metric families (ClusterOptions::metrics), shared by the cluster's files;
// the scheduler's are GangRunner's.
#ifndef TRAINCTL_COORDINATOR_INTERNAL_CLUSTER_METRICS_H_
#define TRAINCTL_COORDINATOR_INTERNAL_CLUSTER_METRICS_H_

#include "common/metrics.h"

namespace trainctl::internal {

struct ClusterMetrics {
  explicit ClusterMetrics(metrics::Registry* r)
      : lease_misses(r->AddCounter("trainctl_node_lease_misses_total",
                                   "Nodes declared lost because their lease ran out.")
                         .Add({})),
        rejected(r->AddCounter("trainctl_worker_messages_rejected_total",
                               "Worker messages rejected by seq and never applied, by why: "
                               "invalid (failed the checks of common/worker_limits.h) or "
                               "not_placed_here (about a task, job or rank the coordinator did "
                               "not place on the sending node).")) {}
  prometheus::Counter& lease_misses;
  prometheus::Family<prometheus::Counter>& rejected;  // {reason}
};

}  // namespace trainctl::internal

#endif  // TRAINCTL_COORDINATOR_INTERNAL_CLUSTER_METRICS_H_
