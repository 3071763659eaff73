// NodeInventory: answers JobService.ListNodes — the cluster's nodes (Cluster::ListNodes) and, when
// asked, each one's latest topology probe from the store, after asking a node for a fresh probe
// (--refresh) when the request says so. A node that is not connected to this coordinator (gone, or
// not yet back after a restart) is still shown by name with its last stored probe.
//
// A refresh runs a probe on the node (nvidia-smi, sysfs) and every role that may read (viewers
// too) may ask for one, so each node is asked at most once per `min_refresh_interval` (10s by
// default), whoever asks: a refresh within it shows the last probe with a warning saying when the
// last one was asked for.
//
// No gRPC: the service translates; this decides. Thread-safe if the functions and store are.
#ifndef TRAINCTL_COORDINATOR_NODE_INVENTORY_H_
#define TRAINCTL_COORDINATOR_NODE_INVENTORY_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/job_store.h"
#include "trainctl/v1/job.pb.h"

namespace trainctl {

class NodeInventory {
 public:
  // The nodes the cluster knows (Cluster::ListNodes).
  using ListFn = std::function<std::vector<trainctl::v1::Node>()>;
  // Asks a node for a fresh probe and waits for it (Cluster::RefreshTopology).
  using RefreshFn = std::function<absl::Status(const std::string& node, absl::Duration timeout)>;

  static constexpr absl::Duration kDefaultMinRefreshInterval = absl::Seconds(10);

  // Does not take ownership of `store` or `clock` (nullptr: the real clock), which must outlive
  // this. `refresh_timeout`: how long a refresh waits for the node's answer.
  NodeInventory(ListFn list, RefreshFn refresh, JobStore* store, absl::Duration refresh_timeout,
                absl::Duration min_refresh_interval = kDefaultMinRefreshInterval,
                Clock* clock = nullptr)
      : list_(std::move(list)),
        refresh_(std::move(refresh)),
        store_(store),
        refresh_timeout_(refresh_timeout),
        min_refresh_interval_(min_refresh_interval),
        clock_(clock != nullptr ? clock : &real_clock_) {}

  // NOT_FOUND for a `name` that is neither a known node nor one with a stored probe;
  // INVALID_ARGUMENT for a refresh without a name; the store's error. A refresh that fails (the
  // node is not connected, or did not answer in time) is a warning, and the last probe is shown.
  absl::StatusOr<trainctl::v1::ListNodesResponse> List(
      const trainctl::v1::ListNodesRequest& request) const;

 private:
  const ListFn list_;
  const RefreshFn refresh_;
  // Empty when a refresh of `node` may run now (and records it as asked for); otherwise the
  // warning to show instead.
  std::string ClaimRefresh(const std::string& node) const;

  JobStore* const store_;
  const absl::Duration refresh_timeout_;
  const absl::Duration min_refresh_interval_;
  RealClock real_clock_;
  Clock* const clock_;
  mutable absl::Mutex mu_;
  // When each node was last asked for a refresh; entries older than the interval are dropped.
  mutable std::map<std::string, absl::Time> last_refresh_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_NODE_INVENTORY_H_
