#include "worker/trainer/trainer_failure.h"

#include <cctype>
#include <cstdlib>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/trainer_exit_codes.h"

namespace trainctl::trainer {
namespace {

constexpr char kLossSpikePayload[] = "trainctl.dev/loss-spike";

// The number (with an optional fraction) and unit right after `prefix` in `message`, in bytes.
int64_t BytesAfter(absl::string_view message, absl::string_view prefix) {
  const size_t at = message.find(prefix);
  if (at == absl::string_view::npos) return -1;
  absl::string_view rest = message.substr(at + prefix.size());
  size_t n = 0;
  while (n < rest.size() && (std::isdigit(static_cast<unsigned char>(rest[n])) || rest[n] == '.'))
    ++n;
  double value = 0;
  if (n == 0 || !absl::SimpleAtod(rest.substr(0, n), &value)) return -1;
  rest = rest.substr(n);
  while (!rest.empty() && rest[0] == ' ') rest.remove_prefix(1);
  double scale = 1;
  if (absl::StartsWith(rest, "KiB")) scale = 1024.0;
  if (absl::StartsWith(rest, "MiB")) scale = 1024.0 * 1024;
  if (absl::StartsWith(rest, "GiB")) scale = 1024.0 * 1024 * 1024;
  if (absl::StartsWith(rest, "TiB")) scale = 1024.0 * 1024 * 1024 * 1024;
  return static_cast<int64_t>(value * scale);
}

}  // namespace

std::optional<OutOfMemory> ParseOutOfMemory(absl::string_view message) {
  OutOfMemory oom;
  if (absl::StrContains(message, "CUDA out of memory")) {
    oom.device = "cuda";
    oom.bytes = BytesAfter(message, "Tried to allocate ");
    return oom;
  }
  // LibTorch's own CPU allocator, and the trainer's (model/host_runtime.h).
  if (absl::StrContains(message, "DefaultCPUAllocator: can't allocate memory") ||
      absl::StrContains(message, "DefaultCPUAllocator: not enough memory") ||
      absl::StrContains(message, "HeapCpuAllocator: can't allocate memory")) {
    oom.device = "cpu";
    oom.bytes = BytesAfter(message, "you tried to allocate ");
    return oom;
  }
  if (absl::StrContains(message, "std::bad_alloc")) {
    oom.device = "cpu";
    return oom;
  }
  return std::nullopt;
}

absl::Status LossSpikeError(absl::string_view evidence) {
  absl::Status status(absl::StatusCode::kAborted, absl::StrCat("loss spike: ", evidence));
  status.SetPayload(kLossSpikePayload, absl::Cord(evidence));
  return status;
}

bool IsLossSpike(const absl::Status& status) {
  return status.GetPayload(kLossSpikePayload).has_value();
}

int TrainerExitCode(const absl::Status& status) {
  if (status.ok()) return 0;
  if (IsLossSpike(status)) return kTrainerExitLossSpike;
  if (ParseOutOfMemory(status.message())) return kTrainerExitOutOfMemory;
  return 1;
}

}  // namespace trainctl::trainer
