#include "common/seed_flags.h"

#include <algorithm>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_spec.h"
#include "common/json_proto.h"
#include "common/status_macros.h"

namespace trainctl {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using trainctl::v1::JobSpec;

// Where a flag lands: a scalar field of some message inside the spec.
struct FlagTarget {
  Message* msg = nullptr;
  const FieldDescriptor* field = nullptr;
};

constexpr const char* kTopLevelFlags[] = {
    "kind",       "name",     "model_name_or_path", "data_path",    "deepspeed",
    "output_dir", "priority", "max_restarts",       "reward_funcs", "reward_model_name_or_path"};

google::protobuf::Map<std::string, std::string>* MapFlag(const std::string& name, JobSpec* spec) {
  if (name == "env") return spec->mutable_env();
  if (name == "label") return spec->mutable_labels();
  if (name == "node_selector") return spec->mutable_node_selector();
  return nullptr;
}

FlagTarget FindTarget(const std::string& name, JobSpec* spec) {
  if (name == "num_gpus" || name == "slots_per_node") {
    return {spec->mutable_resources(),
            trainctl::v1::Resources::descriptor()->FindFieldByName("slots_per_node")};
  }
  if (name == "nnodes" || name == "nodes") {
    return {spec->mutable_resources(),
            trainctl::v1::Resources::descriptor()->FindFieldByName("nodes")};
  }
  for (const char* top : kTopLevelFlags) {
    if (name == top) return {spec, JobSpec::descriptor()->FindFieldByName(name)};
  }
  if (const auto* field = trainctl::v1::TrainingArguments::descriptor()->FindFieldByName(name)) {
    return {spec->mutable_training(), field};
  }
  return {};
}

std::vector<std::string> AllFlagNames() {
  std::vector<std::string> names = {"num_gpus", "nnodes", "env", "label", "node_selector"};
  for (const char* top : kTopLevelFlags) names.push_back(top);
  const auto* training = trainctl::v1::TrainingArguments::descriptor();
  for (int i = 0; i < training->field_count(); ++i) names.push_back(training->field(i)->name());
  return names;
}

std::string UnknownFlag(const std::string& name) {
  // Suggest the closest known flag when the name is a near miss (typo, dash vs underscore).
  std::string normalized = name;
  std::replace(normalized.begin(), normalized.end(), '-', '_');
  if (IsSeedFlag(normalized))
    return absl::StrCat("--", name, ": unknown flag (did you mean --", normalized, "?)");
  const std::string best = ClosestName(normalized, AllFlagNames());
  if (!best.empty()) return absl::StrCat("--", name, ": unknown flag (did you mean --", best, "?)");
  for (const std::string& known : AllFlagNames()) {
    if (absl::StrContains(known, normalized) || absl::StrContains(normalized, known)) {
      return absl::StrCat("--", name, ": unknown flag (did you mean --", known, "?)");
    }
  }
  return absl::StrCat("--", name, ": unknown flag");
}

}  // namespace

bool IsSeedFlag(const std::string& name) {
  JobSpec scratch;
  return FindTarget(name, &scratch).field != nullptr || MapFlag(name, &scratch) != nullptr;
}

absl::StatusOr<FlagSpec> JobSpecFromFlags(const std::vector<std::string>& args,
                                          const std::string& base_dir,
                                          std::vector<std::string>* flag_errors) {
  FlagSpec out;
  std::vector<std::string> errors;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (!absl::StartsWith(arg, "--")) {
      if (absl::EndsWith(arg, ".py")) {
        out.warnings.push_back(
            absl::StrCat(arg, ": trainctl runs its own trainer; the script is ignored"));
      } else {
        errors.push_back(absl::StrCat(arg, ": unexpected argument (flags are --name value)"));
      }
      continue;
    }
    std::string name = arg.substr(2);
    std::optional<std::string> value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    FlagTarget target = FindTarget(name, &out.spec);
    auto* map = MapFlag(name, &out.spec);
    if (target.field == nullptr && map == nullptr) {
      errors.push_back(UnknownFlag(name));
      if (!value && i + 1 < args.size() && !absl::StartsWith(args[i + 1], "--")) ++i;
      continue;
    }
    const bool is_bool =
        target.field != nullptr && target.field->cpp_type() == FieldDescriptor::CPPTYPE_BOOL;
    if (target.field != nullptr && target.field->is_repeated()) {
      // HF's nargs="+": `--reward_funcs accuracy format`; a repeated flag replaces the list.
      std::vector<std::string> values;
      if (value) values.push_back(*value);
      while (i + 1 < args.size() && !absl::StartsWith(args[i + 1], "--"))
        values.push_back(args[++i]);
      if (values.empty()) {
        errors.push_back(absl::StrCat("--", name, ": needs at least one value"));
        continue;
      }
      target.msg->GetReflection()->ClearField(target.msg, target.field);
      for (const std::string& v : values) {
        if (absl::Status s = SetFieldFromText(v, target.field, target.msg); !s.ok()) {
          errors.push_back(absl::StrCat("--", name, ": ", s.message()));
        }
      }
      continue;
    }
    if (!value) {
      if (i + 1 < args.size() && !absl::StartsWith(args[i + 1], "--")) {
        value = args[++i];
      } else if (is_bool) {
        value = "true";  // HF's parser: a bare boolean flag means True
      } else {
        errors.push_back(absl::StrCat("--", name, ": needs a value"));
        continue;
      }
    }
    if (map != nullptr) {
      const auto eq = value->find('=');
      if (eq == std::string::npos || eq == 0) {
        errors.push_back(absl::StrCat("--", name, ": must be KEY=VALUE, got '", *value, "'"));
        continue;
      }
      (*map)[value->substr(0, eq)] = value->substr(eq + 1);
      continue;
    }
    if (absl::Status s = SetFieldFromText(*value, target.field, target.msg); !s.ok()) {
      errors.push_back(absl::StrCat("--", name, ": ", s.message()));
    }
  }
  absl::Status embedded = EmbedDeepSpeedConfig(base_dir, &out.spec);
  if (!embedded.ok()) errors.push_back(std::string(embedded.message()));
  if (errors.empty()) return out;
  if (flag_errors == nullptr) return absl::InvalidArgumentError(absl::StrJoin(errors, "\n"));
  flag_errors->insert(flag_errors->end(), errors.begin(), errors.end());
  return out;
}

}  // namespace trainctl
