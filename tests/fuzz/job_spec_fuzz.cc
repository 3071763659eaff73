// Job spec documents (common/job_spec.h): YAML, or JSON when the text starts with '{', parsed with
// field errors collected, then validated as `trainctl validate` and the coordinator do.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/string_view.h"
#include "common/job_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  const absl::string_view stripped = absl::StripLeadingAsciiWhitespace(text);
  const auto format = !stripped.empty() && stripped.front() == '{' ? trainctl::SpecFormat::kJson
                                                                   : trainctl::SpecFormat::kYaml;
  std::vector<std::string> field_errors;
  auto spec = trainctl::ParseJobSpec(text, format, "fuzz.yaml", &field_errors);
  if (!spec.ok()) return 0;
  (void)trainctl::ValidateJobSpec(*spec, field_errors);
  return 0;
}
