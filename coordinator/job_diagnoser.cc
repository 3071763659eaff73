#include "coordinator/job_diagnoser.h"

#include <algorithm>
#include <utility>

#include "common/status_macros.h"
#include "coordinator/diagnosis.h"

namespace trainctl {
namespace {

namespace v1 = trainctl::v1;

constexpr int kEventPage = 1000;

}  // namespace

absl::StatusOr<bool> JobDiagnoser::Advance(absl::string_view job_id, JobDiagnostics* state) const {
  bool changed = false;
  while (true) {
    ASSIGN_OR_RETURN(std::vector<JobEvent> events,
                     store_->ListEvents(job_id, state->after_seq, kEventPage));
    for (JobEvent& e : events) {
      state->after_seq = e.seq();
      if (e.has_state_change() && e.state_change().to() == v1::JOB_STATE_RUNNING) {
        // A new attempt: what the previous one reported no longer holds.
        changed = changed || !state->nccl.empty() || state->bandwidth.has_value();
        state->nccl.clear();
        state->bandwidth.reset();
      } else if (e.has_nccl()) {
        const int rank = e.nccl().rank();
        state->nccl[rank] = std::move(*e.mutable_nccl());
        changed = true;
      } else if (e.has_bandwidth()) {
        state->bandwidth = std::move(*e.mutable_bandwidth());
        changed = true;
      }
    }
    if (static_cast<int>(events.size()) < kEventPage) return changed;
  }
}

absl::StatusOr<v1::DiagnoseJobResponse> JobDiagnoser::Build(const Job& job,
                                                            const JobDiagnostics& state) const {
  DiagnosisInputs in;
  const int slots = job.spec().resources().has_slots_per_node()
                        ? std::max(job.spec().resources().slots_per_node(), 1)
                        : 1;
  for (int i = 0; i < job.nodes_size(); ++i) {
    const std::string& node = job.nodes(i);
    for (int local = 0; local < slots; ++local) in.rank_nodes[i * slots + local] = node;
    std::optional<v1::NodeTopology> topology;
    if (topology_) {
      ASSIGN_OR_RETURN(topology, topology_(node));
    }
    v1::NodeTopology t = topology.has_value() ? std::move(*topology) : v1::NodeTopology();
    t.set_node(node);
    if (!topology.has_value()) t.add_probe_errors("the node's worker has sent no topology");
    in.nodes.push_back(std::move(t));
  }
  for (const auto& [rank, report] : state.nccl) in.nccl.push_back(report);
  in.bandwidth = state.bandwidth;
  in.job_env.insert(job.spec().env().begin(), job.spec().env().end());

  v1::DiagnoseJobResponse response;
  response.set_job_id(job.id());
  for (const v1::NodeTopology& t : in.nodes) *response.add_nodes() = t;
  for (const v1::NcclReport& r : in.nccl) *response.add_nccl() = r;
  if (in.bandwidth.has_value()) *response.mutable_bandwidth() = *in.bandwidth;
  for (v1::Finding& f : trainctl::Diagnose(in)) *response.add_findings() = std::move(f);
  return response;
}

absl::StatusOr<v1::DiagnoseJobResponse> JobDiagnoser::Diagnose(absl::string_view job_id) const {
  ASSIGN_OR_RETURN(Job job, store_->GetJob(job_id));
  JobDiagnostics state;
  RETURN_IF_ERROR(Advance(job.id(), &state).status());
  return Build(job, state);
}

}  // namespace trainctl
