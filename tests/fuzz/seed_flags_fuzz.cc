// The seed's launch flags (common/seed_flags.h): one argument per line, parsed as `trainctl
// submit` parses its command line (relative --deepspeed paths against configs/, where the seed's
// ds_zero3_bf16.json is), then validated.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/job_spec.h"
#include "common/seed_flags.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> args = absl::StrSplit(text, '\n', absl::SkipEmpty());
  std::vector<std::string> flag_errors;
  auto flags = trainctl::JobSpecFromFlags(args, TRAINCTL_SOURCE_DIR "/configs", &flag_errors);
  if (!flags.ok()) return 0;
  (void)trainctl::ValidateJobSpec(flags->spec, flag_errors);
  return 0;
}
