#include "coordinator/diagnosis.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/diagnostics_reports.h"

namespace trainctl {
namespace {

namespace v1 = trainctl::v1;

constexpr int kMaxEvidence = 6;  // lines of evidence per finding; the rest are counted

// What the rules need to know about one node of the job.
struct NodeFacts {
  const v1::NodeTopology* topology = nullptr;
  std::string name;
  std::vector<const v1::NcclReport*> reports;  // its ranks' NCCL reports
  std::set<int> ranks;
};

class Diagnosis {
 public:
  Diagnosis(const DiagnosisInputs& in, const DiagnosisThresholds& t) : in_(in), t_(t) {
    PlaceRanks();
  }

  std::vector<v1::Finding> Run() {
    for (NodeFacts& node : nodes_) {
      IbDisabled(node);
      NetWithoutGdr(node);
      SocketInterface(node);
      IntraNodeNotP2p(node);
    }
    BusBandwidth();
    SlowRanks();
    std::stable_sort(findings_.begin(), findings_.end(), [](const auto& a, const auto& b) {
      if (a.severity() != b.severity()) return a.severity() > b.severity();
      if (a.rule() != b.rule()) return a.rule() < b.rule();
      if (a.node() != b.node()) return a.node() < b.node();
      return a.rank() < b.rank();
    });
    return std::move(findings_);
  }

 private:
  // Nodes from the topologies (and any host only the reports name), ranks onto them.
  void PlaceRanks() {
    for (const v1::NodeTopology& topology : in_.nodes) {
      nodes_.push_back(NodeFacts{&topology, topology.node(), {}, {}});
    }
    for (const auto& [rank, node] : in_.rank_nodes) rank_node_[rank] = node;
    if (in_.bandwidth.has_value()) {
      for (int r = 0; r < in_.bandwidth->rank_hosts_size(); ++r) {
        rank_node_.emplace(r, NodeNameForHost(in_.bandwidth->rank_hosts(r)));
      }
    }
    for (const v1::NcclReport& report : in_.nccl) {
      auto it = rank_node_.find(report.rank());
      const std::string node = it != rank_node_.end() ? it->second : NodeNameForHost(report.host());
      rank_node_[report.rank()] = node;
      NodeFacts* facts = FindNode(node);
      if (facts == nullptr) {
        nodes_.push_back(NodeFacts{nullptr, node, {}, {}});
        facts = &nodes_.back();
      }
      facts->reports.push_back(&report);
    }
    for (const auto& [rank, node] : rank_node_) {
      if (NodeFacts* facts = FindNode(node)) facts->ranks.insert(rank);
    }
  }

  // A host name as the trainer saw it, matched to a node name: equal, or one the other's first
  // label ("node-a" vs "node-a.cluster"); a single-node job's only node otherwise.
  std::string NodeNameForHost(const std::string& host) const {
    for (const v1::NodeTopology& t : in_.nodes) {
      if (t.node() == host) return t.node();
    }
    const std::string short_host = host.substr(0, host.find('.'));
    for (const v1::NodeTopology& t : in_.nodes) {
      if (t.node().substr(0, t.node().find('.')) == short_host) return t.node();
    }
    if (in_.nodes.size() == 1) return in_.nodes[0].node();
    return host;
  }

  NodeFacts* FindNode(const std::string& name) {
    for (NodeFacts& n : nodes_) {
      if (n.name == name) return &n;
    }
    return nullptr;
  }

  bool MultiNode() const {
    std::set<std::string> names;
    for (const auto& [rank, node] : rank_node_) names.insert(node);
    if (names.size() > 1 || in_.nodes.size() > 1) return true;
    for (const v1::NcclReport& r : in_.nccl) {
      if (r.nnodes() > 1) return true;
    }
    return false;
  }

