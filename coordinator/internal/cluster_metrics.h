// The cluster's metric families (ClusterOptions::metrics), shared by its files.
#ifndef TRAINCTL_COORDINATOR_INTERNAL_CLUSTER_METRICS_H_
#define TRAINCTL_COORDINATOR_INTERNAL_CLUSTER_METRICS_H_

#include "common/metrics.h"
#include "coordinator/cluster.h"

namespace trainctl {

struct Cluster::Metrics {
  explicit Metrics(metrics::Registry* r)
      : pass(r->AddHistogram("trainctl_scheduler_pass_duration_seconds",
                             "Duration of one scheduling pass over the waiting jobs.")
                 .Add({}, metrics::ExponentialBuckets(0.00001, 4, 12))),
        queue_depth(
            r->AddGauge("trainctl_scheduler_queue_depth", "Jobs waiting to be placed.").Add({})),
        lease_misses(r->AddCounter("trainctl_node_lease_misses_total",
                                   "Nodes declared lost because their lease ran out.")
                         .Add({})),
        rejected(r->AddCounter("trainctl_worker_messages_rejected_total",
                               "Worker messages rejected by seq and never applied, by why: "
                               "invalid (failed the checks of common/worker_limits.h) or "
                               "not_placed_here (about a task, job or rank the coordinator did "
                               "not place on the sending node).")) {}
  prometheus::Histogram& pass;
  prometheus::Gauge& queue_depth;
  prometheus::Counter& lease_misses;
  prometheus::Family<prometheus::Counter>& rejected;  // {reason}
};

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_INTERNAL_CLUSTER_METRICS_H_
