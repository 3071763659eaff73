// JobDiagnoser: answers DiagnoseJob. Gathers what is known about a job's interconnect — the
// topology of its current nodes (as last probed by their workers), the NCCL report of each rank and
// the bandwidth probe of its latest attempt (from its stored events) — and runs the rules of
// coordinator/diagnosis.h over them. The events can be read incrementally (JobDiagnostics), so the
// findings metric follows running jobs without rereading their history on every scrape.
//
// Thread-safe if the store and the lookup are.
#ifndef TRAINCTL_COORDINATOR_JOB_DIAGNOSER_H_
#define TRAINCTL_COORDINATOR_JOB_DIAGNOSER_H_

#include <functional>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "coordinator/job_store.h"
#include "trainctl/v1/diagnostics.pb.h"

namespace trainctl {

// What a job's events said about its interconnect, up to `after_seq`: the latest attempt's.
struct JobDiagnostics {
  int64_t after_seq = 0;
  std::map<int, trainctl::v1::NcclReport> nccl;  // by rank
  std::optional<trainctl::v1::BandwidthReport> bandwidth;
};

class JobDiagnoser {
 public:
  // A node's last topology probe; nullopt when the node never sent one.
  using TopologyLookup =
      std::function<absl::StatusOr<std::optional<trainctl::v1::NodeTopology>>(const std::string&)>;

  // Does not take ownership of `store`, which must outlive this. Without a lookup the nodes are
  // listed with a probe error saying so.
  JobDiagnoser(JobStore* store, TopologyLookup topology)
      : store_(store), topology_(std::move(topology)) {}

  // NOT_FOUND for an unknown job; the store's error otherwise. A job that never ran answers with
  // no nodes, reports or findings.
  absl::StatusOr<trainctl::v1::DiagnoseJobResponse> Diagnose(absl::string_view job_id) const;

  // Reads the events of `job_id` after state->after_seq into `state`. Returns whether anything
  // the diagnosis depends on arrived (a report, a probe, a new attempt).
  absl::StatusOr<bool> Advance(absl::string_view job_id, JobDiagnostics* state) const;

  // The diagnosis of `job` from what `state` holds and its nodes' topology.
  absl::StatusOr<trainctl::v1::DiagnoseJobResponse> Build(const Job& job,
                                                          const JobDiagnostics& state) const;

 private:
  JobStore* const store_;
  const TopologyLookup topology_;
};

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_JOB_DIAGNOSER_H_
