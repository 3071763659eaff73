#include "cli/diagnose_view.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/table.h"
#include "common/diagnostics_reports.h"

namespace trainctl::cli {
namespace {

namespace v1 = trainctl::v1;

std::string Upper(const char* s) { return absl::AsciiStrToUpper(s); }

const char* SeverityLabel(v1::Severity s) {
  switch (s) {
    case v1::SEVERITY_CRITICAL:
      return "critical";
    case v1::SEVERITY_WARNING:
      return "warning";
    default:
      return "info";
  }
}

// "8x NVIDIA H100 80GB HBM3" (or a list when the models differ).
std::string GpuSummary(const v1::NodeTopology& t) {
  if (t.gpus_size() == 0) return "-";
  std::map<std::string, int> models;
  for (const v1::TopologyGpu& g : t.gpus()) ++models[g.name().empty() ? "GPU" : g.name()];
  std::vector<std::string> parts;
  for (const auto& [name, n] : models) parts.push_back(absl::StrCat(n, "x ", name));
  return absl::StrJoin(parts, ", ");
}

// The fastest and slowest GPU-GPU link types: "NV18", "PIX..SYS".
std::string GpuLinks(const v1::NodeTopology& t) {
  auto is_gpu = [&](int i) { return i >= 0 && i < t.devices_size() && t.devices(i).is_gpu(); };
  std::set<std::pair<int, int>> kinds;  // (type, nvlinks)
  for (const v1::TopologyLink& l : t.links()) {
    if (is_gpu(l.a()) && is_gpu(l.b())) kinds.insert({l.type(), l.nvlinks()});
  }
  if (kinds.empty()) return "-";
  auto name = [](const std::pair<int, int>& k) {
    return LinkTypeName(static_cast<v1::LinkType>(k.first), k.second);
  };
  const std::string best = name(*kinds.begin());
  const std::string worst = name(*kinds.rbegin());
  return best == worst ? best : absl::StrCat(best, "..", worst);
}

std::string RdmaSummary(const v1::NodeTopology& t) {
  std::vector<std::string> ports;
  for (const v1::RdmaPort& p : t.rdma_ports()) {
    ports.push_back(absl::StrFormat("%s:%d %s %.0fG %s", p.device(), p.port(), p.state(),
                                    p.rate_gbps(), p.link_layer() == "InfiniBand" ? "IB" : "RoCE"));
  }
  return ports.empty() ? "-" : absl::StrJoin(ports, ", ");
}

void Nodes(const v1::DiagnoseJobResponse& d, std::ostream& out) {
  out << "NODES\n";
  if (d.nodes_size() == 0) {
    out << "  (the job has not been placed on nodes)\n";
    return;
  }
  Table table({"NODE", "GPUS", "GPU LINKS", "RDMA PORTS", "GPUDIRECT RDMA", "PROBE"});
  for (const v1::NodeTopology& t : d.nodes()) {
    table.AddRow({t.node(), GpuSummary(t), GpuLinks(t), RdmaSummary(t),
                  t.gpudirect_rdma() ? absl::StrCat("yes (", t.peer_memory_module(), ")") : "no",
                  t.probe_errors_size() == 0 ? "ok" : absl::StrJoin(t.probe_errors(), "; ")});
  }
  table.Print(out);
}

void Transports(const v1::DiagnoseJobResponse& d, std::ostream& out) {
  out << "\nNCCL TRANSPORTS\n";
  if (d.nccl_size() == 0) {
    out << "  (no rank reported NCCL's topology: a Gloo job, or NCCL has not initialised yet)\n";
    return;
  }
  Table table({"RANK", "HOST", "GPU", "NCCL", "CHANNELS", "P2P", "SHM", "NET/IB", "GDRDMA",
               "SOCKET", "NICS"});
  for (const v1::NcclReport& r : d.nccl()) {
    std::map<int, int> by;
    int gdr = 0;
    for (const v1::NcclConnection& c : r.connections()) {
      ++by[c.transport()];
      gdr += c.gdrdma() ? 1 : 0;
    }
    // NCCL's device index among the rank's visible devices, and its PCI bus id.
    const std::string gpu = absl::StrCat(
        r.cuda_device(), r.bus_id().empty() ? "" : absl::StrCat(" (", r.bus_id(), ")"));
    table.AddRow({absl::StrCat(r.rank()), r.host(), gpu, r.nccl_version(),
                  absl::StrCat(r.nchannels()), absl::StrCat(by[v1::NCCL_TRANSPORT_P2P]),
                  absl::StrCat(by[v1::NCCL_TRANSPORT_SHM]),
                  absl::StrCat(by[v1::NCCL_TRANSPORT_NET_IB]), absl::StrCat(gdr),
                  absl::StrCat(by[v1::NCCL_TRANSPORT_NET_SOCKET]),
                  r.nics_size() == 0 ? "-" : absl::StrJoin(r.nics(), ",")});
  }
  table.Print(out);
}

void Bandwidth(const v1::DiagnoseJobResponse& d, std::ostream& out) {
  out << "\nBANDWIDTH PROBE\n";
  if (!d.has_bandwidth() || d.bandwidth().rows_size() == 0) {
    out << "  (none ran: diagnostics: {bandwidth_probe: true} in the spec, or "
           "`trainctl diagnose --probe`)\n";
    return;
  }
  const v1::BandwidthReport& b = d.bandwidth();
  out << absl::StrFormat("  %s, %d ranks on %d node(s), %s, %d iterations per size\n", b.backend(),
                         b.world_size(), b.nodes(), b.dtype(), b.iterations());
  Table table({"COLLECTIVE", "SIZE", "TIME(us)", "ALGBW(GB/s)", "BUSBW(GB/s)", "SLOWEST RANK"});
  for (const v1::BandwidthRow& row : b.rows()) {
    std::string slowest = "-";
    if (row.rank_time_us_size() > 1) {
      const auto it = std::max_element(row.rank_time_us().begin(), row.rank_time_us().end());
      const int rank = static_cast<int>(it - row.rank_time_us().begin());
      slowest = absl::StrFormat("%d (%.0f us)", rank, *it);
    }
    table.AddRow({row.collective(), ByteSize(row.bytes()), absl::StrFormat("%.1f", row.time_us()),
                  absl::StrFormat("%.3f", row.algbw_gbps()),
                  absl::StrFormat("%.3f", row.busbw_gbps()), slowest});
  }
  table.Print(out);
}

void Findings(const v1::DiagnoseJobResponse& d, std::ostream& out) {
  out << "\nFINDINGS\n";
  if (d.findings_size() == 0) {
    out << "  none\n";
    return;
  }
  for (const v1::Finding& f : d.findings()) {
    std::string where = f.node();
    if (f.rank() >= 0) where = absl::StrCat(where.empty() ? "" : where + " ", "rank ", f.rank());
    out << "  " << Upper(SeverityLabel(f.severity())) << "  " << f.rule()
        << (where.empty() ? "" : absl::StrCat(" (", where, ")")) << ": " << f.summary() << "\n";
    for (const std::string& e : f.evidence()) out << "      - " << e << "\n";
    if (!f.remedy().empty()) out << "      remedy: " << f.remedy() << "\n";
  }
}

}  // namespace

std::string ByteSize(int64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  int64_t value = bytes;
  while (unit < 4 && value >= 1024 && value % 1024 == 0) {
    value /= 1024;
    ++unit;
  }
  return absl::StrCat(value, " ", kUnits[unit]);
}

std::string DiagnosisText(const trainctl::v1::DiagnoseJobResponse& diagnosis) {
  std::ostringstream out;
  out << "Diagnosis of job " << diagnosis.job_id() << "\n\n";
  Nodes(diagnosis, out);
  Transports(diagnosis, out);
  Bandwidth(diagnosis, out);
  Findings(diagnosis, out);
  return out.str();
}

}  // namespace trainctl::cli