  // The value a variable had for the node's ranks, and where it came from: the job's env, what
  // NCCL logged as set by the environment, or the worker's environment.
  std::pair<std::string, std::string> Env(const NodeFacts& node, const std::string& key) const {
    if (auto it = in_.job_env.find(key); it != in_.job_env.end()) {
      return {it->second, "the job's env"};
    }
    for (const v1::NcclReport* r : node.reports) {
      if (auto it = r->env().find(key); it != r->env().end()) {
        return {it->second, absl::StrCat("NCCL's log of rank ", r->rank())};
      }
    }
    if (node.topology != nullptr) {
      if (auto it = node.topology->nccl_env().find(key); it != node.topology->nccl_env().end()) {
        return {it->second, absl::StrCat("the worker's environment on ", node.name)};
      }
    }
    return {"", ""};
  }

  v1::Finding& Add(const std::string& rule, v1::Severity severity, const std::string& node,
                   int rank, std::string summary, std::string remedy) {
    v1::Finding& f = findings_.emplace_back();
    f.set_rule(rule);
    f.set_severity(severity);
    f.set_node(node);
    f.set_rank(rank);
    f.set_summary(std::move(summary));
    f.set_remedy(std::move(remedy));
    return f;
  }

  static void Evidence(v1::Finding& f, const std::vector<std::string>& lines) {
    for (size_t i = 0; i < lines.size() && i < kMaxEvidence; ++i) f.add_evidence(lines[i]);
    if (lines.size() > kMaxEvidence) {
      f.add_evidence(absl::StrCat("… and ", lines.size() - kMaxEvidence, " more"));
    }
  }

  static std::string DeviceName(const v1::NodeTopology& t, int index) {
    if (index < 0 || index >= t.devices_size()) return absl::StrCat("#", index);
    const v1::TopologyDevice& d = t.devices(index);
    if (d.nic_device().empty() || d.nic_device() == d.name()) return d.name();
    return absl::StrCat(d.name(), " (", d.nic_device(), ")");
  }

  static std::string LinkName(const v1::TopologyLink& link) {
    return LinkTypeName(link.type(), link.nvlinks());
  }

  static bool IsGpu(const v1::NodeTopology& t, int index) {
    return index >= 0 && index < t.devices_size() && t.devices(index).is_gpu();
  }

  // ---- the rules ----

  void IbDisabled(const NodeFacts& node) {
    if (node.topology == nullptr) return;
    std::vector<std::string> evidence;
    bool disabled = false;
    for (const v1::NcclReport* r : node.reports) {
      if (r->ib_disabled()) {
        disabled = true;
        evidence.push_back(absl::StrCat("rank ", r->rank(), ": NCCL reports NCCL_IB_DISABLE=1"));
        break;
      }
    }
    const auto [value, source] = Env(node, "NCCL_IB_DISABLE");
    if (absl::StripAsciiWhitespace(value) == "1") {
      disabled = true;
      evidence.insert(evidence.begin(), absl::StrCat("NCCL_IB_DISABLE=1 from ", source));
    }
    if (!disabled) return;
    bool active = false;
    for (const v1::RdmaPort& p : node.topology->rdma_ports()) {
      if (absl::AsciiStrToUpper(p.state()) != "ACTIVE") continue;
      active = true;
      evidence.push_back(absl::StrCat(p.device(), " port ", p.port(), ": ACTIVE, ", p.rate(), ", ",
                                      p.link_layer()));
    }
    if (!active) return;
    const bool multi = MultiNode();
    v1::Finding& f =
        Add("ib_disabled_with_active_ports", multi ? v1::SEVERITY_CRITICAL : v1::SEVERITY_WARNING,
            node.name, -1,
            absl::StrCat("NCCL_IB_DISABLE=1 on ", node.name, " while it has active RDMA ports: ",
                         multi ? "inter-node traffic goes over TCP sockets"
                               : "a multi-node job would use TCP sockets"),
            "set NCCL_IB_DISABLE=0 in the job's env (env: {NCCL_IB_DISABLE: \"0\"}) "
            "and leave it unset in the worker's environment");
    Evidence(f, evidence);
  }

