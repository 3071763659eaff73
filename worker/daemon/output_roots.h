// Where a job may write on this node: the worker's --output_roots (its work_dir when none is
// given). A launch whose output directories resolve elsewhere (symlinks and ".." followed, relative
// paths against this process's working directory, which is the ranks' too) is refused.
#ifndef TRAINCTL_WORKER_DAEMON_OUTPUT_ROOTS_H_
#define TRAINCTL_WORKER_DAEMON_OUTPUT_ROOTS_H_

#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "trainctl/v1/job.pb.h"

namespace trainctl::worker {

class OutputRoots {
 public:
  // `roots` resolved now; `fallback` alone when `roots` is empty.
  OutputRoots(const std::vector<std::string>& roots, const std::string& fallback);

  // INVALID_ARGUMENT naming the field when spec.output_dir or a stage's output directory (its
  // own, else <output_dir>/<stage name>) lies outside every root.
  absl::Status Check(const trainctl::v1::JobSpec& spec) const;

 private:
  std::vector<std::filesystem::path> roots_;  // canonical
};

}  // namespace trainctl::worker

#endif  // TRAINCTL_WORKER_DAEMON_OUTPUT_ROOTS_H_
