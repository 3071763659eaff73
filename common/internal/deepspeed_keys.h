// The DeepSpeed config's key table and per-key checks (common/deepspeed_config.cc resolves the
// document with them): which keys trainctl honours, ignores or rejects, and each value's type.
// Internal to common/: included by deepspeed_config.cc and deepspeed_keys.cc only.
#ifndef TRAINCTL_COMMON_INTERNAL_DEEPSPEED_KEYS_H_
#define TRAINCTL_COMMON_INTERNAL_DEEPSPEED_KEYS_H_

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace trainctl::deepspeed_internal {

// Collects every error and warning of one resolution, each "deepspeed.<path>: <why>".
class Diagnostics {
 public:
  void Error(absl::string_view path, absl::string_view why) {
    errors_.push_back(Line(path, why));
    error_paths_.emplace(path);
  }
  void Warn(absl::string_view path, absl::string_view why) { warnings_.push_back(Line(path, why)); }
  // Whether `path` already has an error, so later checks of its value are skipped.
  bool HasError(absl::string_view path) const { return error_paths_.count(std::string(path)) > 0; }
  bool ok() const { return errors_.empty(); }
  absl::Status ToStatus() const { return absl::InvalidArgumentError(absl::StrJoin(errors_, "\n")); }
  std::vector<std::string> TakeWarnings() { return std::move(warnings_); }

 private:
  static std::string Line(absl::string_view path, absl::string_view why) {
    return absl::StrCat("deepspeed.", path, ": ", why);
  }

  std::vector<std::string> errors_;
  std::vector<std::string> warnings_;
  std::set<std::string> error_paths_;
};

// JSON value helpers.

// `value` as compact JSON, cut to 80 characters.
std::string Show(const nlohmann::json& value);
bool IsAuto(const nlohmann::json& value);
// An integer, or an integral float such as 1e9 (DeepSpeed accepts both for sizes and counts).
std::optional<int64_t> AsInt(const nlohmann::json& value);
std::optional<double> AsReal(const nlohmann::json& value);

// The key table.

enum class Kind {
  kSection,
  kBool,
  kCount,          // integer >= 0
  kPositiveCount,  // integer >= 1
  kCountOrNull,    // integer >= 1, or null
  kReal,           // number >= 0
  kPositiveReal,   // number > 0
  kRatio,          // number in [0, 1]
  kBetas,          // [b1, b2], each in [0, 1)
  kStage,
  kOffloadDevice,
  kOptimizerType,
  kSchedulerType,
  kWarmupType,
};

enum class Handling {
  kHonoured,
  kAlias,            // honoured as the key named in `note`, with a deprecation warning
  kIgnored,          // a DeepSpeed key trainctl does not implement: warning
  kFp16Only,         // an fp16 loss-scaling key in the bf16 section: warning
  kRejectIfEnabled,  // error `note` when true or {"enabled": true}, else warning
};

struct KeySpec {
  constexpr KeySpec(absl::string_view path, Kind kind, Handling handling = Handling::kHonoured,
                    bool auto_ok = false, absl::string_view note = "")
      : path(path), kind(kind), handling(handling), auto_ok(auto_ok), note(note) {}

  absl::string_view path;
  Kind kind;
  Handling handling;
  bool auto_ok;  // "auto" is a value HF resolves for this key
  absl::string_view note;
};

// The table's entry for the dotted `path`, or nullopt for a key DeepSpeed does not have.
std::optional<KeySpec> FindKey(absl::string_view path);

// Whether `value` is in the comma-separated `list`.
bool ListContains(absl::string_view list, absl::string_view value, bool ignore_case);

// Checks every key of `section` (at the dotted `prefix`; "" for the root) against the table:
// warnings for ignored and unknown keys, errors for bad values and for rejected features.
void CheckSection(const nlohmann::json& section, absl::string_view prefix, Diagnostics& diag);

}  // namespace trainctl::deepspeed_internal

#endif  // TRAINCTL_COMMON_INTERNAL_DEEPSPEED_KEYS_H_
