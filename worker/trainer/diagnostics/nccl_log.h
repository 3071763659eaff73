// What NCCL did, from its own INFO log: the trainer sets NCCL_DEBUG=INFO with the INIT, GRAPH and
// NET subsystems and a per-rank NCCL_DEBUG_FILE before its process group exists (PlanNcclLog),
// and after the first collective turns that file, and the topology XML local rank 0 dumped, into an
// NcclReport sent as a `topology` event (ReportNcclTopology). Torch-free.
//
// The parser reads what NCCL 2.3 .. 2.2x print ("host:pid:tid [dev] NCCL INFO ..." lines, with
// "Channel 00/0 : 0[0] -> 1[1] via P2P/IPC", older "Channel 00 : ..." and "Ring 00 : ..."), and
// tolerates anything else: unknown lines are skipped, nothing in the input makes it fail, and every
// list and string in the report is bounded (common/diagnostics_reports.h). A log that holds several
// ranks' lines (a whole job's, pasted together) is read from the view of one rank.
#ifndef TRAINCTL_WORKER_TRAINER_DIAGNOSTICS_NCCL_LOG_H_
#define TRAINCTL_WORKER_TRAINER_DIAGNOSTICS_NCCL_LOG_H_

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainctl/v1/diagnostics.pb.h"
#include "worker/trainer/event_sink.h"

namespace trainctl::trainer {

// At most this much of a log is read (the rest is ignored, with a warning in the report).
inline constexpr size_t kMaxNcclLogBytes = 8 << 20;

// The report of `rank` (its communicator line picks its process and device when the log holds
// several; -1: the first communicator's rank). Fields the log does not tell stay unset (0 / "").
trainctl::v1::NcclReport ParseNcclLog(absl::string_view text, int rank);

// Keeps `xml` (NCCL_TOPO_DUMP_FILE's content) in the report when it is within
// kMaxTopologyXmlBytes; otherwise adds a warning saying it was left out.
void SetTopologyXml(absl::string_view xml, trainctl::v1::NcclReport* report);

// Shrinks the report until its JSON fits `max_json_bytes`: the topology XML goes first, then half
// of the connections at a time; each step adds a warning saying what was left out.
void FitNcclReport(trainctl::v1::NcclReport* report, size_t max_json_bytes);

// What the trainer sets before creating an NCCL process group, and the files it reads after.
struct NcclLogPlan {
  std::vector<std::pair<std::string, std::string>> set_env;  // variables the job did not set
  std::string debug_file;  // this rank's NCCL log (NCCL_DEBUG_FILE, %h and %p expanded)
  std::string topo_file;   // local rank 0: the topology XML NCCL dumps; "" otherwise
};

// `env` looks a variable up in the job's environment (nullopt: unset). Variables the job set are
// left as they are: NCCL_DEBUG, NCCL_DEBUG_SUBSYS, NCCL_DEBUG_FILE (then read where it points),
// NCCL_TOPO_DUMP_FILE and NCCL_TOPO_DUMP_FILE_RANK. Files go to `dir`: nccl-rank<R>.log and, on
// local rank 0, nccl-topo-rank<R>.xml (NCCL dumps on the rank NCCL_TOPO_DUMP_FILE_RANK names, so
// that is set to this rank: one dump per node).
NcclLogPlan PlanNcclLog(const std::function<std::optional<std::string>(const std::string&)>& env,
                        int rank, int local_rank, const std::string& dir, const std::string& host,
                        int pid);

// Reads the plan's files (at most kMaxNcclLogBytes of the log) and parses them as `rank`'s, fitted
// into one event line. NOT_FOUND when the log file does not exist (NCCL has not initialised, or
// NCCL_DEBUG is not INFO).
absl::StatusOr<trainctl::v1::NcclReport> ReadNcclReport(const NcclLogPlan& plan, int rank,
                                                        const std::string& host);

// ReadNcclReport, then a `topology` event {"rank": R, "report": {...}}, or a `warning` event
// saying why there is none.
void ReportNcclTopology(const NcclLogPlan& plan, int rank, const std::string& host,
                        EventSink* events);

}  // namespace trainctl::trainer

#endif  // TRAINCTL_WORKER_TRAINER_DIAGNOSTICS_NCCL_LOG_H_
