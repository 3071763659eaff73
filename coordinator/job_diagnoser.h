// JobDiagnoser: answers DiagnoseJob. Gathers what is known about a job's interconnect — the
// topology of its current nodes (as last probed by their workers), the NCCL report of each rank and
// the bandwidth probe of its latest attempt (from its stored events) — and runs the rules of
// coordinator/diagnosis.h over them.
//
// Thread-safe if the store and the lookup are.
#ifndef TRAINCTL_COORDINATOR_JOB_DIAGNOSER_H_
#define TRAINCTL_COORDINATOR_JOB_DIAGNOSER_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "coordinator/job_store.h"
#include "trainctl/v1/diagnostics.pb.h"

namespace trainctl {

class JobDiagnoser {
 public:
  // A node's last topology probe; nullopt when the node never sent one.
  using TopologyLookup =
      std::function<absl::StatusOr<std::optional<trainctl::v1::NodeTopology>>(const std::string&)>;

  // Does not take ownership of `store`, which must outlive this.
  JobDiagnoser(JobStore* store, TopologyLookup topology)
      : store_(store), topology_(std::move(topology)) {}

  // NOT_FOUND for an unknown job; the store's error otherwise. A job that never ran answers with
  // no nodes, reports or findings.
  absl::StatusOr<trainctl::v1::DiagnoseJobResponse> Diagnose(absl::string_view job_id) const;

 private:
  JobStore* const store_;
  const TopologyLookup topology_;
};

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_JOB_DIAGNOSER_H_
