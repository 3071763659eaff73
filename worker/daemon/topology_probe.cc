#include "worker/daemon/topology_probe.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/utf8.h"
#include "common/worker_limits.h"
#include "google/protobuf/util/time_util.h"
#include "worker/daemon/run_program.h"
#include "worker/daemon/topo_matrix.h"

namespace trainctl::worker {
namespace {

namespace v1 = trainctl::v1;
namespace fs = std::filesystem;

// `s` as valid UTF-8, cut to at most `max` bytes.
std::string Bounded(absl::string_view s, size_t max) {
  std::string valid = ToValidUtf8(s);
  return valid.substr(0, Utf8PrefixLength(valid, max));
}

void AddError(std::vector<std::string>* errors, absl::string_view error) {
  if (errors->size() < static_cast<size_t>(kMaxTopologyProbeErrors)) {
    errors->push_back(Bounded(error, kMaxTopologyTextBytes));
  }
}

// The first line of a sysfs attribute, trimmed; NOT_FOUND/UNAVAILABLE naming the file.
absl::StatusOr<std::string> ReadAttribute(const fs::path& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::UnavailableError(absl::StrCat("cannot read ", path.string()));
  }
  std::string line;
  std::getline(in, line);
  return std::string(absl::StripAsciiWhitespace(line));
}

// The entries of a directory, sorted by name ("mlx5_10" after "mlx5_9": by length, then bytes).
std::vector<std::string> SortedEntries(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  std::sort(names.begin(), names.end(), [](const std::string& a, const std::string& b) {
    return a.size() != b.size() ? a.size() < b.size() : a < b;
  });
  return names;
}

// "4: ACTIVE" -> "ACTIVE".
std::string AfterColon(absl::string_view value) {
  const size_t colon = value.find(':');
  if (colon == absl::string_view::npos) return std::string(value);
  return std::string(absl::StripAsciiWhitespace(value.substr(colon + 1)));
}

// "up ether", "down loopback", ... for <root>/class/net/<name>.
std::string DescribeInterface(const fs::path& dir) {
  std::string state = ReadAttribute(dir / "operstate").value_or("unknown");
  std::string kind = "other";
  std::error_code ec;
  if (fs::exists(dir / "bridge", ec)) {
    kind = "bridge";
  } else if (absl::StatusOr<std::string> type = ReadAttribute(dir / "type"); type.ok()) {
    // include/uapi/linux/if_arp.h: ARPHRD_ETHER 1, ARPHRD_INFINIBAND 32, ARPHRD_LOOPBACK 772.
    if (*type == "1") kind = "ether";
    if (*type == "32") kind = "ib";
    if (*type == "772") kind = "loopback";
  }
  return absl::StrCat(state, " ", kind);
}

void ProbeGpus(const TopologyProbeOptions& options, v1::NodeTopology* topology,
               std::vector<std::string>* errors) {
  for (const v1::GpuInfo& gpu : options.gpus) {
    v1::TopologyGpu* out = topology->add_gpus();
    out->set_index(gpu.index());
    out->set_uuid(gpu.uuid());
    out->set_name(gpu.name());
    out->set_memory_total_bytes(gpu.memory_total_bytes());
  }
  absl::StatusOr<std::string> csv =
      RunToCompletion({options.nvidia_smi, "--query-gpu=index,pci.bus_id", "--format=csv,noheader"},
                      options.nvidia_smi_timeout);
  absl::StatusOr<std::map<int, std::string>> bus_ids =
      csv.ok() ? ParsePciBusIds(*csv) : csv.status();
  if (!bus_ids.ok()) {
    AddError(errors, absl::StrCat("GPU PCI bus ids: ", bus_ids.status().message()));
  } else {
    for (v1::TopologyGpu& gpu : *topology->mutable_gpus()) {
      auto it = bus_ids->find(gpu.index());
      if (it != bus_ids->end()) gpu.set_pci_bus_id(Bounded(it->second, kMaxIdBytes));
    }
  }

  absl::StatusOr<std::string> matrix =
      RunToCompletion({options.nvidia_smi, "topo", "-m"}, options.nvidia_smi_timeout);
  if (!matrix.ok()) {
    AddError(errors, absl::StrCat("topology matrix: ", matrix.status().message()));
    return;
  }
  topology->set_topo_matrix(Bounded(*matrix, kMaxTopoMatrixBytes));
  absl::StatusOr<v1::NodeTopology> parsed = ParseTopoMatrix(*matrix);
  if (!parsed.ok()) {
    AddError(errors, parsed.status().message());
    return;
  }
  if (parsed->devices_size() > kMaxTopologyDevices) {
    AddError(errors, absl::StrCat("topology matrix: ", parsed->devices_size(),
                                  " devices, more than the ", kMaxTopologyDevices, " reported"));
    return;
  }
  *topology->mutable_devices() = std::move(*parsed->mutable_devices());
  *topology->mutable_links() = std::move(*parsed->mutable_links());
}

void ReadInterfaces(const std::string& sysfs_root, v1::NodeTopology* topology) {
  const fs::path net = fs::path(sysfs_root) / "class" / "net";
  for (const std::string& name : SortedEntries(net)) {
    if (topology->interfaces_size() >= kMaxTopologyInterfaces) break;
    (*topology->mutable_interfaces())[Bounded(name, kMaxIdBytes)] = DescribeInterface(net / name);
  }
}

}  // namespace

