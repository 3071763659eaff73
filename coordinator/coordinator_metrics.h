// The coordinator's metrics that are read when Prometheus scrapes (collect on scrape), not kept up
// to date as things happen: trainctl_build_info, trainctl_jobs{state, kind} from one grouped
// count in the store, and trainctl_nodes{state}, trainctl_cluster_slots and
// trainctl_cluster_free_slots from a snapshot of the nodes. Names in deploy/prometheus/METRICS.md.
#ifndef TRAINCTL_COORDINATOR_COORDINATOR_METRICS_H_
#define TRAINCTL_COORDINATOR_COORDINATOR_METRICS_H_

#include <functional>
#include <vector>

#include "common/metrics.h"
#include "coordinator/job_store.h"
#include "trainctl/v1/job.pb.h"

namespace trainctl {

// The nodes as JobService.ListNodes answers (Cluster::ListNodes).
using NodeSnapshot = std::function<std::vector<trainctl::v1::Node>()>;

// Adds the families and their collectors to `registry`. `store` (not owned) must outlive the
// registry's last Render; `nodes` may be empty (no node series then). Every (state, kind) pair has
// a series, 0 when no job is in it, so that sums and alerts need no absent() cases. When the store
// cannot be read, the job series keep their last values and the error is logged.
// With `db_path` (the SQLite file; "" for none): trainctl_store_bytes (the file and its WAL) and
// trainctl_store_disk_free_bytes (free to unprivileged users on its filesystem), for the alerts
// on the database's growth.
void AddCoordinatorCollectors(metrics::Registry* registry, JobStore* store, NodeSnapshot nodes,
                              const std::string& db_path = "");

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_COORDINATOR_METRICS_H_
