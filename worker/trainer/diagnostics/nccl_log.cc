#include "worker/trainer/diagnostics/nccl_log.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/diagnostics_reports.h"

namespace trainctl::trainer {
namespace {

namespace v1 = trainctl::v1;

// Lines longer than this are not NCCL's (a Trees line of 64 channels is ~1.5 KB).
constexpr size_t kMaxLineBytes = 16 << 10;

// One log line: who wrote it ("host:pid:tid [dev]") and what NCCL said after "NCCL INFO ".
struct Line {
  absl::string_view host, pid, dev;
  bool prefixed = false;
  bool warn = false;
  absl::string_view msg;
};

std::optional<Line> SplitLine(absl::string_view raw) {
  Line line;
  size_t at = raw.find("NCCL INFO ");
  size_t skip = 10;
  if (at == absl::string_view::npos) {
    at = raw.find("NCCL WARN ");
    if (at == absl::string_view::npos) return std::nullopt;
    line.warn = true;
  }
  line.msg = absl::StripAsciiWhitespace(raw.substr(at + skip));
  // The writer: the last "[dev]" before the marker, and the "host:pid:tid" token before it.
  const absl::string_view head = raw.substr(0, at);
  const size_t close = head.rfind(']');
  const size_t open = close == absl::string_view::npos ? close : head.rfind('[', close);
  if (open == absl::string_view::npos || open == 0) return line;
  const absl::string_view before = absl::StripTrailingAsciiWhitespace(head.substr(0, open));
  const size_t space = before.find_last_of(" \t");
  const absl::string_view who =
      space == absl::string_view::npos ? before : before.substr(space + 1);
  const size_t tid = who.rfind(':');
  if (tid == absl::string_view::npos || tid == 0) return line;
  const size_t pid = who.rfind(':', tid - 1);
  if (pid == absl::string_view::npos) return line;
  line.host = who.substr(0, pid);
  line.pid = who.substr(pid + 1, tid - pid - 1);
  line.dev = head.substr(open + 1, close - open - 1);
  line.prefixed = true;
  return line;
}

// Printable ASCII only (the log is bytes from outside), at most kMaxNcclTextBytes.
std::string Clean(absl::string_view text) {
  std::string out(text.substr(0, kMaxNcclTextBytes));
  for (char& ch : out) {
    if (static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) > 0x7e) ch = '?';
  }
  return out;
}

bool Int(absl::string_view text, int* out) { return absl::SimpleAtoi(text, out); }

// The leading integer of "14[b1000]" or "15".
bool RankOf(absl::string_view token, int* rank) {
  const size_t bracket = token.find('[');
  return Int(token.substr(0, bracket), rank) && *rank >= 0;
}

// "Channel 03/16" or "Ring 00" at the start of `msg`: the channel, and the total after '/'.
bool ChannelOf(absl::string_view msg, int* channel, int* total) {
  absl::string_view rest;
  if (absl::StartsWith(msg, "Channel ")) {
    rest = msg.substr(8);
  } else if (absl::StartsWith(msg, "Ring ")) {
    rest = msg.substr(5);
  } else {
    return false;
  }
  const absl::string_view word = rest.substr(0, rest.find(' '));
  const size_t slash = word.find('/');
  *total = 0;
  if (slash != absl::string_view::npos) (void)Int(word.substr(slash + 1), total);
  return Int(word.substr(0, slash), channel) && *channel >= 0 && *channel <= 1024;
}

v1::NcclTransport TransportOf(absl::string_view via) {
  if (absl::StartsWith(via, "P2P")) return v1::NCCL_TRANSPORT_P2P;
  if (absl::StartsWith(via, "SHM") || absl::StartsWith(via, "direct shared memory"))
    return v1::NCCL_TRANSPORT_SHM;
  if (absl::StartsWith(via, "NET/IB")) return v1::NCCL_TRANSPORT_NET_IB;
  if (absl::StartsWith(via, "NET/Socket")) return v1::NCCL_TRANSPORT_NET_SOCKET;
  if (absl::StartsWith(via, "NET/")) return v1::NCCL_TRANSPORT_NET_OTHER;
  if (absl::StartsWithIgnoreCase(via, "COLLNET")) return v1::NCCL_TRANSPORT_COLLNET;
  if (absl::StartsWith(via, "NVLS")) return v1::NCCL_TRANSPORT_NVLS;
  return v1::NCCL_TRANSPORT_UNSPECIFIED;
}

// "Channel 03/0 : 7[b2000] -> 14[b1000] [receive] via NET/IB/0/GDRDMA" (and older spellings).
std::optional<v1::NcclConnection> ParseConnection(absl::string_view msg) {
  int channel = 0, total = 0;
  const size_t via_at = msg.find(" via ");
  const size_t colon = msg.find(" : ");
  if (!ChannelOf(msg, &channel, &total) || via_at == absl::string_view::npos ||
      colon == absl::string_view::npos || colon > via_at) {
    return std::nullopt;
  }
  std::vector<absl::string_view> words =
      absl::StrSplit(msg.substr(colon + 3, via_at - colon - 3), ' ', absl::SkipEmpty());
  int from = 0, to = 0;
  if (words.size() < 3 || words[1] != "->" || !RankOf(words[0], &from) || !RankOf(words[2], &to)) {
    return std::nullopt;
  }
  v1::NcclConnection c;
  c.set_channel(channel);
  c.set_from_rank(from);
  c.set_to_rank(to);
  const absl::string_view via = absl::StripAsciiWhitespace(msg.substr(via_at + 5));
  c.set_via(Clean(via));
  c.set_transport(TransportOf(via));
  const bool net = absl::StartsWith(via, "NET/") || c.transport() == v1::NCCL_TRANSPORT_COLLNET;
  c.set_inter_node(net);
  c.set_gdrdma(net && absl::StrContains(via, "/GDRDMA"));
  if (absl::StartsWith(via, "NET/")) {
    std::vector<absl::string_view> parts = absl::StrSplit(via, '/');
    if (parts.size() >= 3) c.set_nic(Clean(parts[2]));
  }
  return c;
}

// "Channel 12/16 :    0   1   2   3": a ring, every word after the colon a rank.
bool ParseRing(absl::string_view msg, v1::NcclChannelPath* ring, int* total) {
  int channel = 0;
  const size_t colon = msg.find(" : ");
  if (colon == absl::string_view::npos || absl::StrContains(msg, "->") ||
      !ChannelOf(msg, &channel, total)) {
    return false;
  }
  ring->set_channel(channel);
  std::vector<absl::string_view> words =
      absl::StrSplit(msg.substr(colon + 3), ' ', absl::SkipEmpty());
  if (words.empty() || words.size() > 4096) return false;
  for (absl::string_view w : words) {
    int rank = 0;
    if (!Int(w, &rank)) return false;
    ring->add_ranks(rank);
  }
  ring->set_path(Clean(absl::StrJoin(words, " ")));
  return true;
}

// "Trees [0] 1/-1/-1->0->-1 [1] ..." into one path per channel.
void ParseTrees(absl::string_view msg, v1::NcclReport* report) {
  std::vector<absl::string_view> words = absl::StrSplit(msg.substr(6), ' ', absl::SkipEmpty());
  for (size_t i = 0; i + 1 < words.size(); i += 2) {
    int channel = 0;
    absl::string_view w = words[i];
    if (!absl::ConsumePrefix(&w, "[") || !absl::ConsumeSuffix(&w, "]") || !Int(w, &channel)) return;
    if (report->trees_size() >= kMaxNcclPaths) return;
    v1::NcclChannelPath* tree = report->add_trees();
    tree->set_channel(channel);
    tree->set_path(Clean(words[i + 1]));
  }
}

// "comm 0x... rank 5 nranks 16 cudaDev 5 busId 89000 - Init COMPLETE" and
// "comm 0x... rank 13 nRanks 16 nNodes 2 localRanks 8 localRank 5 MNNVL 0": key -> value.
std::map<std::string, std::string> CommFields(absl::string_view msg) {
  std::map<std::string, std::string> fields;
  const size_t comm = msg.find("comm 0x");
  if (comm == absl::string_view::npos) return fields;
  std::vector<absl::string_view> words = absl::StrSplit(msg.substr(comm), ' ', absl::SkipEmpty());
  for (size_t i = 2; i + 1 < words.size(); i += 2) {
    if (words[i] == "-") break;
    fields[absl::AsciiStrToLower(words[i])] = std::string(words[i + 1]);
  }
  return fields;
}

using Key = std::tuple<std::string, std::string, std::string>;  // host, pid, dev

// The communicator summary of `rank` (-1: the first): its writer and fields. COMPLETE lines win
// over START lines.
struct CommLine {
  bool found = false;
  int rank = -1;
  Key key;
  std::map<std::string, std::string> fields;
};

CommLine FindComm(const std::vector<Line>& lines, int rank) {
  CommLine best;
  int best_score = 0;
  for (const Line& line : lines) {
    if (line.warn || !absl::StrContains(line.msg, " - Init ")) continue;
    const int score = absl::StrContains(line.msg, "Init COMPLETE") ? 2 : 1;
    if (score <= best_score) continue;
    auto fields = CommFields(line.msg);
    int r = -1;
    if (!fields.count("rank") || !Int(fields["rank"], &r) || r < 0) continue;
    if (rank >= 0 && r != rank) continue;
    if (rank < 0 && best.found && r != best.rank) continue;  // the first communicator's rank
    best.found = true;
    best.rank = r;
    best.key = Key(std::string(line.host), std::string(line.pid), std::string(line.dev));
    best.fields = std::move(fields);
    best_score = score;
  }
  return best;
}

void AddNic(absl::string_view token, v1::NcclReport* report) {
  if (!absl::ConsumePrefix(&token, "[")) return;
  const size_t close = token.find(']');
  if (close == absl::string_view::npos) return;
  const absl::string_view name = token.substr(close + 1);
  if (name.empty() || report->nics_size() >= kMaxNcclNics) return;  // "[RO]" flags
  const std::string clean = Clean(name);
  for (const std::string& nic : report->nics()) {
    if (nic == clean) return;
  }
  report->add_nics(clean);
}

// The lines of `text` NCCL wrote (longer ones skipped), their writers and the first
// "NCCL version" on any line.
struct ScannedNcclLog {
  std::vector<Line> lines;
  std::set<Key> writers;
  std::string version;
};

// One pass over `text`, line by line.
ScannedNcclLog ScanNcclLines(absl::string_view text) {
  ScannedNcclLog scanned;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    if (raw.size() > kMaxLineBytes) continue;
    if (const size_t v = raw.find("NCCL version ");
        v != absl::string_view::npos && scanned.version.empty()) {
      const absl::string_view rest = raw.substr(v + 13);
      scanned.version = Clean(rest.substr(0, rest.find_first_of(" \t\r")));
    }
    if (std::optional<Line> line = SplitLine(raw)) {
      if (line->prefixed) {
        scanned.writers.emplace(std::string(line->host), std::string(line->pid),
                                std::string(line->dev));
      }
      scanned.lines.push_back(*line);
    }
  }
  return scanned;
}

