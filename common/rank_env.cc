#include "common/rank_env.h"

#include <unistd.h>

#include <algorithm>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

extern char** environ;

namespace trainctl {
namespace {

// How much of the allowlist a refusal quotes (an operator's list may be long).
constexpr size_t kMaxListBytes = 256;

bool Matches(absl::string_view pattern, absl::string_view name) {
  if (absl::EndsWith(pattern, "*")) {
    return absl::StartsWith(name, pattern.substr(0, pattern.size() - 1));
  }
  return pattern == name;
}

bool Contains(const std::vector<std::string>& list, absl::string_view name) {
  return std::find(list.begin(), list.end(), name) != list.end();
}

// The value of `name`, or "" when it is unset.
std::string Get(const std::map<std::string, std::string>& vars, const char* name) {
  auto it = vars.find(name);
  return it == vars.end() ? std::string() : it->second;
}

// `name` as an integer >= `min` into *out; *out stays as it is when `name` is unset or empty.
absl::Status ParseInt(const std::map<std::string, std::string>& vars, const char* name, int min,
                      int* out) {
  const std::string raw = Get(vars, name);
  if (raw.empty()) return absl::OkStatus();
  int value = 0;
  if (!absl::SimpleAtoi(raw, &value) || value < min) {
    return absl::InvalidArgumentError(absl::StrCat(
        "environment variable ", name, ": must be an integer >= ", min, ", got '", raw, "'"));
  }
  *out = value;
  return absl::OkStatus();
}

}  // namespace

std::map<std::string, std::string> RankEnv::WorkerVariables() const {
  return {{"RANK", absl::StrCat(rank)},
          {"LOCAL_RANK", absl::StrCat(local_rank)},
          {"WORLD_SIZE", absl::StrCat(world_size)},
          {"LOCAL_WORLD_SIZE", absl::StrCat(local_world_size)},
          {"NODE_RANK", absl::StrCat(node_rank)},
          {"MASTER_ADDR", master_addr},
          {"MASTER_PORT", absl::StrCat(master_port)},
          {"TRAINCTL_NODE_ADDR", node_addr},
          {"TRAINCTL_JOB_ID", job_id},
          {"TRAINCTL_TASK_ID", task_id},
          {"TRAINCTL_ATTEMPT", absl::StrCat(attempt)}};
}

const std::vector<std::string>& WorkerSetVariables() {
  static const auto* const names = [] {
    auto* out = new std::vector<std::string>;
    for (const auto& [name, value] : RankEnv().WorkerVariables()) out->push_back(name);
    out->push_back(kRankEventFdVariable);
    out->push_back("CUDA_VISIBLE_DEVICES");
    return out;
  }();
  return *names;
}

absl::Status RankEnv::Parse(const std::map<std::string, std::string>& vars, RankEnv* out) {
  RankEnv& env = *out;
  env = RankEnv();
  for (const auto& [name, min, field] :
       {std::tuple<const char*, int, int*>{kRankEventFdVariable, 0, &env.event_fd},
        {"WORLD_SIZE", 1, &env.world_size},
        {"RANK", 0, &env.rank},
        {"LOCAL_RANK", 0, &env.local_rank},
        {"LOCAL_WORLD_SIZE", 1, &env.local_world_size},
        {"NODE_RANK", 0, &env.node_rank},
        {"MASTER_PORT", 1, &env.master_port},
        {"TRAINCTL_ATTEMPT", 0, &env.attempt}}) {
    RETURN_IF_ERROR(ParseInt(vars, name, min, field));
  }
  if (env.rank >= env.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "environment variable RANK: must be < WORLD_SIZE (", env.world_size, "), got ", env.rank));
  }
  env.single_rank_group = Get(vars, "TRAINCTL_COMM_SINGLE_RANK_GROUP") == "1";
  // The rendezvous port matters only where a process group forms.
  if (env.world_size > 1 || env.single_rank_group) {
    if (env.master_port == 0 || env.master_port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          "environment variable MASTER_PORT: a port in [1, 65535] is required ",
          env.world_size > 1 ? "when WORLD_SIZE > 1" : "with TRAINCTL_COMM_SINGLE_RANK_GROUP=1"));
    }
  }
  if (std::string addr = Get(vars, "MASTER_ADDR"); !addr.empty()) env.master_addr = addr;
  if (const std::string raw = Get(vars, "TRAINCTL_TEST_ADDRESS_SPACE_LIMIT"); !raw.empty()) {
    if (!absl::SimpleAtoi(raw, &env.address_space_limit) || env.address_space_limit == 0) {
      env.address_space_limit = 0;
      return absl::InvalidArgumentError(
          "environment variable TRAINCTL_TEST_ADDRESS_SPACE_LIMIT: must be a positive number of "
          "bytes");
    }
  }
  env.node_addr = Get(vars, "TRAINCTL_NODE_ADDR");
  env.job_id = Get(vars, "TRAINCTL_JOB_ID");
  env.task_id = Get(vars, "TRAINCTL_TASK_ID");
  env.attention = Get(vars, "TRAINCTL_ATTENTION");
  env.peak_flops = Get(vars, "TRAINCTL_PEAK_FLOPS");
  env.model_registry = Get(vars, "TRAINCTL_MODEL_REGISTRY");
  env.openai_api_key = Get(vars, "OPENAI_API_KEY");
  env.gloo_socket_ifname = Get(vars, "GLOO_SOCKET_IFNAME");
  for (const auto& [name, value] : vars) {
    if (absl::StartsWith(name, "NCCL_")) env.nccl.emplace(name, value);
  }
  return absl::OkStatus();
}

