#include "cli/topology_view.h"

#include <map>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/table.h"
#include "common/diagnostics_reports.h"
#include "google/protobuf/util/time_util.h"

namespace trainctl::cli {
namespace {

namespace v1 = trainctl::v1;
using google::protobuf::util::TimeUtil;

std::string Or(const std::string& s, const std::string& fallback = "-") {
  return s.empty() ? fallback : s;
}

std::string Gib(int64_t bytes) {
  return bytes <= 0 ? "-" : absl::StrFormat("%.1f GiB", static_cast<double>(bytes) / (1 << 30));
}

std::string Ago(const google::protobuf::Timestamp& t, absl::Time now) {
  const absl::Duration d = now - absl::FromUnixMicros(TimeUtil::TimestampToMicroseconds(t));
  if (d < absl::Seconds(0)) return "just now";
  if (d < absl::Minutes(1)) return absl::StrCat(absl::ToInt64Seconds(d), "s ago");
  if (d < absl::Hours(1)) return absl::StrCat(absl::ToInt64Minutes(d), "m ago");
  if (d < absl::Hours(48)) return absl::StrCat(absl::ToInt64Hours(d), "h ago");
  return absl::StrCat(absl::ToInt64Hours(d) / 24, "d ago");
}

// The matrix's GPU row by GPU index ("GPU3" -> its device), for the affinity columns.
const v1::TopologyDevice* GpuDevice(const v1::NodeTopology& t, int index) {
  const std::string name = absl::StrCat("GPU", index);
  for (const v1::TopologyDevice& d : t.devices()) {
    if (d.name() == name) return &d;
  }
  return nullptr;
}

void PrintGpus(const v1::NodeTopology& t, std::ostream& out) {
  out << "GPUs\n";
  if (t.gpus_size() == 0) {
    out << "  none (a CPU node)\n";
    return;
  }
  Table table({"  INDEX", "NAME", "MEMORY", "PCI BUS ID", "CPU AFFINITY", "NUMA", "UUID"});
  for (const v1::TopologyGpu& gpu : t.gpus()) {
    const v1::TopologyDevice* d = GpuDevice(t, gpu.index());
    table.AddRow({absl::StrCat("  ", gpu.index()), Or(gpu.name()), Gib(gpu.memory_total_bytes()),
                  Or(gpu.pci_bus_id()), d == nullptr ? "-" : Or(d->cpu_affinity()),
                  d == nullptr ? "-" : Or(d->numa_affinity()), Or(gpu.uuid())});
  }
  table.Print(out);
}

void PrintMatrix(const v1::NodeTopology& t, std::ostream& out) {
  out << "\nLinks (as nvidia-smi topo -m)\n";
  const int n = t.devices_size();
  if (n == 0) {
    out << "  no matrix" << (t.topo_matrix().empty() ? "" : " (it did not parse: see below)")
        << "\n";
    return;
  }
  std::vector<std::vector<std::string>> cells(n, std::vector<std::string>(n, "?"));
  for (int i = 0; i < n; ++i) cells[i][i] = "X";
  for (const v1::TopologyLink& l : t.links()) {
    if (l.a() < 0 || l.b() < 0 || l.a() >= n || l.b() >= n) continue;
    cells[l.a()][l.b()] = cells[l.b()][l.a()] = LinkTypeName(l.type(), l.nvlinks());
  }
  std::vector<std::string> header = {" "};
  for (const v1::TopologyDevice& d : t.devices()) header.push_back(d.name());
  Table table(header);
  for (int i = 0; i < n; ++i) {
    std::vector<std::string> row = {absl::StrCat("  ", t.devices(i).name())};
    row.insert(row.end(), cells[i].begin(), cells[i].end());
    table.AddRow(std::move(row));
  }
  table.Print(out);
  std::vector<std::string> legend;
  for (const v1::TopologyDevice& d : t.devices()) {
    if (!d.is_gpu() && !d.nic_device().empty() && d.nic_device() != d.name()) {
      legend.push_back(absl::StrCat(d.name(), "=", d.nic_device()));
    }
  }
  if (!legend.empty()) out << "  NICs: " << absl::StrJoin(legend, "  ") << "\n";
  out << "  NV# NVLink (# links)  PIX one PCIe switch  PXB several switches  PHB host bridge\n"
         "  NODE across host bridges  SYS across NUMA nodes  ? unknown\n";
}

void PrintRdma(const v1::NodeTopology& t, std::ostream& out) {
  out << "\nRDMA ports\n";
  if (t.rdma_ports_size() == 0) {
    out << "  none\n";
  } else {
    // Which matrix device each RDMA device is ("NIC0" for mlx5_0).
    std::map<std::string, std::string> matrix_name;
    for (const v1::TopologyDevice& d : t.devices()) {
      if (!d.nic_device().empty()) matrix_name[d.nic_device()] = d.name();
    }
    Table table({"  DEVICE", "PORT", "STATE", "PHYS", "RATE", "LINK LAYER", "NETDEVS", "MATRIX"});
    for (const v1::RdmaPort& p : t.rdma_ports()) {
      auto it = matrix_name.find(p.device());
      table.AddRow({absl::StrCat("  ", p.device()), absl::StrCat(p.port()), Or(p.state()),
                    Or(p.phys_state()), Or(p.rate()), Or(p.link_layer()),
                    p.netdevs().empty() ? "-" : absl::StrJoin(p.netdevs(), ","),
                    it == matrix_name.end() ? "-" : it->second});
    }
    table.Print(out);
  }
  out << "\nGPUDirect RDMA: ";
  if (t.gpudirect_rdma()) {
    out << "possible (" << t.peer_memory_module() << " loaded)\n";
  } else if (t.rdma_ports_size() == 0) {
    out << "not possible (no RDMA device)\n";
  } else {
    out << "not possible (no peer-memory module loaded: nvidia_peermem or nv_peer_mem)\n";
  }
}

void PrintEnvironment(const v1::NodeTopology& t, std::ostream& out) {
  out << "\nNCCL environment of the worker (ranks inherit it unless the job sets its own)\n";
  if (t.nccl_env().empty()) {
    out << "  none set\n";
  } else {
    const std::map<std::string, std::string> sorted(t.nccl_env().begin(), t.nccl_env().end());
    for (const auto& [k, v] : sorted) out << "  " << k << "=" << v << "\n";
  }
  if (!t.interfaces().empty()) {
    const std::map<std::string, std::string> sorted(t.interfaces().begin(), t.interfaces().end());
    std::vector<std::string> parts;
    for (const auto& [name, what] : sorted) parts.push_back(absl::StrCat(name, " (", what, ")"));
    out << "\nInterfaces: " << absl::StrJoin(parts, ", ") << "\n";
  }
  if (t.probe_errors_size() > 0) {
    out << "\nNot probed\n";
    for (const std::string& e : t.probe_errors()) out << "  " << e << "\n";
  }
}

}  // namespace

std::string RenderNodeTopology(const v1::Node& node, absl::Time now) {
  std::ostringstream out;
  out << "Node " << node.name() << " (" << Or(node.state(), "unknown") << ")";
  if (!node.has_topology()) {
    out << ": no topology probe stored (its worker predates them, or never registered)\n";
    return out.str();
  }
  const v1::NodeTopology& t = node.topology();
  out << ", topology probed " << TimeUtil::ToString(t.probe_time()) << " ("
      << Ago(t.probe_time(), now) << ")\n\n";
  PrintGpus(t, out);
  PrintMatrix(t, out);
  PrintRdma(t, out);
  PrintEnvironment(t, out);
  return out.str();
}

}  // namespace trainctl::cli
