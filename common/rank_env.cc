#include "common/rank_env.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

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

}  // namespace

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