  void NetWithoutGdr(const NodeFacts& node) {
    if (node.topology == nullptr) return;
    int net = 0;
    int without = 0;
    std::string example;
    for (const v1::NcclReport* r : node.reports) {
      for (const v1::NcclConnection& c : r->connections()) {
        if (c.transport() != v1::NCCL_TRANSPORT_NET_IB) continue;
        ++net;
        if (c.gdrdma()) continue;
        ++without;
        if (example.empty()) {
          example = absl::StrCat("rank ", r->rank(), " channel ", c.channel(), ": ", c.from_rank(),
                                 " -> ", c.to_rank(), " via ", c.via());
        }
      }
    }
    if (without == 0) return;
    const v1::NodeTopology& t = *node.topology;
    std::vector<std::string> shared;
    for (const v1::TopologyLink& link : t.links()) {
      if (link.type() != v1::LINK_TYPE_PIX && link.type() != v1::LINK_TYPE_PXB) continue;
      if (IsGpu(t, link.a()) == IsGpu(t, link.b())) continue;  // one GPU and one NIC
      shared.push_back(absl::StrCat(DeviceName(t, link.a()), " <-> ", DeviceName(t, link.b()), ": ",
                                    LinkName(link)));
    }
    if (shared.empty()) return;  // no shared PCIe switch: GDRDMA would not help much
    std::vector<std::string> evidence = {
        absl::StrCat(without, " of ", net, " NET/IB connections without GDRDMA, e.g. ", example)};
    std::string remedy =
        "set NCCL_NET_GDR_LEVEL=2 (PXB: GPUDirect RDMA when the NIC and the GPU share PCIe "
        "switches) and NCCL_IB_DISABLE=0 in the job's env";
    if (t.peer_memory_module().empty()) {
      evidence.push_back(absl::StrCat("no peer-memory module loaded on ", node.name,
                                      " (nvidia_peermem / nv_peer_mem)"));
      remedy += absl::StrCat("; load nvidia_peermem on ", node.name, " (modprobe nvidia_peermem)");
    }
    const auto [level, source] = Env(node, "NCCL_NET_GDR_LEVEL");
    if (!level.empty())
      evidence.push_back(absl::StrCat("NCCL_NET_GDR_LEVEL=", level, " from ", source));
    evidence.insert(evidence.end(), shared.begin(), shared.end());
    v1::Finding& f = Add("net_without_gdrdma", v1::SEVERITY_WARNING, node.name, -1,
                         absl::StrCat("NET channels on ", node.name,
                                      " run without GPUDirect RDMA although NICs and GPUs share a "
                                      "PCIe switch"),
                         remedy);
    Evidence(f, evidence);
  }

  // "loopback", "bridge" or "" for an interface name, using the node's interface kinds.
  static std::string BadInterfaceKind(const v1::NodeTopology* t, const std::string& name) {
    if (t != nullptr) {
      if (auto it = t->interfaces().find(name); it != t->interfaces().end()) {
        if (absl::StrContains(it->second, "loopback")) return "loopback";
        if (absl::StrContains(it->second, "bridge")) return "bridge";
      }
    }
    if (name == "lo" || absl::StartsWith(name, "lo:")) return "loopback";
    for (const char* prefix : {"docker", "br-", "virbr", "veth", "cni", "podman"}) {
      if (absl::StartsWith(name, prefix)) return "bridge";
    }
    return "";
  }

  std::string DataInterface(const NodeFacts& node) const {
    if (node.topology == nullptr) return "";
    for (const auto& [name, kind] : node.topology->interfaces()) {
      if (absl::StrContains(kind, "up") &&
          (absl::StrContains(kind, "ether") || absl::StrContains(kind, "ib")) &&
          BadInterfaceKind(node.topology, name).empty()) {
        return name;
      }
    }
    return "";
  }

