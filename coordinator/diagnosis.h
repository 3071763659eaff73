// The interconnect diagnosis of a job: a rule set over what its nodes have (NodeTopology, probed by
// the workers), what NCCL did with it (each rank's NcclReport) and what the collectives achieved
// (the bandwidth probe's BandwidthReport), drawing findings with a severity, the evidence and the
// remedy. It automates the seed's troubleshooting guide (read NCCL_DEBUG=INFO for the topology;
// NCCL_IB_DISABLE=0 and NCCL_NET_GDR_LEVEL=2 for GPUDirect RDMA).
//
// The rules (Finding.rule):
//   ib_disabled_with_active_ports  NCCL_IB_DISABLE=1 while the node has ACTIVE RDMA ports
//   net_without_gdrdma             NET channels without GDRDMA although a NIC and a GPU share a
//   PCIe
//                                  switch (PIX/PXB) — or no peer-memory module is loaded
//   socket_ifname_bad_interface    NCCL_SOCKET_IFNAME (or the interface NCCL used) is loopback or a
//                                  container bridge
//   intra_node_not_p2p             intra-node connections over SHM or NET on a node with NVLink
//   busbw_below_links              the probe's busbw far below what the slowest link type allows
//   slow_rank / slow_node          a rank (or a node's ranks) much slower than its peers; 3+ ranks
//
// Pure functions of their arguments; thread-compatible.
#ifndef TRAINCTL_COORDINATOR_DIAGNOSIS_H_
#define TRAINCTL_COORDINATOR_DIAGNOSIS_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "trainctl/v1/diagnostics.pb.h"

namespace trainctl {

struct DiagnosisInputs {
  std::vector<trainctl::v1::NodeTopology> nodes;  // the job's nodes, as last probed
  std::vector<trainctl::v1::NcclReport> nccl;     // one per rank (any order), may be empty
  std::optional<trainctl::v1::BandwidthReport> bandwidth;
  std::map<std::string, std::string> job_env;  // JobSpec.env: what the ranks were given
  // The node each rank ran on (the job's placement), when known; otherwise ranks are placed by
  // NcclReport.host / BandwidthReport.rank_hosts matched against node names.
  std::map<int, std::string> rank_nodes;
};

// Thresholds of the rules, named so tests and docs can refer to them.
struct DiagnosisThresholds {
  double busbw_fraction = 0.25;       // busbw below this fraction of the link's figure is a finding
  int64_t busbw_min_bytes = 8 << 20;  // only rows at least this large are judged for bandwidth
  double slow_factor = 1.5;           // a rank slower than this × the median of its peers
};

// The findings, most severe first (then by rule, node, rank). Empty when nothing is wrong or
// nothing is known.
std::vector<trainctl::v1::Finding> Diagnose(const DiagnosisInputs& in,
                                            const DiagnosisThresholds& thresholds = {});

// The bandwidth (GB/s, 1e9 bytes) a collective's busbw can reach over a link of this type: NVLink
// 25 GB/s per link and direction (NV18 → 450), PCIe ~24 (PIX/PXB/PHB/NODE) and ~16 across sockets
// (SYS); 0 for an unknown type. Conservative: real busbw reaches ~80% of these.
double LinkBusBandwidthGBps(trainctl::v1::LinkType type, int nvlinks);

// "critical" | "warning" | "info".
const char* SeverityName(trainctl::v1::Severity severity);

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_DIAGNOSIS_H_
