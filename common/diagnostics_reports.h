// The reports the trainer sends as `topology` and `bandwidth` events (NcclReport, BandwidthReport
// in proto/trainctl/v1/diagnostics.proto): their limits, their JSON form inside an event line, and
// the checks the coordinator holds them to (a rank's event is bytes from outside the coordinator).
//
// Event lines: {"type":"topology","time":T,"rank":R,"report":{<NcclReport as proto JSON>}} and
// {"type":"bandwidth","time":T,"report":{<BandwidthReport as proto JSON>}}. A line is at most
// kMaxLineBytes (common/worker_limits.h), so the trainer fits a report into kMaxReportJsonBytes.
// Pure functions, thread-safe.
#ifndef TRAINCTL_COMMON_DIAGNOSTICS_REPORTS_H_
#define TRAINCTL_COMMON_DIAGNOSTICS_REPORTS_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/message.h"
#include "nlohmann/json.hpp"
#include "trainctl/v1/diagnostics.pb.h"

namespace trainctl {

inline constexpr int kMaxNcclConnections = 256;
inline constexpr int kMaxNcclPaths = 64;  // rings, and trees, each
inline constexpr int kMaxNcclNics = 32;
inline constexpr int kMaxNcclEnv = 64;
inline constexpr int kMaxNcclWarnings = 16;
inline constexpr size_t kMaxNcclTextBytes = 512;  // every string but topology_xml
inline constexpr size_t kMaxTopologyXmlBytes = 16 << 10;
inline constexpr int kMaxBandwidthRows = 3 * 32;  // three collectives x kMaxProbeSizes
inline constexpr int kMaxBandwidthRanks = 1 << 16;
// A report's JSON within one event line, with room for the line's other fields.
inline constexpr size_t kMaxReportJsonBytes = 60 << 10;

// INVALID_ARGUMENT naming the first field out of range ("nccl.connections[3].from_rank: must be in
// [0, 1048576), got -2"), a list over its limit, or a string over kMaxNcclTextBytes.
absl::Status CheckNcclReport(const trainctl::v1::NcclReport& report);
// Rows name a known collective, sizes are positive, times and bandwidths finite and >= 0, and
// rank_time_us has world_size entries (or none).
absl::Status CheckBandwidthReport(const trainctl::v1::BandwidthReport& report);

// The cell `nvidia-smi topo -m` prints for a link type: "X", "NV18" (with `nvlinks`), "PIX", "PXB",
// "PHB", "NODE", "SYS"; "?" when unknown. The CLI's tables and the diagnosis's evidence use it.
std::string LinkTypeName(trainctl::v1::LinkType type, int nvlinks);

// The message as proto JSON with the proto's field names.
nlohmann::json ReportJson(const google::protobuf::Message& report);

// The report of a parsed `topology` / `bandwidth` event line: INVALID_ARGUMENT when "report" is
// missing, is not the message's JSON, or fails the checks above.
absl::StatusOr<trainctl::v1::NcclReport> NcclReportFromEvent(const nlohmann::json& event);
absl::StatusOr<trainctl::v1::BandwidthReport> BandwidthReportFromEvent(const nlohmann::json& event);

}  // namespace trainctl

#endif  // TRAINCTL_COMMON_DIAGNOSTICS_REPORTS_H_
