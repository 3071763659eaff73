// Reading the Prometheus text exposition in tests.
#ifndef TRAINCTL_TESTS_TESTING_EXPOSITION_H_
#define TRAINCTL_TESTS_TESTING_EXPOSITION_H_

#include <string>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace trainctl::testing {

// The value of the sample named `series` (name and labels exactly as rendered: labels sorted by
// name) in the exposition `text`, "" if absent.
inline std::string SampleValue(const std::string& text, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::ConsumePrefix(&line, series) && absl::ConsumePrefix(&line, " ")) {
      return std::string(line);
    }
  }
  return "";
}

}  // namespace trainctl::testing

#endif  // TRAINCTL_TESTS_TESTING_EXPOSITION_H_