// Which lines are this rank's: its process's (host, pid), its device's (host, pid, dev); lines
// without a writer prefix count as both.
struct NcclLineOwner {
  std::optional<Key> key;

  bool SameProcess(const Line& l) const {
    return !l.prefixed || !key || (l.host == std::get<0>(*key) && l.pid == std::get<1>(*key));
  }
  bool SameDevice(const Line& l) const {
    return !l.prefixed || (key && SameProcess(l) && l.dev == std::get<2>(*key));
  }
};

// nranks, cudaDev and busId from the rank's communicator summary line.
void SetNcclCommFields(const CommLine& comm, v1::NcclReport* report) {
  int value = 0;
  auto field = [&](const char* name) -> const std::string* {
    auto it = comm.fields.find(name);
    return it == comm.fields.end() ? nullptr : &it->second;
  };
  if (const std::string* n = field("nranks"); n && Int(*n, &value)) report->set_nranks(value);
  if (const std::string* d = field("cudadev"); d && Int(*d, &value)) report->set_cuda_device(value);
  if (const std::string* b = field("busid")) report->set_bus_id(Clean(*b));
}

// "comm 0x... rank 13 nRanks 16 nNodes 2 localRanks 8 ...": nnodes and local_ranks when the line
// is rank `me`'s.
void SetNcclNodeCounts(absl::string_view msg, int me, v1::NcclReport* report) {
  auto fields = CommFields(msg);
  int r = -1, value = 0;
  if (Int(fields["rank"], &r) && r == me) {
    if (Int(fields["nnodes"], &value)) report->set_nnodes(value);
    if (Int(fields["localranks"], &value)) report->set_local_ranks(value);
  }
}