  void SocketInterface(const NodeFacts& node) {
    std::vector<std::string> evidence;
    const auto [value, source] = Env(node, "NCCL_SOCKET_IFNAME");
    const std::string v(absl::StripAsciiWhitespace(value));
    if (!v.empty() && v[0] != '^') {  // "^a,b" excludes; "=eth0" is exact; "eth" a prefix
      for (absl::string_view part : absl::StrSplit(v, ',', absl::SkipEmpty())) {
        const std::string name(absl::StripPrefix(absl::StripAsciiWhitespace(part), "="));
        const std::string kind = BadInterfaceKind(node.topology, name);
        if (!kind.empty()) {
          evidence.push_back(absl::StrCat("NCCL_SOCKET_IFNAME=", v, " from ", source, ": ", name,
                                          " is a ", kind, " interface"));
        }
      }
    }
    for (const v1::NcclReport* r : node.reports) {
      std::vector<std::string> used(r->nics().begin(), r->nics().end());
      used.push_back(r->bootstrap_interface());
      for (const std::string& nic : used) {
        const std::string name = nic.substr(0, nic.find(':'));
        const std::string kind = name.empty() ? "" : BadInterfaceKind(node.topology, name);
        if (!kind.empty()) {
          evidence.push_back(
              absl::StrCat("rank ", r->rank(), ": NCCL uses ", nic, " (", kind, ")"));
        }
      }
    }
    if (evidence.empty()) return;
    const bool multi = MultiNode();
    const std::string data = DataInterface(node);
    v1::Finding& f =
        Add("socket_ifname_bad_interface", multi ? v1::SEVERITY_CRITICAL : v1::SEVERITY_WARNING,
            node.name, -1,
            absl::StrCat(
                "NCCL's sockets on ", node.name, " use a loopback or container-bridge interface",
                multi ? ": other nodes cannot reach it, or traffic takes the wrong network" : ""),
            data.empty()
                ? "set NCCL_SOCKET_IFNAME to the node's data interface, or exclude the others: "
                  "NCCL_SOCKET_IFNAME=^lo,docker0"
                : absl::StrCat("set NCCL_SOCKET_IFNAME=", data,
                               " (the node's data interface), or exclude the others: "
                               "NCCL_SOCKET_IFNAME=^lo,docker0"));
    Evidence(f, evidence);
  }

