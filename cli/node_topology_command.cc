#include "cli/node_topology_command.h"

#include "absl/time/clock.h"
#include "cli/exit_codes.h"
#include "cli/topology_view.h"
#include "common/json_proto.h"

namespace trainctl::cli {

std::vector<OptionSpec> NodeTopologyOptions() {
  return {{"topology", "", false}, {"refresh", "", false}};
}

absl::Duration RefreshDeadline() { return absl::Seconds(30); }

int RunNodeTopology(const ParsedArgs& args, JobClient& client, bool json, std::ostream& out,
                    std::ostream& err) {
  if (args.positional.size() != 1) {
    return Fail(err,
                absl::InvalidArgumentError(
                    "nodes --topology takes one node name: trainctl nodes NODE --topology"),
                kExitUsage);
  }
  trainctl::v1::ListNodesRequest request;
  request.set_name(args.positional[0]);
  request.set_topology(true);
  request.set_refresh(args.Has("refresh"));
  auto response = client.ListNodes(request);
  if (!response.ok()) return Fail(err, response.status(), UsageOrFailed(response.status()));
  for (const std::string& w : response->warnings()) err << "warning: " << w << '\n';
  if (json) {
    out << MessageToJsonText(*response, /*pretty=*/true) << '\n';
    return kExitOk;
  }
  for (const trainctl::v1::Node& node : response->nodes()) {
    out << RenderNodeTopology(node, absl::Now());
  }
  return kExitOk;
}

}  // namespace trainctl::cli
