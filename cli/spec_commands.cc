#include "cli/spec_commands.h"

#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/event_line.h"
#include "cli/exit_codes.h"
#include "cli/job_client.h"
#include "common/job_spec.h"
#include "common/json_proto.h"
#include "common/memory_plan.h"
#include "common/rank_env.h"
#include "common/seed_flags.h"
#include "nlohmann/json.hpp"

namespace trainctl::cli {
namespace {

using trainctl::v1::JobSpec;

std::string NewRequestId() {
  std::random_device rd;
  std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(getpid()));
  return absl::StrFormat("%016x%016x", gen(), gen());
}

// The job spec that submit and validate work on: FILE and/or the seed's flags, with every field
// that could be read, and what could not (reported with the spec's other problems, at once).
struct BuiltSpec {
  JobSpec spec;
  std::vector<std::string> warnings;
  std::vector<std::string> errors;
};

absl::StatusOr<BuiltSpec> BuildSpec(const ParsedArgs& args) {
  std::vector<std::string> flag_args = args.passthrough;
  std::string file;
  for (const std::string& positional : args.positional) {
    if (absl::EndsWith(positional, ".py")) {
      flag_args.push_back(positional);  // the seed's training script; the flag parser explains
    } else if (file.empty()) {
      file = positional;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument '", positional, "' (one spec FILE at most)"));
    }
  }
  if (file.empty() && flag_args.empty()) {
    return absl::InvalidArgumentError(
        "needs a spec FILE or the seed's flags (--kind sft --model_name_or_path ... ); see "
        "trainctl help");
  }
  BuiltSpec result;
  if (!file.empty()) {
    auto spec = LoadJobSpecFile(file, &result.errors);
    if (!spec.ok()) return spec.status();
    result.spec = std::move(*spec);
  }
  if (!flag_args.empty()) {
    auto flags =
        JobSpecFromFlags(flag_args, std::filesystem::current_path().string(), &result.errors);
    if (!flags.ok()) return flags.status();
    result.spec.MergeFrom(flags->spec);  // flags override the file
    result.warnings = std::move(flags->warnings);
  }
  return result;
}

void PrintWarnings(std::ostream& err, const std::vector<std::string>& warnings) {
  for (const std::string& w : warnings) err << "warning: " << w << '\n';
}

// The plan of a validated spec, for GPU nodes (what the coordinator checks at submit).
absl::StatusOr<trainctl::v1::MemoryPlan> PlanOf(const ValidatedJobSpec& validated) {
  return PlanJobMemory(validated.spec, validated.resolved_deepspeed_config_json,
                       MemoryPlanOptions{});
}

}  // namespace

int ValidateSpec(const ParsedArgs& args, bool json, std::ostream& out, std::ostream& err) {
  auto built = BuildSpec(args);
  if (!built.ok()) return Fail(err, built.status());
  PrintWarnings(err, built->warnings);
  // The env allowlist as a cluster has it by default (an operator may allow more).
  std::vector<std::string> errors = RankEnvErrors(built->spec.env(), RankEnvPolicy(), "spec.env");
  errors.insert(errors.begin(), built->errors.begin(), built->errors.end());
  auto validated = ValidateJobSpec(built->spec, errors);
  if (!validated.ok()) return Fail(err, validated.status());
  PrintWarnings(err, validated->warnings);
  const std::string& ds = validated->resolved_deepspeed_config_json;
  if (ds.empty()) err << "note: the spec has no DeepSpeed config; the trainer runs without ZeRO\n";
  auto plan = PlanOf(*validated);
  if (!plan.ok()) err << "note: no memory plan: " << plan.status().message() << '\n';
  if (!json) {
    out << (ds.empty() ? "{}" : ds) << '\n';
    if (plan.ok()) err << FormatMemoryPlan(*plan);
    return kExitOk;
  }
  nlohmann::json doc = {{"resolved_deepspeed_config", nlohmann::json::object()}};
  if (!ds.empty()) doc["resolved_deepspeed_config"] = nlohmann::json::parse(ds);
  if (plan.ok()) doc["memory_plan"] = nlohmann::json::parse(MessageToJsonText(*plan, false));
  out << doc.dump(2) << '\n';
  return kExitOk;
}

int SubmitSpec(const ParsedArgs& args, bool json, const Connection& connection, std::ostream& out,
               std::ostream& err) {
  auto built = BuildSpec(args);
  if (!built.ok()) return Fail(err, built.status());
  PrintWarnings(err, built->warnings);
  if (!built->errors.empty()) {
    // Not worth a round trip: list what could not be read with what the coordinator would say.
    return Fail(err, ValidateJobSpec(built->spec, built->errors).status());
  }
  trainctl::v1::SubmitJobRequest request;
  *request.mutable_spec() = built->spec;
  request.set_request_id(NewRequestId());
  request.set_force(args.Has("force"));
  JobClient client(connection);
  auto response = client.Submit(request);
  if (!response.ok()) return Fail(err, response.status());
  PrintWarnings(err, {response->warnings().begin(), response->warnings().end()});
  if (json) {
    out << MessageToJsonText(response->job(), /*pretty=*/true) << '\n';
    return kExitOk;
  }
  // Not created: a retried call found the job its first try had submitted.
  out << (response->created() ? "submitted " : "already submitted ") << response->job().id() << " ("
      << response->job().spec().name() << "), " << StateName(response->job().state()) << '\n';
  if (response->job().has_memory_plan()) out << FormatMemoryPlan(response->job().memory_plan());
  return kExitOk;
}

}  // namespace trainctl::cli