  void IntraNodeNotP2p(const NodeFacts& node) {
    if (node.topology == nullptr) return;
    std::string nvlink;
    for (const v1::TopologyLink& link : node.topology->links()) {
      if (link.type() == v1::LINK_TYPE_NVLINK && IsGpu(*node.topology, link.a()) &&
          IsGpu(*node.topology, link.b())) {
        nvlink = absl::StrCat(DeviceName(*node.topology, link.a()), " <-> ",
                              DeviceName(*node.topology, link.b()), ": ", LinkName(link));
        break;
      }
    }
    if (nvlink.empty()) return;
    std::vector<std::string> evidence;
    int count = 0;
    for (const v1::NcclReport* r : node.reports) {
      for (const v1::NcclConnection& c : r->connections()) {
        const bool shm = c.transport() == v1::NCCL_TRANSPORT_SHM;
        const bool net = c.transport() == v1::NCCL_TRANSPORT_NET_IB ||
                         c.transport() == v1::NCCL_TRANSPORT_NET_SOCKET ||
                         c.transport() == v1::NCCL_TRANSPORT_NET_OTHER;
        if (!shm && !(net && !c.inter_node() && node.ranks.count(c.to_rank()) > 0 &&
                      node.ranks.count(c.from_rank()) > 0)) {
          continue;
        }
        if (++count <= 3) {
          evidence.push_back(absl::StrCat("rank ", r->rank(), " channel ", c.channel(), ": ",
                                          c.from_rank(), " -> ", c.to_rank(), " via ", c.via()));
        }
      }
    }
    if (count == 0) return;
    evidence.insert(evidence.begin(), nvlink);
    for (const char* key : {"NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "CUDA_VISIBLE_DEVICES"}) {
      const auto [value, source] = Env(node, key);
      if (!value.empty()) evidence.push_back(absl::StrCat(key, "=", value, " from ", source));
    }
    v1::Finding& f = Add(
        "intra_node_not_p2p", v1::SEVERITY_WARNING, node.name, -1,
        absl::StrCat(count, " intra-node connection(s) on ", node.name,
                     " go over SHM or the network although its GPUs have NVLink"),
        "let NCCL use P2P over NVLink: unset NCCL_P2P_DISABLE and NCCL_P2P_LEVEL, give each rank "
        "whole GPUs, and run containers with a shared IPC namespace (--ipc=host)");
    Evidence(f, evidence);
  }

  // The slowest link the job's traffic crosses: the NICs' rate between nodes, else the slowest
  // GPU-GPU link within the node. 0 when unknown.
  double ExpectedBusBandwidth(std::string* why) const {
    if (MultiNode()) {
      double slowest = 0;
      for (const NodeFacts& node : nodes_) {
        if (node.topology == nullptr) return 0;
        double gbps = 0;
        for (const v1::RdmaPort& p : node.topology->rdma_ports()) {
          if (absl::AsciiStrToUpper(p.state()) == "ACTIVE") gbps += p.rate_gbps();
        }
        if (gbps <= 0) return 0;  // TCP: no figure to hold it to
        const double gbytes = gbps / 8;
        if (slowest == 0 || gbytes < slowest) {
          slowest = gbytes;
          *why = absl::StrFormat("%s's active RDMA ports: %.0f Gb/s = %.0f GB/s", node.name, gbps,
                                 gbytes);
        }
      }
      return slowest;
    }
    if (nodes_.size() != 1 || nodes_[0].topology == nullptr) return 0;
    const v1::NodeTopology& t = *nodes_[0].topology;
    double slowest = 0;
    for (const v1::TopologyLink& link : t.links()) {
      if (!IsGpu(t, link.a()) || !IsGpu(t, link.b())) continue;
      const double gbps = LinkBusBandwidthGBps(link.type(), link.nvlinks());
      if (gbps > 0 && (slowest == 0 || gbps < slowest)) {
        slowest = gbps;
        *why =
            absl::StrFormat("slowest GPU link %s <-> %s: %s, ~%.0f GB/s", DeviceName(t, link.a()),
                            DeviceName(t, link.b()), LinkName(link), gbps);
      }
    }
    return slowest;
  }

  void BusBandwidth() {
    if (!in_.bandwidth.has_value() || in_.bandwidth->backend() != "nccl") return;
    std::string why;
    const double expected = ExpectedBusBandwidth(&why);
    if (expected <= 0) return;
    std::map<std::string, const v1::BandwidthRow*> largest;
    for (const v1::BandwidthRow& row : in_.bandwidth->rows()) {
      if (row.bytes() < t_.busbw_min_bytes) continue;
      const v1::BandwidthRow*& best = largest[row.collective()];
      if (best == nullptr || row.bytes() > best->bytes()) best = &row;
    }
    std::vector<std::string> evidence;
    for (const auto& [collective, row] : largest) {
      if (row->busbw_gbps() < t_.busbw_fraction * expected) {
        evidence.push_back(absl::StrFormat("%s at %d bytes: busbw %.2f GB/s (%.0f%% of %.0f)",
                                           collective, row->bytes(), row->busbw_gbps(),
                                           100 * row->busbw_gbps() / expected, expected));
      }
    }
    if (evidence.empty()) return;
    evidence.push_back(why);
    v1::Finding& f = Add("busbw_below_links", v1::SEVERITY_WARNING, "", -1,
                         absl::StrFormat("collective bus bandwidth is far below what the links "
                                         "allow (under %.0f%% of ~%.0f GB/s)",
                                         100 * t_.busbw_fraction, expected),
                         "check the transports NCCL chose (the findings above, `trainctl diagnose "
                         "JOB` transports table): P2P within a node, NET/IB with GDRDMA between "
                         "nodes; then compare with nccl-tests on the same nodes");
    Evidence(f, evidence);
  }

  static double Median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  }

