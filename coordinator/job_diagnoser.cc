#include "coordinator/job_diagnoser.h"

#include <map>
#include <utility>

#include "common/status_macros.h"
#include "coordinator/diagnosis.h"

namespace trainctl {
namespace {

namespace v1 = trainctl::v1;

constexpr int kEventPage = 1000;

}  // namespace

absl::StatusOr<v1::DiagnoseJobResponse> JobDiagnoser::Diagnose(absl::string_view job_id) const {
  ASSIGN_OR_RETURN(Job job, store_->GetJob(job_id));
  v1::DiagnoseJobResponse response;
  response.set_job_id(job.id());

  // The latest attempt's reports: a new attempt (a transition to RUNNING) starts them afresh.
  std::map<int, v1::NcclReport> nccl;
  std::optional<v1::BandwidthReport> bandwidth;
  for (int64_t after = 0;;) {
    ASSIGN_OR_RETURN(std::vector<JobEvent> events, store_->ListEvents(job.id(), after, kEventPage));
    for (JobEvent& e : events) {
      after = e.seq();
      if (e.has_state_change() && e.state_change().to() == v1::JOB_STATE_RUNNING) {
        nccl.clear();
        bandwidth.reset();
      } else if (e.has_nccl()) {
        nccl[e.nccl().rank()] = std::move(*e.mutable_nccl());
      } else if (e.has_bandwidth()) {
        bandwidth = std::move(*e.mutable_bandwidth());
      }
    }
    if (static_cast<int>(events.size()) < kEventPage) break;
  }

  DiagnosisInputs in;
  const int slots = job.spec().resources().has_slots_per_node()
                        ? std::max(job.spec().resources().slots_per_node(), 1)
                        : 1;
  for (int i = 0; i < job.nodes_size(); ++i) {
    const std::string& node = job.nodes(i);
    for (int local = 0; local < slots; ++local) in.rank_nodes[i * slots + local] = node;
    if (!topology_) continue;
    ASSIGN_OR_RETURN(std::optional<v1::NodeTopology> topology, topology_(node));
    v1::NodeTopology t = topology.has_value() ? std::move(*topology) : v1::NodeTopology();
    t.set_node(node);
    if (!topology.has_value()) t.add_probe_errors("the node's worker has sent no topology");
    in.nodes.push_back(t);
  }
  for (auto& [rank, report] : nccl) in.nccl.push_back(report);
  in.bandwidth = bandwidth;
  in.job_env.insert(job.spec().env().begin(), job.spec().env().end());

  for (const v1::NodeTopology& t : in.nodes) *response.add_nodes() = t;
  for (const v1::NcclReport& r : in.nccl) *response.add_nccl() = r;
  if (bandwidth.has_value()) *response.mutable_bandwidth() = *bandwidth;
  for (v1::Finding& f : trainctl::Diagnose(in)) *response.add_findings() = std::move(f);
  return response;
}

}  // namespace trainctl