// "Bootstrap : Using eth0:10.0.0.1<0>": the first such interface of the rank's process.
void SetNcclBootstrap(absl::string_view msg, bool same_process, v1::NcclReport* report) {
  const size_t using_at = msg.find("Using ");
  if (using_at != absl::string_view::npos && same_process &&
      report->bootstrap_interface().empty()) {
    absl::string_view first = msg.substr(using_at + 6);
    first = first.substr(0, first.find(' '));
    if (absl::ConsumePrefix(&first, "[")) first = first.substr(first.find(']') + 1);
    report->set_bootstrap_interface(Clean(first));
  }
}

// "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]; OOB eth0:..." or older "NET/IB: [0] x".
void AddNcclNetNics(absl::string_view msg, v1::NcclReport* report) {
  absl::string_view rest = msg;
  if (const size_t u = rest.find("Using ["); u != absl::string_view::npos) {
    rest = rest.substr(u + 6, rest.find(';') == absl::string_view::npos ? absl::string_view::npos
                                                                        : rest.find(';') - u - 6);
    for (absl::string_view token : absl::StrSplit(rest, ' ', absl::SkipEmpty())) {
      AddNic(token, report);
    }
  } else if (const size_t b = rest.find(": ["); b != absl::string_view::npos) {
    std::vector<absl::string_view> words =
        absl::StrSplit(rest.substr(b + 2), ' ', absl::SkipEmpty());
    if (words.size() == 2) AddNic(absl::StrCat(words[0], words[1]), report);
  }
}

