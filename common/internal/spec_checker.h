// The job spec validator's pieces (common/job_spec.cc, common/job_spec_limits.cc).
#ifndef TRAINCTL_COMMON_INTERNAL_SPEC_CHECKER_H_
#define TRAINCTL_COMMON_INTERNAL_SPEC_CHECKER_H_

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "trainctl/v1/job.pb.h"

namespace trainctl::internal {

// Collects "path: message" errors with small typed helpers, so checks read as one line each.
class Checker {
 public:
  explicit Checker(std::vector<std::string>* errors) : errors_(errors) {}

  void Fail(const std::string& path, const std::string& message) {
    errors_->push_back(absl::StrCat(path, ": ", message));
  }
  template <typename T>
  void AtLeast(const std::string& path, T value, T min) {
    if (!(value >= min)) Fail(path, absl::StrCat("must be >= ", min, ", got ", value));
  }
  void Positive(const std::string& path, double value) {
    if (!(value > 0) || !std::isfinite(value)) Fail(path, absl::StrCat("must be > 0, got ", value));
  }
  void InRange(const std::string& path, double value, double lo, double hi, bool hi_open) {
    const bool ok = value >= lo && (hi_open ? value < hi : value <= hi);
    if (!ok) {
      Fail(path, absl::StrCat("must be in [", lo, ", ", hi, hi_open ? ")" : "]", ", got ", value));
    }
  }
  template <size_t N>
  void OneOf(const std::string& path, const std::string& value, const char* const (&choices)[N]) {
    for (const char* choice : choices) {
      if (value == choice) return;
    }
    Fail(path, absl::StrCat("must be one of ", absl::StrJoin(choices, "|"), ", got '", value, "'"));
  }

 private:
  std::vector<std::string>* errors_;
};

// Every string, repeated field and map of `spec` within the limits of common/job_spec.h; env
// names are environment variable names and not reserved by the launcher.
void CheckSizes(const trainctl::v1::JobSpec& spec, Checker& c);
void CheckMaps(const trainctl::v1::JobSpec& spec, Checker& c);

}  // namespace trainctl::internal

#endif  // TRAINCTL_COMMON_INTERNAL_SPEC_CHECKER_H_
