// NodeInventory: answers JobService.ListNodes — the cluster's nodes (Cluster::ListNodes) and, when
// asked, each one's latest topology probe from the store, after asking a node for a fresh probe
// (--refresh) when the request says so. A node that is not connected to this coordinator (gone, or
// not yet back after a restart) is still shown by name with its last stored probe.
//
// No gRPC: the service translates; this decides. Thread-safe if the functions and store are.
#ifndef TRAINCTL_COORDINATOR_NODE_INVENTORY_H_
#define TRAINCTL_COORDINATOR_NODE_INVENTORY_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/job_store.h"
#include "trainctl/v1/job.pb.h"

namespace trainctl {

class NodeInventory {
 public:
  // The nodes the cluster knows (Cluster::ListNodes).
  using ListFn = std::function<std::vector<trainctl::v1::Node>()>;
  // Asks a node for a fresh probe and waits for it (Cluster::RefreshTopology).
  using RefreshFn = std::function<absl::Status(const std::string& node, absl::Duration timeout)>;

  // Does not take ownership of `store`, which must outlive this. `refresh_timeout`: how long a
  // refresh waits for the node's answer.
  NodeInventory(ListFn list, RefreshFn refresh, JobStore* store, absl::Duration refresh_timeout)
      : list_(std::move(list)),
        refresh_(std::move(refresh)),
        store_(store),
        refresh_timeout_(refresh_timeout) {}

  // NOT_FOUND for a `name` that is neither a known node nor one with a stored probe;
  // INVALID_ARGUMENT for a refresh without a name; the store's error. A refresh that fails (the
  // node is not connected, or did not answer in time) is a warning, and the last probe is shown.
  absl::StatusOr<trainctl::v1::ListNodesResponse> List(
      const trainctl::v1::ListNodesRequest& request) const;

 private:
  const ListFn list_;
  const RefreshFn refresh_;
  JobStore* const store_;
  const absl::Duration refresh_timeout_;
};

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_NODE_INVENTORY_H_
