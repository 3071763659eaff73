#include "common/diagnostics_reports.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/worker_limits.h"
#include "google/protobuf/util/json_util.h"

namespace trainctl {
namespace {

namespace v1 = trainctl::v1;

absl::Status Invalid(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

absl::Status CheckText(const std::string& path, const std::string& text, size_t max) {
  if (text.size() > max) {
    return Invalid(path, absl::StrCat(text.size(), " bytes, over the limit of ", max));
  }
  return absl::OkStatus();
}

absl::Status CheckCount(const std::string& path, int count, int max) {
  if (count > max) return Invalid(path, absl::StrCat(count, " entries, over the limit of ", max));
  return absl::OkStatus();
}

absl::Status CheckRank(const std::string& path, int rank, bool allow_unknown) {
  if (rank < (allow_unknown ? -1 : 0) || rank >= kMaxRank) {
    return Invalid(path, absl::StrCat("must be in [0, ", kMaxRank, "), got ", rank));
  }
  return absl::OkStatus();
}

absl::Status CheckPaths(const std::string& path,
                        const google::protobuf::RepeatedPtrField<v1::NcclChannelPath>& paths) {
  if (absl::Status s = CheckCount(path, paths.size(), kMaxNcclPaths); !s.ok()) return s;
  for (int i = 0; i < paths.size(); ++i) {
    const std::string at = absl::StrCat(path, "[", i, "]");
    if (paths[i].channel() < 0 || paths[i].channel() > 1024) {
      return Invalid(at + ".channel",
                     absl::StrCat("must be in [0, 1024], got ", paths[i].channel()));
    }
    if (absl::Status s = CheckText(at + ".path", paths[i].path(), kMaxNcclTextBytes); !s.ok()) {
      return s;
    }
    if (absl::Status s = CheckCount(at + ".ranks", paths[i].ranks_size(), 4096); !s.ok()) return s;
  }
  return absl::OkStatus();
}

bool NonNegative(double v) { return std::isfinite(v) && v >= 0; }

template <typename Message>
absl::StatusOr<Message> FromEvent(const nlohmann::json& event, const char* name) {
  if (!event.is_object() || !event.contains("report") || !event["report"].is_object()) {
    return Invalid(name, "the event carries no \"report\" object");
  }
  Message report;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;  // a newer trainer's fields
  const auto status =
      google::protobuf::util::JsonStringToMessage(event["report"].dump(), &report, options);
  if (!status.ok()) {
    return Invalid(name, absl::StrCat("not a report: ", std::string(status.message())));
  }
  return report;
}

}  // namespace

absl::Status CheckNcclReport(const v1::NcclReport& r) {
  const std::string p = "nccl";
  if (absl::Status s = CheckRank(p + ".rank", r.rank(), false); !s.ok()) return s;
  for (const auto& [name, value] : {std::pair<const char*, int>{"nranks", r.nranks()},
                                    {"nnodes", r.nnodes()},
                                    {"local_ranks", r.local_ranks()},
                                    {"nchannels", r.nchannels()}}) {
    if (value < 0 || value > kMaxRank) {
      return Invalid(absl::StrCat(p, ".", name),
                     absl::StrCat("must be in [0, ", kMaxRank, "], got ", value));
    }
  }
  for (const auto& [name, text] : {std::pair<const char*, const std::string*>{"host", &r.host()},
                                   {"nccl_version", &r.nccl_version()},
                                   {"bus_id", &r.bus_id()},
                                   {"bootstrap_interface", &r.bootstrap_interface()},
                                   {"gdr_state", &r.gdr_state()}}) {
    if (absl::Status s = CheckText(absl::StrCat(p, ".", name), *text, kMaxNcclTextBytes); !s.ok())
      return s;
  }
  if (!r.gdr_state().empty() && r.gdr_state() != "enabled" && r.gdr_state() != "disabled") {
    return Invalid(p + ".gdr_state",
                   absl::StrCat("must be enabled, disabled or empty, got '", r.gdr_state(), "'"));
  }
  if (absl::Status s = CheckText(p + ".topology_xml", r.topology_xml(), kMaxTopologyXmlBytes);
      !s.ok())
    return s;
  if (absl::Status s = CheckPaths(p + ".rings", r.rings()); !s.ok()) return s;
  if (absl::Status s = CheckPaths(p + ".trees", r.trees()); !s.ok()) return s;
  if (absl::Status s = CheckCount(p + ".connections", r.connections_size(), kMaxNcclConnections);
      !s.ok())
    return s;
  for (int i = 0; i < r.connections_size(); ++i) {
    const v1::NcclConnection& c = r.connections(i);
    const std::string at = absl::StrCat(p, ".connections[", i, "]");
    if (absl::Status s = CheckRank(at + ".from_rank", c.from_rank(), false); !s.ok()) return s;
    if (absl::Status s = CheckRank(at + ".to_rank", c.to_rank(), false); !s.ok()) return s;
    if (!v1::NcclTransport_IsValid(c.transport())) {
      return Invalid(at + ".transport", absl::StrCat("unknown value ", c.transport()));
    }
    if (absl::Status s = CheckText(at + ".via", c.via(), kMaxNcclTextBytes); !s.ok()) return s;
    if (absl::Status s = CheckText(at + ".nic", c.nic(), kMaxNcclTextBytes); !s.ok()) return s;
  }
  if (absl::Status s = CheckCount(p + ".nics", r.nics_size(), kMaxNcclNics); !s.ok()) return s;
  for (int i = 0; i < r.nics_size(); ++i) {
    if (absl::Status s = CheckText(absl::StrCat(p, ".nics[", i, "]"), r.nics(i), kMaxNcclTextBytes);
        !s.ok())
      return s;
  }
  if (absl::Status s = CheckCount(p + ".env", r.env_size(), kMaxNcclEnv); !s.ok()) return s;
  for (const auto& [key, value] : r.env()) {
    if (absl::Status s = CheckText(p + ".env", key + value, kMaxNcclTextBytes); !s.ok()) return s;
  }
  if (absl::Status s = CheckCount(p + ".warnings", r.warnings_size(), kMaxNcclWarnings); !s.ok())
    return s;
  for (int i = 0; i < r.warnings_size(); ++i) {
    if (absl::Status s =
            CheckText(absl::StrCat(p, ".warnings[", i, "]"), r.warnings(i), kMaxNcclTextBytes);
        !s.ok())
      return s;
  }
  return absl::OkStatus();
}

absl::Status CheckBandwidthReport(const v1::BandwidthReport& r) {
  const std::string p = "bandwidth";
  if (r.world_size() < 1 || r.world_size() > kMaxBandwidthRanks) {
    return Invalid(p + ".world_size",
                   absl::StrCat("must be in [1, ", kMaxBandwidthRanks, "], got ", r.world_size()));
  }
  if (r.nodes() < 0 || r.nodes() > r.world_size()) {
    return Invalid(p + ".nodes", absl::StrCat("must be in [0, world_size ", r.world_size(),
                                              "], got ", r.nodes()));
  }
  if (r.iterations() < 0) return Invalid(p + ".iterations", "must be >= 0");
  for (const auto& [name, text] :
       {std::pair<const char*, const std::string*>{"backend", &r.backend()},
        {"dtype", &r.dtype()}}) {
    if (absl::Status s = CheckText(absl::StrCat(p, ".", name), *text, 32); !s.ok()) return s;
  }
  if (r.rank_hosts_size() != 0 && r.rank_hosts_size() != r.world_size()) {
    return Invalid(p + ".rank_hosts", absl::StrCat("must have world_size (", r.world_size(),
                                                   ") entries, got ", r.rank_hosts_size()));
  }
  for (int i = 0; i < r.rank_hosts_size(); ++i) {
    if (absl::Status s = CheckText(absl::StrCat(p, ".rank_hosts[", i, "]"), r.rank_hosts(i), 253);
        !s.ok())
      return s;
  }
  if (absl::Status s = CheckCount(p + ".rows", r.rows_size(), kMaxBandwidthRows); !s.ok()) return s;
  for (int i = 0; i < r.rows_size(); ++i) {
    const v1::BandwidthRow& row = r.rows(i);
    const std::string at = absl::StrCat(p, ".rows[", i, "]");
    if (row.collective() != "all_reduce" && row.collective() != "all_gather" &&
        row.collective() != "reduce_scatter") {
      return Invalid(at + ".collective",
                     absl::StrCat("must be all_reduce, all_gather or reduce_scatter, got '",
                                  row.collective().substr(0, 64), "'"));
    }
    if (row.bytes() <= 0)
      return Invalid(at + ".bytes", absl::StrCat("must be > 0, got ", row.bytes()));
    if (!NonNegative(row.time_us()) || !NonNegative(row.algbw_gbps()) ||
        !NonNegative(row.busbw_gbps())) {
      return Invalid(at, "time_us, algbw_gbps and busbw_gbps must be finite and >= 0");
    }
    if (row.rank_time_us_size() != 0 && row.rank_time_us_size() != r.world_size()) {
      return Invalid(at + ".rank_time_us",
                     absl::StrCat("must have world_size (", r.world_size(), ") entries, got ",
                                  row.rank_time_us_size()));
    }
    for (double t : row.rank_time_us()) {
      if (!NonNegative(t)) return Invalid(at + ".rank_time_us", "must be finite and >= 0");
    }
  }
  return absl::OkStatus();
}

nlohmann::json ReportJson(const google::protobuf::Message& report) {
  std::string text;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(report, &text, options);
  return nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
}

absl::StatusOr<v1::NcclReport> NcclReportFromEvent(const nlohmann::json& event) {
  auto report = FromEvent<v1::NcclReport>(event, "nccl");
  if (!report.ok()) return report.status();
  if (absl::Status s = CheckNcclReport(*report); !s.ok()) return s;
  return report;
}

absl::StatusOr<v1::BandwidthReport> BandwidthReportFromEvent(const nlohmann::json& event) {
  auto report = FromEvent<v1::BandwidthReport>(event, "bandwidth");
  if (!report.ok()) return report.status();
  if (absl::Status s = CheckBandwidthReport(*report); !s.ok()) return s;
  return report;
}

std::string LinkTypeName(v1::LinkType type, int nvlinks) {
  switch (type) {
    case v1::LINK_TYPE_SELF:
      return "X";
    case v1::LINK_TYPE_NVLINK:
      return absl::StrCat("NV", nvlinks);
    case v1::LINK_TYPE_PIX:
      return "PIX";
    case v1::LINK_TYPE_PXB:
      return "PXB";
    case v1::LINK_TYPE_PHB:
      return "PHB";
    case v1::LINK_TYPE_NODE:
      return "NODE";
    case v1::LINK_TYPE_SYS:
      return "SYS";
    default:
      return "?";
  }
}

}  // namespace trainctl