  void SlowRanks() {
    if (!in_.bandwidth.has_value()) return;
    const v1::BandwidthReport& b = *in_.bandwidth;
    std::map<int, int> slow_rows;       // rank → rows where it was slow
    std::map<int, double> worst_ratio;  // rank → its largest ratio to its peers' median
    int rows = 0;
    for (const v1::BandwidthRow& row : b.rows()) {
      const int n = row.rank_time_us_size();
      // Two ranks cannot name the slow one: each waits inside the collective for the other, so
      // a late start on either side (a busy core, a barrier left early) shows on both. A rank is
      // judged against the median of at least two peers.
      if (n < 3) continue;
      ++rows;
      for (int r = 0; r < n; ++r) {
        std::vector<double> peers;
        for (int q = 0; q < n; ++q) {
          if (q != r) peers.push_back(row.rank_time_us(q));
        }
        const double median = Median(peers);
        if (median <= 0) continue;
        const double ratio = row.rank_time_us(r) / median;
        if (ratio > t_.slow_factor) {
          ++slow_rows[r];
          worst_ratio[r] = std::max(worst_ratio[r], ratio);
        }
      }
    }
    std::set<int> slow;
    for (const auto& [rank, count] : slow_rows) {
      if (2 * count > rows) slow.insert(rank);
    }
    if (slow.empty()) return;
    // A node all of whose ranks are slow, while other nodes have ranks: one slow_node finding.
    std::set<int> reported;
    for (const NodeFacts& node : nodes_) {
      if (node.ranks.empty() || node.ranks.size() == rank_node_.size()) continue;
      if (!std::includes(slow.begin(), slow.end(), node.ranks.begin(), node.ranks.end())) continue;
      v1::Finding& f = Add("slow_node", v1::SEVERITY_WARNING, node.name, -1,
                           absl::StrCat("every rank on ", node.name,
                                        " is much slower in the bandwidth probe than the others"),
                           absl::StrCat("check ", node.name,
                                        ": its NICs (port state, rate), GPU clocks and thermal "
                                        "throttling, and other jobs on it; exclude it with a "
                                        "node_selector until fixed"));
      for (int r : node.ranks) {
        f.add_evidence(
            absl::StrFormat("rank %d: up to %.1fx its peers' median time", r, worst_ratio[r]));
        reported.insert(r);
      }
    }
    for (int r : slow) {
      if (reported.count(r) > 0) continue;
      auto it = rank_node_.find(r);
      const std::string node = it != rank_node_.end() ? it->second : "";
      v1::Finding& f =
          Add("slow_rank", v1::SEVERITY_WARNING, node, r,
              absl::StrFormat("rank %d%s is much slower than its peers in the bandwidth probe", r,
                              node.empty() ? "" : absl::StrCat(" on ", node)),
              "check that rank's GPU (clocks, throttling, Xid errors in `trainctl nodes`) and its "
              "path to the NIC; a rank slower than the rest sets every collective's pace");
      f.add_evidence(
          absl::StrFormat("slow in %d of %d probe rows, up to %.1fx the median of its "
                          "peers",
                          slow_rows[r], rows, worst_ratio[r]));
    }
  }

  const DiagnosisInputs& in_;
  const DiagnosisThresholds& t_;
  std::vector<NodeFacts> nodes_;
  std::map<int, std::string> rank_node_;
  std::vector<v1::Finding> findings_;
};

}  // namespace

double LinkBusBandwidthGBps(trainctl::v1::LinkType type, int nvlinks) {
  switch (type) {
    case v1::LINK_TYPE_NVLINK:
      return 25.0 * std::max(nvlinks, 1);
    case v1::LINK_TYPE_PIX:
    case v1::LINK_TYPE_PXB:
    case v1::LINK_TYPE_PHB:
    case v1::LINK_TYPE_NODE:
      return 24.0;
    case v1::LINK_TYPE_SYS:
      return 16.0;
    default:
      return 0;
  }
}

const char* SeverityName(trainctl::v1::Severity severity) {
  switch (severity) {
    case v1::SEVERITY_CRITICAL:
      return "critical";
    case v1::SEVERITY_WARNING:
      return "warning";
    default:
      return "info";
  }
}

std::vector<trainctl::v1::Finding> Diagnose(const DiagnosisInputs& in,
                                            const DiagnosisThresholds& thresholds) {
  return Diagnosis(in, thresholds).Run();
}

}  // namespace trainctl