// "NCCL_IB_DISABLE set by environment to 1." into the report's env (and ib_disabled).
void SetNcclEnvVar(absl::string_view msg, v1::NcclReport* report) {
  const size_t at = msg.find(" set by environment to ");
  const std::string name = Clean(msg.substr(0, at));
  absl::string_view value = absl::StripAsciiWhitespace(msg.substr(at + 23));
  absl::ConsumeSuffix(&value, ".");
  (*report->mutable_env())[name] = Clean(value);
  if (name == "NCCL_IB_DISABLE" && value == "1") report->set_ib_disabled(true);
}

// One line of any kind but a connection or a ring into `report`; false when it is none of those
// kinds (and so may be a connection or a ring).
bool ParseNcclSetupLine(const Line& line, int me, const NcclLineOwner& owner,
                        v1::NcclReport* report) {
  const absl::string_view msg = line.msg;
  if (line.warn) {
    if (owner.SameProcess(line) && report->warnings_size() < kMaxNcclWarnings)
      report->add_warnings(Clean(msg));
    return true;
  }
  if (absl::StartsWith(msg, "NCCL version ") || absl::StrContains(msg, " - Init ")) return true;
  if (absl::StartsWith(msg, "comm 0x") && absl::StrContains(msg, "nNodes")) {
    SetNcclNodeCounts(msg, me, report);
    return true;
  }
  if (absl::StartsWith(msg, "Bootstrap")) {
    SetNcclBootstrap(msg, owner.SameProcess(line), report);
    return true;
  }
  if (absl::StartsWith(msg, "NET/") && owner.SameProcess(line)) {
    AddNcclNetNics(msg, report);
    return true;
  }
  if (absl::StartsWith(msg, "NCCL_") && absl::StrContains(msg, " set by environment to ")) {
    if (!owner.SameProcess(line) || report->env_size() >= kMaxNcclEnv) return true;
    SetNcclEnvVar(msg, report);
    return true;
  }
  if (absl::StartsWith(msg, "Trees ")) {
    if (owner.SameDevice(line) && report->trees_size() == 0) ParseTrees(msg, report);
    return true;
  }
  if (absl::StrContains(msg, " coll channels")) {
    int n = 0;
    if (owner.SameDevice(line) && report->nchannels() == 0 &&
        Int(msg.substr(0, msg.find(' ')), &n) && n >= 0 && n <= 1024) {
      report->set_nchannels(n);
    }
    return true;
  }
  return false;
}