std::map<std::string, std::string> ProcessEnvironment() {
  std::map<std::string, std::string> vars;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const absl::string_view text(*entry);
    const size_t eq = text.find('=');
    if (eq != absl::string_view::npos) {
      vars.emplace(std::string(text.substr(0, eq)), std::string(text.substr(eq + 1)));
    }
  }
  return vars;
}

absl::Status RankEnv::FromProcess(RankEnv* out) { return Parse(ProcessEnvironment(), out); }

bool IsEnvName(absl::string_view name) {
  if (name.empty() || absl::ascii_isdigit(name[0])) return false;
  return std::all_of(name.begin(), name.end(),
                     [](char ch) { return absl::ascii_isalnum(ch) || ch == '_'; });
}

const std::vector<std::string>& RankEnvPolicy::DefaultPatterns() {
  static const auto* const patterns = new std::vector<std::string>{"NCCL_*",
                                                                   "CUDA_*",
                                                                   "OMP_*",
                                                                   "TORCH_*",
                                                                   "PYTORCH_*",
                                                                   "HF_*",
                                                                   "TOKENIZERS_*",
                                                                   "TRAINCTL_*",
                                                                   "OPENAI_API_KEY",
                                                                   "MALLOC_ARENA_MAX",
                                                                   "GLOO_SOCKET_IFNAME"};
  return *patterns;
}

const std::vector<std::string>& RankEnvPolicy::DeniedInPrefixes() {
  static const auto* const names = new std::vector<std::string>{
      "CUDA_INJECTION32_PATH", "CUDA_INJECTION64_PATH", "NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN",
      "NCCL_PROFILER_PLUGIN",  "NCCL_ENV_PLUGIN",       "NCCL_CONF_FILE",  "NCCL_DEBUG_FILE",
      "NCCL_TOPO_FILE",        "NCCL_TOPO_DUMP_FILE",   "NCCL_GRAPH_FILE", "NCCL_GRAPH_DUMP_FILE",
      "OMP_TOOL_LIBRARIES",    "OMP_TOOL_VERBOSE_INIT"};
  return *names;
}

RankEnvPolicy::RankEnvPolicy() : patterns_(DefaultPatterns()) {}

absl::StatusOr<RankEnvPolicy> RankEnvPolicy::WithExtra(absl::string_view extra) {
  RankEnvPolicy policy;
  for (absl::string_view item : absl::StrSplit(extra, ',', absl::SkipWhitespace())) {
    item = absl::StripAsciiWhitespace(item);
    const bool prefix = absl::EndsWith(item, "*");
    const absl::string_view name = prefix ? item.substr(0, item.size() - 1) : item;
    if (!IsEnvName(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", item,
                       "' is neither an environment variable name nor a name followed by '*' "
                       "(a prefix)"));
    }
    policy.patterns_.emplace_back(item);
    if (!prefix) policy.exact_extra_.emplace_back(item);
  }
  return policy;
}

std::string RankEnvPolicy::Refusal(absl::string_view name) const {
  if (!IsEnvName(name)) {
    return "not a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)";
  }
  if (Contains(exact_extra_, name)) return "";
  if (Contains(DeniedInPrefixes(), name)) {
    return "may make the ranks load code or write files the job chooses; a job may not set it "
           "(an operator can allow it by name with --rank_env_allow)";
  }
  if (std::any_of(patterns_.begin(), patterns_.end(),
                  [&](const std::string& p) { return Matches(p, name); })) {
    return "";
  }
  std::string list = absl::StrJoin(patterns_, ", ");
  if (list.size() > kMaxListBytes) list = list.substr(0, kMaxListBytes) + ", ...";
  return absl::StrCat("not in the ranks' environment allowlist (", list,
                      "); an operator can extend it with --rank_env_allow");
}

std::vector<std::string> RankEnvErrors(const google::protobuf::Map<std::string, std::string>& env,
                                       const RankEnvPolicy& policy, absl::string_view path) {
  // A bounded message however many names a spec refuses (an error status travels in gRPC
  // trailers, which have a size limit): kMaxListed lines, then one that counts the rest.
  constexpr size_t kMaxListed = 8;
  std::vector<std::string> names;  // a protobuf Map's order is unspecified
  for (const auto& entry : env) names.push_back(entry.first);
  std::sort(names.begin(), names.end());
  std::vector<std::string> errors;
  std::string first_unlisted;  // the summary line's path is a variable's, not `path` itself
  size_t unlisted = 0;
  for (const std::string& name : names) {
    std::string why = policy.Refusal(name);
    if (why.empty()) continue;
    const std::string shown = name.size() > 40 ? name.substr(0, 37) + "..." : name;
    if (errors.size() < kMaxListed) {
      errors.push_back(absl::StrCat(path, ".", shown, ": ", why));
    } else if (unlisted++ == 0) {
      first_unlisted = shown;
    }
  }
  if (unlisted > 0) {
    errors.push_back(absl::StrCat(path, ".", first_unlisted, ": refused likewise, with ",
                                  unlisted - 1, " more variables after it"));
  }
  return errors;
}

}  // namespace trainctl
