#include "worker/daemon/topo_matrix.h"

#include <map>
#include <optional>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace trainctl::worker {
namespace {

namespace v1 = trainctl::v1;

enum class Trailing { kCpuAffinity, kNumaAffinity, kGpuNumaId };

struct Cell {
  v1::LinkType type = v1::LINK_TYPE_UNSPECIFIED;
  int nvlinks = 0;
  std::string text;
  int line = 0;
};

absl::Status Bad(int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("nvidia-smi topo -m, line ", line, ": ", what));
}

std::vector<absl::string_view> Tokens(absl::string_view line) {
  return absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
}

// "GPU" or "NIC" followed by digits.
bool IsIndexed(absl::string_view name, absl::string_view prefix) {
  if (!absl::ConsumePrefix(&name, prefix) || name.empty()) return false;
  for (char c : name) {
    if (!absl::ascii_isdigit(c)) return false;
  }
  return true;
}

bool IsDeviceName(absl::string_view name) {
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '_' && c != '-' && c != '.' && c != ':') return false;
  }
  return !name.empty();
}

std::string Affinity(absl::string_view value) { return value == "N/A" ? "" : std::string(value); }

// The trailing column names, after the device tokens of the header ("CPU Affinity NUMA Affinity
// GPU NUMA ID"), in their order.
absl::StatusOr<std::vector<Trailing>> ParseTrailing(int line,
                                                    std::vector<absl::string_view> words) {
  static const std::vector<std::pair<std::vector<absl::string_view>, Trailing>> kKnown = {
      {{"CPU", "Affinity"}, Trailing::kCpuAffinity},
      {{"NUMA", "Affinity"}, Trailing::kNumaAffinity},
      {{"GPU", "NUMA", "ID"}, Trailing::kGpuNumaId},
  };
  std::vector<Trailing> out;
  size_t at = 0;
  while (at < words.size()) {
    bool matched = false;
    for (const auto& [name, column] : kKnown) {
      if (at + name.size() > words.size()) continue;
      if (std::equal(name.begin(), name.end(), words.begin() + at)) {
        out.push_back(column);
        at += name.size();
        matched = true;
        break;
      }
    }
    if (!matched) {
      return Bad(line, absl::StrCat("unknown header column starting at '", words[at],
                                    "' (known: CPU Affinity, NUMA Affinity, GPU NUMA ID)"));
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<v1::LinkType> ParseLinkCell(absl::string_view cell, int* nvlinks) {
  *nvlinks = 0;
  if (cell == "X") return v1::LINK_TYPE_SELF;
  if (cell == "PIX") return v1::LINK_TYPE_PIX;
  if (cell == "PXB") return v1::LINK_TYPE_PXB;
  if (cell == "PHB") return v1::LINK_TYPE_PHB;
  if (cell == "NODE") return v1::LINK_TYPE_NODE;
  if (cell == "SYS" || cell == "SOC") return v1::LINK_TYPE_SYS;
  absl::string_view n = cell;
  int links = 0;
  if (absl::ConsumePrefix(&n, "NV") && !n.empty() && absl::ascii_isdigit(n[0]) &&
      absl::SimpleAtoi(n, &links) && links > 0 && links <= 1024) {
    *nvlinks = links;
    return v1::LINK_TYPE_NVLINK;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown link type '", cell, "' (expected X, NV<n>, PIX, PXB, PHB, NODE or SYS)"));
}

namespace {

// Device name -> its index in NodeTopology.devices.
using TopoDeviceIndex = std::map<std::string, int, std::less<>>;

// The matrix header: its 1-based line, its device names (GPU0 first), and the trailing columns
// after them.
struct TopoHeader {
  int line = 0;
  std::vector<absl::string_view> devices;
  std::vector<Trailing> trailing;
};

// The matrix rows as read: cells[i][j] is row i's cell for column j, when row i was read;
// row_line[i] is the line row i was on (0: not read).
struct TopoRows {
  explicit TopoRows(size_t n) : cells(n, std::vector<std::optional<Cell>>(n)), row_line(n, 0) {}
  std::vector<std::vector<std::optional<Cell>>> cells;
  std::vector<int> row_line;
};

// Finds the header (the first line from `*at` that is neither blank nor a '#' comment) and reads
// it; `*at` is left on the line after it.
absl::StatusOr<TopoHeader> ParseTopoHeader(const std::vector<absl::string_view>& lines,
                                           size_t* at) {
  while (*at < lines.size()) {
    const absl::string_view l = absl::StripAsciiWhitespace(lines[*at]);
    if (!l.empty() && l[0] != '#') break;
    ++*at;
  }
  if (*at == lines.size()) {
    return absl::InvalidArgumentError("nvidia-smi topo -m: empty output (no matrix header)");
  }
  TopoHeader header;
  header.line = static_cast<int>(*at) + 1;
  std::vector<absl::string_view> tokens = Tokens(lines[(*at)++]);
  size_t n = 0;
  while (n < tokens.size() && tokens[n] != "CPU" && tokens[n] != "NUMA" && tokens[n] != "GPU") ++n;
  absl::StatusOr<std::vector<Trailing>> trailing =
      ParseTrailing(header.line, std::vector<absl::string_view>(tokens.begin() + n, tokens.end()));
  if (!trailing.ok()) return trailing.status();
  header.trailing = *std::move(trailing);
  tokens.resize(n);
  if (tokens.empty() || !IsIndexed(tokens[0], "GPU")) {
    return Bad(header.line, "not a matrix header (expected it to start with GPU0)");
  }
  header.devices = std::move(tokens);
  return header;
}

// Adds one device per header name, in order, to `topology`, and its position to `index`.
absl::Status AddTopoDevices(const TopoHeader& header, v1::NodeTopology* topology,
                            TopoDeviceIndex* index) {
  for (absl::string_view name : header.devices) {
    if (!IsDeviceName(name)) return Bad(header.line, absl::StrCat("bad device name '", name, "'"));
    if (!index->emplace(std::string(name), topology->devices_size()).second) {
      return Bad(header.line, absl::StrCat("device ", name, " appears twice"));
    }
    v1::TopologyDevice* device = topology->add_devices();
    device->set_name(std::string(name));
    device->set_is_gpu(IsIndexed(name, "GPU"));
    // Older drivers name a NIC by its device in the header itself.
    if (!device->is_gpu() && !IsIndexed(name, "NIC")) device->set_nic_device(std::string(name));
  }
  return absl::OkStatus();
}

// Sets device `i`'s affinities from the values after a row's cells (`tokens[1 + n]` on).
absl::Status SetTopoTrailingValues(int line_no, const std::vector<absl::string_view>& tokens,
                                   size_t i, const TopoHeader& header, v1::NodeTopology* topology) {
  const size_t n = header.devices.size();
  const size_t extra = tokens.size() - 1 - n;
  if (extra > header.trailing.size()) {
    return Bad(line_no,
               absl::StrCat("row ", tokens[0], " has ", extra, " values after its ", n,
                            " cells, the header names ", header.trailing.size(), " columns"));
  }
  v1::TopologyDevice* device = topology->mutable_devices(static_cast<int>(i));
  for (size_t k = 0; k < extra; ++k) {
    const absl::string_view value = tokens[1 + n + k];
    switch (header.trailing[k]) {
      case Trailing::kCpuAffinity:
        device->set_cpu_affinity(Affinity(value));
        break;
      case Trailing::kNumaAffinity:
        device->set_numa_affinity(Affinity(value));
        break;
      case Trailing::kGpuNumaId:
        break;
    }
  }
  return absl::OkStatus();
}

// Reads one matrix row (`tokens`, from line `line_no`): its cells into `rows`, its trailing values
// into its device.
absl::Status ParseTopoRow(int line_no, const std::vector<absl::string_view>& tokens,
                          const TopoHeader& header, const TopoDeviceIndex& index, TopoRows* rows,
                          v1::NodeTopology* topology) {
  const size_t n = header.devices.size();
  auto it = index.find(tokens[0]);
  if (it == index.end()) {
    return Bad(line_no, absl::StrCat("row '", tokens[0], "' is not a device of the header"));
  }
  const size_t i = static_cast<size_t>(it->second);
  if (rows->row_line[i] > 0) {
    return Bad(line_no,
               absl::StrCat("row ", tokens[0], " again (first on line ", rows->row_line[i], ")"));
  }
  rows->row_line[i] = line_no;
  if (tokens.size() - 1 < n) {
    return Bad(line_no, absl::StrCat("row ", tokens[0], " has ", tokens.size() - 1,
                                     " cells, the header names ", n, " devices"));
  }
  for (size_t j = 0; j < n; ++j) {
    const absl::string_view token = tokens[1 + j];
    const std::string where =
        absl::StrCat("column ", j + 2, " (", header.devices[i], "->", header.devices[j], ")");
    Cell cell;
    cell.text = std::string(token);
    cell.line = line_no;
    auto type = ParseLinkCell(token, &cell.nvlinks);
    if (!type.ok()) return Bad(line_no, absl::StrCat(where, ": ", type.status().message()));
    cell.type = *type;
    if ((i == j) != (cell.type == v1::LINK_TYPE_SELF)) {
      return Bad(line_no, absl::StrCat(where, ": '", token, "' ",
                                       i == j ? "where X (self) belongs" : "off the diagonal"));
    }
    rows->cells[i][j] = std::move(cell);
  }
  return SetTopoTrailingValues(line_no, tokens, i, header, topology);
}

// Reads the matrix rows from `*at` until a blank line after a row, or the legend; `*at` is left
// on the line that ended them.
absl::Status ParseTopoRows(const std::vector<absl::string_view>& lines, size_t* at,
                           const TopoHeader& header, const TopoDeviceIndex& index, TopoRows* rows,
                           v1::NodeTopology* topology) {
  for (; *at < lines.size(); ++*at) {
    const int line_no = static_cast<int>(*at) + 1;
    const absl::string_view line = absl::StripAsciiWhitespace(lines[*at]);
    if (line.empty()) {
      bool any_row = false;
      for (int r : rows->row_line) any_row = any_row || r > 0;
      if (any_row) break;
      continue;
    }
    if (absl::StartsWith(line, "Legend")) break;
    if (absl::Status s = ParseTopoRow(line_no, Tokens(line), header, index, rows, topology);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

// Checks every GPU has a row, and adds one link per pair a < b whose cell is known (checking the
// two cells across the diagonal agree).
absl::Status AddTopoLinks(const TopoHeader& header, const TopoRows& rows,
                          v1::NodeTopology* topology) {
  const std::vector<absl::string_view>& names = header.devices;
  const size_t n = names.size();
  for (size_t i = 0; i < n; ++i) {
    if (rows.row_line[i] == 0 && topology->devices(static_cast<int>(i)).is_gpu()) {
      return Bad(header.line, absl::StrCat(names[i], " has no row in the matrix"));
    }
  }
  for (size_t a = 0; a < n; ++a) {
    for (size_t b = a + 1; b < n; ++b) {
      const std::optional<Cell>& ab = rows.cells[a][b];
      const std::optional<Cell>& ba = rows.cells[b][a];
      if (ab && ba && (ab->type != ba->type || ab->nvlinks != ba->nvlinks)) {
        return Bad(ba->line,
                   absl::StrCat(names[b], "->", names[a], " is ", ba->text, " but ", names[a], "->",
                                names[b], " is ", ab->text, " (line ", ab->line, ")"));
      }
      const std::optional<Cell>& cell = ab ? ab : ba;
      if (!cell) continue;
      v1::TopologyLink* link = topology->add_links();
      link->set_a(static_cast<int>(a));
      link->set_b(static_cast<int>(b));
      link->set_type(cell->type);
      link->set_nvlinks(cell->nvlinks);
    }
  }
  return absl::OkStatus();
}

// Reads the NIC legend ("NIC Legend:", then "  NIC0: mlx5_0" lines) from line `at` on, after the
// matrix, into the NICs' nic_device.
absl::Status ReadTopoNicLegend(const std::vector<absl::string_view>& lines, size_t at,
                               const TopoDeviceIndex& index, v1::NodeTopology* topology) {
  bool in_legend = false;
  for (; at < lines.size(); ++at) {
    const int line_no = static_cast<int>(at) + 1;
    const absl::string_view line = absl::StripAsciiWhitespace(lines[at]);
    if (line == "NIC Legend:") {
      in_legend = true;
      continue;
    }
    if (!in_legend || line.empty()) continue;
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(line, absl::MaxSplits(':', 1));
    const absl::string_view nic = absl::StripAsciiWhitespace(kv.first);
    const absl::string_view device = absl::StripAsciiWhitespace(kv.second);
    if (!IsIndexed(nic, "NIC") || !absl::StrContains(line, ':')) {
      in_legend = false;  // something else follows the legend
      continue;
    }
    auto it = index.find(nic);
    if (it == index.end()) {
      return Bad(line_no,
                 absl::StrCat("the NIC legend names ", nic, ", which the matrix does not have"));
    }
    if (!IsDeviceName(device)) {
      return Bad(line_no,
                 absl::StrCat("the NIC legend gives ", nic, " the bad device name '", device, "'"));
    }
    topology->mutable_devices(it->second)->set_nic_device(std::string(device));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::NodeTopology> ParseTopoMatrix(absl::string_view text) {
  const std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  size_t at = 0;
  absl::StatusOr<TopoHeader> header = ParseTopoHeader(lines, &at);
  if (!header.ok()) return header.status();
  v1::NodeTopology topology;
  TopoDeviceIndex index;
  if (absl::Status s = AddTopoDevices(*header, &topology, &index); !s.ok()) return s;
  TopoRows rows(header->devices.size());
  if (absl::Status s = ParseTopoRows(lines, &at, *header, index, &rows, &topology); !s.ok()) {
    return s;
  }
  if (absl::Status s = AddTopoLinks(*header, rows, &topology); !s.ok()) return s;
  if (absl::Status s = ReadTopoNicLegend(lines, at, index, &topology); !s.ok()) return s;
  return topology;
}

}  // namespace trainctl::worker