// Every line's contribution to `report`, in log order. Returns the largest channel total a ring
// line gave ("Channel 12/16": 16).
int ParseNcclRankLines(const std::vector<Line>& lines, int me, const NcclLineOwner& owner,
                       v1::NcclReport* report) {
  std::set<std::tuple<int, int, int, std::string>> seen;
  int ring_total = 0;
  for (const Line& line : lines) {
    if (ParseNcclSetupLine(line, me, owner, report)) continue;
    const absl::string_view msg = line.msg;
    if (std::optional<v1::NcclConnection> c = ParseConnection(msg)) {
      const bool mine =
          me >= 0 ? (c->from_rank() == me || c->to_rank() == me) : owner.SameDevice(line);
      if (!mine || report->connections_size() >= kMaxNcclConnections) continue;
      if (seen.emplace(c->channel(), c->from_rank(), c->to_rank(), c->via()).second) {
        *report->add_connections() = std::move(*c);
      }
      continue;
    }
    v1::NcclChannelPath ring;
    int total = 0;
    if (owner.SameDevice(line) && report->rings_size() < kMaxNcclPaths &&
        ParseRing(msg, &ring, &total)) {
      ring_total = std::max(ring_total, total);
      *report->add_rings() = std::move(ring);
    }
  }
  return ring_total;
}

// What the lines imply together: the channel count from the rings when no line gave it, and
// whether GPUDirect RDMA is on when any connection crosses nodes.
void FinishNcclSummary(int ring_total, v1::NcclReport* report) {
  if (report->nchannels() == 0) {
    int n = ring_total;
    for (const v1::NcclChannelPath& ring : report->rings()) n = std::max(n, ring.channel() + 1);
    report->set_nchannels(n);
  }
  bool net = false, gdr = false;
  for (const v1::NcclConnection& c : report->connections()) {
    if (!c.inter_node()) continue;
    net = true;
    gdr = gdr || c.gdrdma();
  }
  if (net) report->set_gdr_state(gdr ? "enabled" : "disabled");
}

}  // namespace

v1::NcclReport ParseNcclLog(absl::string_view text, int rank) {
  v1::NcclReport report;
  if (text.size() > kMaxNcclLogBytes) {
    text = text.substr(0, kMaxNcclLogBytes);
    report.add_warnings(
        absl::StrCat("only the first ", kMaxNcclLogBytes, " bytes of the log read"));
  }
  const ScannedNcclLog scanned = ScanNcclLines(text);
  report.set_nccl_version(scanned.version);

  const CommLine comm = FindComm(scanned.lines, rank);
  report.set_rank(comm.found ? comm.rank : std::max(rank, 0));
  const int me = comm.found ? comm.rank : rank;
  // A log without a communicator line for the rank is taken as one writer's when it has one
  // writer.
  NcclLineOwner owner;
  if (comm.found) {
    owner.key = comm.key;
  } else if (scanned.writers.size() == 1) {
    owner.key = *scanned.writers.begin();
  }
  if (owner.key) report.set_host(Clean(std::get<0>(*owner.key)));
  if (comm.found) SetNcclCommFields(comm, &report);

  const int ring_total = ParseNcclRankLines(scanned.lines, me, owner, &report);
  FinishNcclSummary(ring_total, &report);
  return report;
}

void SetTopologyXml(absl::string_view xml, v1::NcclReport* report) {
  if (xml.size() > kMaxTopologyXmlBytes) {
    report->add_warnings(absl::StrCat("topology XML of ", xml.size(), " bytes left out (limit ",
                                      kMaxTopologyXmlBytes, ")"));
    return;
  }
  std::string kept(xml);
  for (char& ch : kept) {
    const auto u = static_cast<unsigned char>(ch);
    if ((u < 0x20 && ch != '\n' && ch != '\t' && ch != '\r') || u > 0x7e) ch = '?';
  }
  report->set_topology_xml(std::move(kept));
}