bool IsNcclRelevant(absl::string_view name) {
  return absl::StartsWith(name, "NCCL_") || name == "CUDA_VISIBLE_DEVICES";
}

absl::StatusOr<std::map<int, std::string>> ParsePciBusIds(absl::string_view csv) {
  std::map<int, std::string> out;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(csv, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    std::vector<absl::string_view> cols = absl::StrSplit(line, ',');
    int index = 0;
    if (cols.size() != 2 || !absl::SimpleAtoi(absl::StripAsciiWhitespace(cols[0]), &index) ||
        index < 0) {
      return absl::InvalidArgumentError(absl::StrCat("nvidia-smi output line ", line_no, " (", line,
                                                     "): expected '<index>, <pci.bus_id>'"));
    }
    out[index] = std::string(absl::StripAsciiWhitespace(cols[1]));
  }
  return out;
}

double ParseRateGbps(absl::string_view rate) {
  std::vector<absl::string_view> words = absl::StrSplit(rate, ' ', absl::SkipEmpty());
  double value = 0;
  if (words.empty() || !absl::SimpleAtod(words[0], &value) || value < 0) return 0;
  return value;
}

std::vector<v1::RdmaPort> ReadRdmaPorts(const std::string& sysfs_root,
                                        std::vector<std::string>* errors) {
  std::vector<v1::RdmaPort> ports;
  const fs::path root = fs::path(sysfs_root) / "class" / "infiniband";
  for (const std::string& device : SortedEntries(root)) {
    std::vector<std::string> netdevs;
    for (const std::string& netdev : SortedEntries(root / device / "device" / "net")) {
      netdevs.push_back(Bounded(netdev, kMaxIdBytes));
    }
    const fs::path ports_dir = root / device / "ports";
    for (const std::string& port_name : SortedEntries(ports_dir)) {
      if (ports.size() >= static_cast<size_t>(kMaxTopologyRdmaPorts)) return ports;
      int port_no = 0;
      if (!absl::SimpleAtoi(port_name, &port_no)) continue;
      v1::RdmaPort port;
      port.set_device(Bounded(device, kMaxIdBytes));
      port.set_port(port_no);
      const fs::path dir = ports_dir / port_name;
      auto read = [&](const char* attribute) -> std::string {
        absl::StatusOr<std::string> value = ReadAttribute(dir / attribute);
        if (!value.ok()) {
          AddError(errors, absl::StrCat("RDMA ", device, " port ", port_no, ": ",
                                        value.status().message()));
          return "";
        }
        return Bounded(*value, kMaxIdBytes);
      };
      port.set_state(AfterColon(read("state")));
      port.set_phys_state(AfterColon(read("phys_state")));
      port.set_rate(read("rate"));
      port.set_rate_gbps(ParseRateGbps(port.rate()));
      port.set_link_layer(read("link_layer"));
      for (const std::string& netdev : netdevs) port.add_netdevs(netdev);
      ports.push_back(std::move(port));
    }
  }
  return ports;
}

std::string FindPeerMemoryModule(absl::string_view proc_modules) {
  for (absl::string_view line : absl::StrSplit(proc_modules, '\n')) {
    const absl::string_view name = line.substr(0, line.find(' '));
    if (name == "nvidia_peermem" || name == "nv_peer_mem") return std::string(name);
  }
  return "";
}

v1::NodeTopology ProbeTopology(const TopologyProbeOptions& options, absl::Time now) {
  v1::NodeTopology topology;
  *topology.mutable_probe_time() =
      google::protobuf::util::TimeUtil::MicrosecondsToTimestamp(absl::ToUnixMicros(now));
  std::vector<std::string> errors;
  if (!options.gpus.empty()) ProbeGpus(options, &topology, &errors);

  for (v1::RdmaPort& port : ReadRdmaPorts(options.sysfs_root, &errors)) {
    *topology.add_rdma_ports() = std::move(port);
  }
  ReadInterfaces(options.sysfs_root, &topology);

  std::ifstream modules(options.proc_modules);
  if (modules) {
    std::stringstream text;
    text << modules.rdbuf();
    topology.set_peer_memory_module(FindPeerMemoryModule(text.str()));
  } else {
    AddError(&errors,
             absl::StrCat("cannot read ", options.proc_modules, " (peer-memory module unknown)"));
  }
  topology.set_gpudirect_rdma(topology.rdma_ports_size() > 0 &&
                              !topology.peer_memory_module().empty());

  for (const auto& [name, value] : options.environment) {
    if (!IsNcclRelevant(name)) continue;
    if (topology.nccl_env_size() >= kMaxTopologyEnv) {
      AddError(&errors, absl::StrCat("more than ", kMaxTopologyEnv, " NCCL variables; ", name,
                                     " and later ones not reported"));
      break;
    }
    (*topology.mutable_nccl_env())[Bounded(name, kMaxIdBytes)] =
        Bounded(value, kMaxTopologyTextBytes);
  }
  for (std::string& e : errors) topology.add_probe_errors(std::move(e));
  return topology;
}

}  // namespace trainctl::worker
