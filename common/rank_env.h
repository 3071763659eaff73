// The environment of a rank, both halves of it:
// - RankEnv: what the worker's launcher sets in every rank (torchrun's names and trainctl's own)
//   and the trainer's switches. The worker writes it (WorkerVariables); the trainer's main reads it
//   once (RankEnv::FromProcess) and passes it down, so nothing below the trainer's main reads the
//   environment.
// - RankEnvPolicy: which variables a job's `env` may add. A rank runs trusted binaries (the
//   trainer, libc's loader, LibTorch, NCCL, CUDA) as the worker's user or --rank_user; a variable
//   such as LD_PRELOAD, LD_AUDIT or CUDA_INJECTION64_PATH would make them load code the submitter
//   chose. So `env` is an allowlist: names that match an exact name or a PREFIX_* pattern, minus
//   the variables inside those prefixes that load code or write files where the submitter says
//   (kDeniedInPrefixes). The coordinator checks it at submit, `trainctl validate` with the default
//   list, and the worker again before it starts ranks (a spec may come from an older coordinator).
//   Operators extend it with --rank_env_allow on the coordinator and the workers; an exact name
//   they list is allowed even when it is one of the denied ones.
#ifndef TRAINCTL_COMMON_RANK_ENV_H_
#define TRAINCTL_COMMON_RANK_ENV_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/map.h"

namespace trainctl {

// The variable that names a rank's event pipe (the worker's launcher sets it to its fd).
inline constexpr char kRankEventFdVariable[] = "TRAINCTL_EVENT_FD";

struct RankEnv {
  // Set by the worker for each rank (WorkerVariables, plus TRAINCTL_EVENT_FD and, on GPU nodes,
  // CUDA_VISIBLE_DEVICES); a job's env may not set them (WorkerSetVariables).
  int rank = 0;                           // RANK
  int local_rank = 0;                     // LOCAL_RANK: the rank's index on its node
  int world_size = 1;                     // WORLD_SIZE
  int local_world_size = 1;               // LOCAL_WORLD_SIZE
  int node_rank = 0;                      // NODE_RANK
  std::string master_addr = "127.0.0.1";  // MASTER_ADDR: the rendezvous host
  int master_port = 0;                    // MASTER_PORT: required when world_size > 1
  std::string node_addr;                  // TRAINCTL_NODE_ADDR: this node's advertised address
  std::string job_id;                     // TRAINCTL_JOB_ID
  std::string task_id;                    // TRAINCTL_TASK_ID
  int attempt = 0;                        // TRAINCTL_ATTEMPT
  int event_fd = -1;                      // TRAINCTL_EVENT_FD; -1 when the trainer runs alone

  // The trainer's switches, which a job's env (or a user running the trainer alone) may set.
  bool single_rank_group = false;    // TRAINCTL_COMM_SINGLE_RANK_GROUP=1: a group even alone
  std::string attention;             // TRAINCTL_ATTENTION: auto|eager|sdpa, as written
  std::string peak_flops;            // TRAINCTL_PEAK_FLOPS, as written (the MFU's denominator)
  uint64_t address_space_limit = 0;  // TRAINCTL_TEST_ADDRESS_SPACE_LIMIT (tests only); 0: none
  std::string model_registry;        // TRAINCTL_MODEL_REGISTRY: named model configs' folder
  std::string openai_api_key;        // OPENAI_API_KEY: a teacher endpoint's key
  std::string gloo_socket_ifname;    // GLOO_SOCKET_IFNAME: the interface Gloo binds to
  std::map<std::string, std::string> nccl;  // every NCCL_* variable, as NCCL itself reads them

  // RANK .. TRAINCTL_ATTEMPT as the worker sets them for this rank (not TRAINCTL_EVENT_FD, which
  // the launcher sets to the pipe it opens, nor CUDA_VISIBLE_DEVICES, nor the switches).
  std::map<std::string, std::string> WorkerVariables() const;

  // Fills `out` from a rank's variables. INVALID_ARGUMENT naming the variable when one is
  // malformed or out of range (RANK >= WORLD_SIZE, no MASTER_PORT for several ranks, ...); `out`
  // then still holds what was read before it, TRAINCTL_EVENT_FD first, so the error can be
  // reported on the event pipe.
  static absl::Status Parse(const std::map<std::string, std::string>& variables, RankEnv* out);
  // Parse(this process's environment). Only the trainer's main calls it (for `train`).
  static absl::Status FromProcess(RankEnv* out);
};

// This process's environment as name -> value (entries without '=' left out): what the worker
// passes on to its ranks and what RankEnv::FromProcess parses.
std::map<std::string, std::string> ProcessEnvironment();

// The names the worker sets in every rank, which a job's env may not set: WorkerVariables' names,
// TRAINCTL_EVENT_FD and CUDA_VISIBLE_DEVICES.
const std::vector<std::string>& WorkerSetVariables();

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
