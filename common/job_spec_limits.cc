// The size limits of a job spec (common/job_spec.h) and its maps' keys, checked field by field.
#include <string>

#include "absl/strings/str_cat.h"
#include "common/internal/spec_checker.h"
#include "common/job_spec.h"
#include "common/rank_env.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace trainctl::internal {
namespace {

using trainctl::v1::JobSpec;

// Every string field of `msg` (nested messages included) but `exempt` within kMaxSpecStringBytes.
void CheckStringSizes(const google::protobuf::Message& msg, const std::string& path,
                      const google::protobuf::FieldDescriptor* exempt, Checker& c) {
  using google::protobuf::FieldDescriptor;
  const auto* r = msg.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(msg, &fields);
  for (const FieldDescriptor* field : fields) {
    if (field == exempt || field->is_map()) continue;  // maps: CheckMaps
    const std::string field_path = absl::StrCat(path, ".", field->name());
    const int count = field->is_repeated() ? r->FieldSize(msg, field) : 1;
    for (int i = 0; i < count; ++i) {
      const std::string item_path =
          field->is_repeated() ? absl::StrCat(field_path, "[", i, "]") : field_path;
      if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
        CheckStringSizes(
            field->is_repeated() ? r->GetRepeatedMessage(msg, field, i) : r->GetMessage(msg, field),
            item_path, exempt, c);
      } else if (field->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
        const std::string value =
            field->is_repeated() ? r->GetRepeatedString(msg, field, i) : r->GetString(msg, field);
        if (value.size() > kMaxSpecStringBytes) {
          c.Fail(item_path,
                 absl::StrCat(value.size(), " bytes, over the limit of ", kMaxSpecStringBytes));
        }
      }
    }
  }
}

// Entry count, key and value sizes of one of the spec's string maps.
void CheckMapSizes(const std::string& path,
                   const google::protobuf::Map<std::string, std::string>& map, int max_entries,
                   Checker& c) {
  if (map.size() > static_cast<size_t>(max_entries)) {
    c.Fail(path, absl::StrCat(map.size(), " entries, over the limit of ", max_entries));
  }
  for (const auto& [key, value] : map) {
    const std::string shown = key.size() > 40 ? key.substr(0, 37) + "..." : key;
    if (key.size() > kMaxMapKeyBytes) {
      c.Fail(absl::StrCat(path, ".", shown),
             absl::StrCat("key is ", key.size(), " bytes, over the limit of ", kMaxMapKeyBytes));
    }
    if (value.size() > kMaxSpecStringBytes) {
      c.Fail(absl::StrCat(path, ".", shown),
             absl::StrCat(value.size(), " bytes, over the limit of ", kMaxSpecStringBytes));
    }
  }
}

// The limits above: a spec that passes them has a bounded size in every list and message.

}  // namespace

void CheckSizes(const JobSpec& spec, Checker& c) {
  if (spec.ByteSizeLong() > kMaxSpecBytes) {
    c.Fail("spec", absl::StrCat(spec.ByteSizeLong(), " bytes serialized, over the limit of ",
                                kMaxSpecBytes));
  }
  if (spec.deepspeed_config_json().size() > kMaxDeepSpeedConfigBytes) {
    c.Fail("spec.deepspeed_config_json",
           absl::StrCat(spec.deepspeed_config_json().size(), " bytes, over the limit of ",
                        kMaxDeepSpeedConfigBytes));
  }
  CheckStringSizes(spec, "spec", JobSpec::descriptor()->FindFieldByName("deepspeed_config_json"),
                   c);
  CheckMapSizes("spec.env", spec.env(), kMaxEnvEntries, c);
  CheckMapSizes("spec.labels", spec.labels(), kMaxLabelEntries, c);
  CheckMapSizes("spec.node_selector", spec.node_selector(), kMaxLabelEntries, c);
  if (spec.stages_size() > kMaxStages) {
    c.Fail("spec.stages",
           absl::StrCat(spec.stages_size(), " stages, over the limit of ", kMaxStages));
  }
}

void CheckMaps(const JobSpec& spec, Checker& c) {
  for (const auto& [key, value] : spec.env()) {
    if (!IsEnvName(key)) {
      c.Fail("spec.env." + key, "not a valid environment variable name");
    }
    for (const std::string& reserved : WorkerSetVariables()) {
      if (key == reserved) c.Fail("spec.env." + key, "set by the worker for each rank; remove it");
    }
  }
  for (const auto& [key, value] : spec.node_selector()) {
    if (value.empty()) c.Fail("spec.node_selector." + key, "value must not be empty");
  }
}

}  // namespace trainctl::internal
