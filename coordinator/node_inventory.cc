#include "coordinator/node_inventory.h"

#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "google/protobuf/util/time_util.h"

namespace trainctl {

namespace v1 = trainctl::v1;

std::string NodeInventory::ClaimRefresh(const std::string& node) const {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  for (auto it = last_refresh_.begin(); it != last_refresh_.end();) {
    it = now - it->second >= min_refresh_interval_ ? last_refresh_.erase(it) : std::next(it);
  }
  if (auto it = last_refresh_.find(node); it != last_refresh_.end()) {
    return absl::StrCat(node, " was asked for a fresh topology probe ",
                        absl::FormatDuration(absl::Trunc(now - it->second, absl::Seconds(1))),
                        " ago (at most one per node every ",
                        absl::FormatDuration(min_refresh_interval_), "); showing its last probe");
  }
  last_refresh_[node] = now;
  return "";
}

absl::StatusOr<v1::ListNodesResponse> NodeInventory::List(
    const v1::ListNodesRequest& request) const {
  const std::string& name = request.name();
  if (request.refresh() && name.empty()) {
    return absl::InvalidArgumentError("a topology refresh names one node (ListNodesRequest.name)");
  }
  const bool with_topology = request.topology() || request.refresh();
  v1::ListNodesResponse response;
  std::vector<v1::Node> nodes = list_();
  // A node without a session cannot be probed: it says so at once and sends nothing, so the
  // throttle is not what to tell the caller.
  bool connected = false;
  for (const v1::Node& node : nodes)
    connected = connected || (node.name() == name && node.state() == "ready");
  if (request.refresh()) {
    if (std::string throttled = connected ? ClaimRefresh(name) : ""; !throttled.empty()) {
      response.add_warnings(std::move(throttled));
    } else if (absl::Status s = refresh_(name, refresh_timeout_); !s.ok()) {
      response.add_warnings(absl::StrCat("no fresh topology probe from ", name, ": ", s.message(),
                                         "; showing its last probe"));
    }
  }
  for (v1::Node& node : nodes) {
    if (!name.empty() && node.name() != name) continue;
    *response.add_nodes() = std::move(node);
  }
  if (!name.empty() && response.nodes_size() == 0) {
    std::optional<v1::NodeTopology> stored;
    if (with_topology) {
      ASSIGN_OR_RETURN(stored, store_->GetNodeTopology(name));
    }
    if (!stored.has_value())
      return absl::NotFoundError(absl::StrCat("node ", name, " is not known"));
    // A node this coordinator has not heard from since it started: its last probe, for the record.
    v1::Node* node = response.add_nodes();
    node->set_name(name);
    node->set_state("unknown");
    response.add_warnings(
        absl::StrCat("node ", name,
                     " is not connected to this coordinator; its last topology "
                     "probe is from ",
                     google::protobuf::util::TimeUtil::ToString(stored->probe_time())));
    *node->mutable_topology() = std::move(*stored);
    return response;
  }
  if (!with_topology) return response;
  for (v1::Node& node : *response.mutable_nodes()) {
    ASSIGN_OR_RETURN(std::optional<v1::NodeTopology> topology,
                     store_->GetNodeTopology(node.name()));
    if (topology.has_value()) *node.mutable_topology() = std::move(*topology);
  }
  return response;
}

}  // namespace trainctl
