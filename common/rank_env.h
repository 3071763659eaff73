// Which environment variables a job's `env` may set in its ranks. A rank runs trusted binaries (the
// trainer, libc's loader, LibTorch, NCCL, CUDA) as the worker's user or --rank_user; a variable
// such as LD_PRELOAD, LD_AUDIT or CUDA_INJECTION64_PATH would make them load code the submitter
// chose. So `env` is an allowlist: names that match an exact name or a PREFIX_* pattern, minus the
// variables inside those prefixes that load code or write files where the submitter says
// (kDeniedInPrefixes). The coordinator checks it at submit, `trainctl validate` with the default
// list, and the worker again before it starts ranks (a spec may come from an older coordinator).
// Operators extend it with --rank_env_allow on the coordinator and the workers; an exact name they
// list is allowed even when it is one of the denied ones.
#ifndef TRAINCTL_COMMON_RANK_ENV_H_
#define TRAINCTL_COMMON_RANK_ENV_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/map.h"

namespace trainctl {

class RankEnvPolicy {
 public:
  // The default list: DefaultPatterns().
  RankEnvPolicy();

  // The default list plus `extra`, a comma-separated list of exact names and PREFIX_* patterns
  // ("MY_FLAG,MYLIB_*"; whitespace around items ignored, empty items skipped). INVALID_ARGUMENT
  // naming the item that is neither a valid variable name nor a name followed by one '*'.
  static absl::StatusOr<RankEnvPolicy> WithExtra(absl::string_view extra);

  // "" when a job may set `name`; else why not, e.g. "not in the ranks' environment allowlist
  // (NCCL_*, ...)". Names that are not [A-Za-z_][A-Za-z0-9_]* are refused too.
  std::string Refusal(absl::string_view name) const;

  // Every pattern in force, the defaults first, for messages and logs.
  const std::vector<std::string>& patterns() const { return patterns_; }

  // NCCL_*, CUDA_*, OMP_*, TORCH_*, PYTORCH_*, HF_*, TOKENIZERS_*, TRAINCTL_* (the trainer's own
  // knobs; those the worker sets per rank are reserved by the spec checks), OPENAI_API_KEY and
  // GLOO_SOCKET_IFNAME, which the trainer reads, and MALLOC_ARENA_MAX (glibc's arenas per process).
  static const std::vector<std::string>& DefaultPatterns();
  // Names within the default prefixes that are refused unless listed exactly by an operator:
  // library injection (CUDA_INJECTION64_PATH, NCCL_*_PLUGIN, OMP_TOOL_LIBRARIES), NCCL's config
  // file (it may set any NCCL_ variable, plugins included) and files written at a path the job
  // names (NCCL_DEBUG_FILE, ...).
  static const std::vector<std::string>& DeniedInPrefixes();

 private:
  std::vector<std::string> patterns_;
  std::vector<std::string> exact_extra_;  // the operator's exact names (override the denied ones)
};

// [A-Za-z_][A-Za-z0-9_]*.
bool IsEnvName(absl::string_view name);

// One error per refused name of `env`, "<path>.<NAME>: <refusal>", in name order: the first 8,
// then "<path>.<NAME>: refused likewise, with N more variables after it", so that the message
// stays small. Names over
// 40 bytes are shown cut ("...").
std::vector<std::string> RankEnvErrors(const google::protobuf::Map<std::string, std::string>& env,
                                       const RankEnvPolicy& policy, absl::string_view path);

}  // namespace trainctl

#endif  // TRAINCTL_COMMON_RANK_ENV_H_
