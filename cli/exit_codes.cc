#include "cli/exit_codes.h"

#include "absl/strings/str_split.h"

namespace trainctl::cli {

int Fail(std::ostream& err, const absl::Status& status, int code, std::string_view who) {
  for (absl::string_view line : absl::StrSplit(status.message(), '\n')) {
    err << who << ": " << line << '\n';
  }
  return code;
}

int UsageOrFailed(const absl::Status& status) {
  return status.code() == absl::StatusCode::kInvalidArgument ? kExitUsage : kExitFailed;
}

}  // namespace trainctl::cli