void FitNcclReport(v1::NcclReport* report, size_t max_json_bytes) {
  auto size = [&] { return ReportJson(*report).dump().size(); };
  if (size() <= max_json_bytes) return;
  if (!report->topology_xml().empty()) {
    report->clear_topology_xml();
    report->add_warnings("topology XML left out: the report was over one event line");
  }
  int dropped = 0;
  while (size() > max_json_bytes && report->connections_size() > 0) {
    const int keep = report->connections_size() / 2;
    dropped += report->connections_size() - keep;
    report->mutable_connections()->DeleteSubrange(keep, report->connections_size() - keep);
  }
  if (dropped > 0) {
    report->add_warnings(absl::StrCat(dropped,
                                      " connections left out: the report was over one "
                                      "event line"));
  }
  while (size() > max_json_bytes && (report->rings_size() > 0 || report->trees_size() > 0)) {
    report->clear_rings();
    report->clear_trees();
  }
}

NcclLogPlan PlanNcclLog(const std::function<std::optional<std::string>(const std::string&)>& env,
                        int rank, int local_rank, const std::string& dir, const std::string& host,
                        int pid) {
  NcclLogPlan plan;
  auto set_default = [&](const std::string& name, const std::string& value) {
    std::optional<std::string> current = env(name);
    if (current && !current->empty()) return *current;
    plan.set_env.emplace_back(name, value);
    return value;
  };
  set_default("NCCL_DEBUG", "INFO");
  set_default("NCCL_DEBUG_SUBSYS", "INIT,GRAPH,NET");
  plan.debug_file = absl::StrReplaceAll(
      set_default("NCCL_DEBUG_FILE", absl::StrCat(dir, "/nccl-rank", rank, ".log")),
      {{"%h", host}, {"%p", absl::StrCat(pid)}});
  if (local_rank == 0) {
    plan.topo_file =
        set_default("NCCL_TOPO_DUMP_FILE", absl::StrCat(dir, "/nccl-topo-rank", rank, ".xml"));
    set_default("NCCL_TOPO_DUMP_FILE_RANK", absl::StrCat(rank));
  }
  return plan;
}

namespace {

// Up to `max` bytes of `path`; NOT_FOUND when it cannot be opened.
absl::StatusOr<std::string> ReadBounded(const std::string& path, size_t max) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::string text(max, '\0');
  in.read(text.data(), static_cast<std::streamsize>(max));
  text.resize(static_cast<size_t>(in.gcount()));
  return text;
}

}  // namespace

absl::StatusOr<v1::NcclReport> ReadNcclReport(const NcclLogPlan& plan, int rank,
                                              const std::string& host) {
  auto log = ReadBounded(plan.debug_file, kMaxNcclLogBytes + 1);
  if (!log.ok()) {
    return absl::NotFoundError(
        absl::StrCat("NCCL wrote no log at ", plan.debug_file, " (is NCCL_DEBUG INFO?)"));
  }
  v1::NcclReport report = ParseNcclLog(*log, rank);
  if (report.host().empty()) report.set_host(Clean(host));
  if (!plan.topo_file.empty()) {
    if (auto xml = ReadBounded(plan.topo_file, kMaxTopologyXmlBytes + 1); xml.ok()) {
      SetTopologyXml(*xml, &report);
    }
  }
  FitNcclReport(&report, kMaxReportJsonBytes);
  return report;
}

void ReportNcclTopology(const NcclLogPlan& plan, int rank, const std::string& host,
                        EventSink* events) {
  auto report = ReadNcclReport(plan, rank, host);
  if (!report.ok()) {
    events->Emit("warning", {{"message", absl::StrCat("rank ", rank, ": no NCCL topology report: ",
                                                      report.status().message())}});
    return;
  }
  events->Emit("topology", {{"rank", rank}, {"report", ReportJson(*report)}});
}

}  // namespace trainctl::trainer
