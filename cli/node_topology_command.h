// `trainctl nodes NODE --topology [--refresh] [-o json]`: one node's topology probe, as the
// coordinator stored it last (ListNodes with topology and name), or after asking the node for a
// fresh one (--refresh).
#ifndef TRAINCTL_CLI_NODE_TOPOLOGY_COMMAND_H_
#define TRAINCTL_CLI_NODE_TOPOLOGY_COMMAND_H_

#include <ostream>

#include "cli/job_client.h"
#include "common/verb_args.h"

namespace trainctl::cli {

// The verb's options for this form (besides --coordinator and -o).
std::vector<OptionSpec> NodeTopologyOptions();

// Builds the request from `args` (one positional NODE; --refresh implies --topology), asks
// `client`, prints the topology (topology_view.h) or, with `json`, the response as JSON. Exit
// codes as RunTrainctl's (cli/commands.h). A refresh asks with a longer deadline: make `client`
// with RefreshDeadline().
int RunNodeTopology(const ParsedArgs& args, JobClient& client, bool json, std::ostream& out,
                    std::ostream& err);

// How long a client waits for a refreshed answer: the coordinator waits up to its
// --topology_refresh_timeout (15 s by default) for the node.
absl::Duration RefreshDeadline();

}  // namespace trainctl::cli

#endif  // TRAINCTL_CLI_NODE_TOPOLOGY_COMMAND_H_
