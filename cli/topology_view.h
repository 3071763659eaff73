// `trainctl nodes NODE --topology`: a node's topology probe (trainctl.v1.NodeTopology) as text —
// its GPUs, the link matrix as `nvidia-smi topo -m` names the links, its RDMA ports, whether
// GPUDirect RDMA is possible, the NCCL environment of its worker, its interfaces and what could not
// be probed. Pure: no I/O.
#ifndef TRAINCTL_CLI_TOPOLOGY_VIEW_H_
#define TRAINCTL_CLI_TOPOLOGY_VIEW_H_

#include <string>

#include "absl/time/time.h"
#include "trainctl/v1/job.pb.h"

namespace trainctl::cli {

// The node's topology (node.topology) as sections of aligned text; a node without one says so.
// `now` dates the probe ("3m ago").
std::string RenderNodeTopology(const trainctl::v1::Node& node, absl::Time now);

}  // namespace trainctl::cli

#endif  // TRAINCTL_CLI_TOPOLOGY_VIEW_H_
