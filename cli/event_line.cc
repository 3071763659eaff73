#include "cli/event_line.h"

#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/pipeline_view.h"
#include "common/json_proto.h"
#include "common/remedies_spec.h"

namespace trainctl::cli {

namespace v1 = trainctl::v1;
using v1::JobEvent;

std::string StateName(trainctl::v1::JobState state) {
  return EnumNumberName(trainctl::v1::JobState_descriptor(), state);
}

std::string EventLine(const JobEvent& e) {
  switch (e.payload_case()) {
    case JobEvent::kStateChange: {
      const auto& s = e.state_change();
      const std::string from =
          s.from() == trainctl::v1::JOB_STATE_UNSPECIFIED ? "" : StateName(s.from()) + " ";
      return absl::StrCat("state      ", from, "-> ", StateName(s.to()),
                          s.reason().empty() ? "" : absl::StrCat("  (", s.reason(), ")"));
    }
    case JobEvent::kMetric: {
      std::map<std::string, double> sorted(e.metric().values().begin(), e.metric().values().end());
      std::vector<std::string> parts;
      for (const auto& [k, v] : sorted) parts.push_back(absl::StrCat(k, "=", v));
      // A pipeline's metrics name their stage.
      return absl::StrCat("metric     ", e.stage().empty() ? "" : e.stage() + " ", "step ",
                          e.metric().step(), "  ", absl::StrJoin(parts, " "));
    }
    case JobEvent::kCheckpoint:
      return absl::StrCat("checkpoint step ", e.checkpoint().step(), "  ", e.checkpoint().path());
    case JobEvent::kWarning:
      return absl::StrCat("warning    ", e.warning().source(), ": ", e.warning().message());
    case JobEvent::kStageChange:
      return DescribeStageChange(e.stage_change());
    case JobEvent::kRemedy:
      return absl::StrCat("remedy     ", RemedyLine(e.remedy()));
    case JobEvent::kNccl: {
      const v1::NcclReport& r = e.nccl();
      std::map<std::string, int> transports;
      for (const v1::NcclConnection& c : r.connections()) {
        ++transports[c.via().substr(0, c.via().find('/', c.via().find('/') + 1))];
      }
      std::vector<std::string> parts;
      for (const auto& [via, n] : transports) parts.push_back(absl::StrCat(n, "x ", via));
      return absl::StrCat("nccl       rank ", r.rank(), " on ", r.host(), ": NCCL ",
                          r.nccl_version(), ", ", r.nranks(), " ranks on ", r.nnodes(),
                          " node(s), ", r.nchannels(), " channels",
                          parts.empty() ? "" : ", " + absl::StrJoin(parts, ", "),
                          r.gdr_state().empty() ? "" : ", GDR " + r.gdr_state());
    }
    case JobEvent::kBandwidth: {
      const v1::BandwidthReport& b = e.bandwidth();
      std::map<std::string, const v1::BandwidthRow*> largest;
      for (const v1::BandwidthRow& row : b.rows()) {
        const v1::BandwidthRow*& best = largest[row.collective()];
        if (best == nullptr || row.bytes() > best->bytes()) best = &row;
      }
      std::vector<std::string> parts;
      for (const auto& [collective, row] : largest) {
        parts.push_back(absl::StrFormat("%s %.3g GB/s", collective, row->busbw_gbps()));
      }
      return absl::StrCat("bandwidth  ", b.backend(), ", ", b.world_size(),
                          " ranks: busbw at the "
                          "largest size ",
                          absl::StrJoin(parts, ", "), " (trainctl diagnose)");
    }
    case JobEvent::kSetup: {
      const v1::RankSetup& s = e.setup();
      std::string line = absl::StrCat("setup      ", e.stage().empty() ? "" : e.stage() + " ",
                                      s.device(), ", ", s.backend(), ", attention ", s.attention());
      if (!s.deepspeed_filled().empty()) {
        const std::map<std::string, int64_t> sorted(s.deepspeed_filled().begin(),
                                                    s.deepspeed_filled().end());
        std::vector<std::string> parts;
        for (const auto& [key, value] : sorted) parts.push_back(absl::StrCat(key, "=", value));
        absl::StrAppend(&line, "; DeepSpeed from hidden_size ", s.hidden_size(), ": ",
                        absl::StrJoin(parts, " "));
      }
      return line;
    }
    default:
      return "event";
  }
}

}  // namespace trainctl::cli
