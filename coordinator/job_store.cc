#include "coordinator/job_store.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace trainctl {

bool IsTransientStoreError(const absl::Status& status) {
  return status.code() == absl::StatusCode::kResourceExhausted ||
         status.code() == absl::StatusCode::kUnavailable;
}

std::string FormatJobId(int64_t n) { return absl::StrCat("job-", n); }

absl::StatusOr<int64_t> ParseJobId(absl::string_view id) {
  absl::string_view digits = id;
  if (absl::StartsWith(digits, "job-")) digits.remove_prefix(4);
  int64_t n = 0;
  if (digits.empty() || digits.find_first_not_of("0123456789") != absl::string_view::npos ||
      !absl::SimpleAtoi(digits, &n) || n <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid job id '", id, "' (expected job-<number>, e.g. job-42)"));
  }
  return n;
}

absl::Status JobStore::WriteBatch(std::vector<BatchRecord>* records) {
  absl::Status first_error;
  for (BatchRecord& r : *records) {
    if (!first_error.ok()) {
      r.status = first_error;  // the store failed: the rest are not tried
      continue;
    }
    if (r.job_id.empty()) {
      r.status = AppendLogs(&r.lines);
    } else {
      auto job = UpdateJob(r.job_id, r.mutate, &r.events);
      r.status = job.status();
      if (job.ok()) r.job = std::move(*job);
    }
    if (IsTransientStoreError(r.status)) first_error = r.status;
  }
  return first_error;
}

}  // namespace trainctl
