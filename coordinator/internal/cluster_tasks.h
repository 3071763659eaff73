// Names and descriptions of a run's tasks, shared by the gang runner's and the cluster's files.
#ifndef TRAINCTL_COORDINATOR_INTERNAL_CLUSTER_TASKS_H_
#define TRAINCTL_COORDINATOR_INTERNAL_CLUSTER_TASKS_H_

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "trainctl/v1/worker.pb.h"

namespace trainctl::internal {

inline bool TaskEnded(trainctl::v1::TaskState state) {
  return state == trainctl::v1::TASK_STATE_SUCCEEDED || state == trainctl::v1::TASK_STATE_FAILED ||
         state == trainctl::v1::TASK_STATE_CANCELLED;
}

inline std::string TaskId(const std::string& job_id, int attempt, int node_rank) {
  return absl::StrCat(job_id, ".", attempt, ".", node_rank);
}

// The id of a task of the job's current attempt: "job-7.0.1" (attempt 0, node rank 1); a
// pipeline's names its stage too, "job-7.s2.0.1", since every stage counts attempts from 0.
inline std::string TaskIdOf(const trainctl::v1::Job& job, int node_rank) {
  if (job.spec().kind() != trainctl::v1::JOB_KIND_PIPELINE) {
    return TaskId(job.id(), job.attempt(), node_rank);
  }
  return absl::StrCat(job.id(), ".s", job.current_stage(), ".", job.attempt(), ".", node_rank);
}

// "rank 3 on node-b exited with code 1" plus its last lines.
inline std::string DescribeFailure(const std::string& node,
                                   const trainctl::v1::TaskStatus& status) {
  std::string why;
  if (status.failed_rank() < 0) {
    why = absl::StrCat("launch on ", node, " failed");
  } else if (status.signal() != 0) {
    why = absl::StrCat("rank ", status.failed_rank(), " on ", node, " was killed by signal ",
                       status.signal());
  } else {
    why = absl::StrCat("rank ", status.failed_rank(), " on ", node, " exited with code ",
                       status.exit_code());
  }
  if (!status.message().empty()) absl::StrAppend(&why, ": ", status.message());
  if (status.last_log_lines_size() > 0) {
    const int n = status.last_log_lines_size();
    const int from = std::max(0, n - 5);
    std::vector<std::string> tail(status.last_log_lines().begin() + from,
                                  status.last_log_lines().end());
    absl::StrAppend(&why, "; last lines:\n  ", absl::StrJoin(tail, "\n  "));
  }
  return why;
}

}  // namespace trainctl::internal

#endif  // TRAINCTL_COORDINATOR_INTERNAL_CLUSTER_TASKS_H_
