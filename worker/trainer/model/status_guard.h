// The trainer's one way from an exception to a Status. Tensor code throws (LibTorch's c10::Error,
// and the ZeRO collectives' zero::CollectiveError from Handle::Wait, which autograd hooks cannot
// return); the code above it returns absl::Status. Guarded draws that line:
//
//   RETURN_IF_ERROR(model::Guarded("backward", [&] { BackwardOrThrow(loss); }));
//   return model::Guarded("optimizer step", [&] { return StepOrThrow(lr); });  // a StatusOr
//
// A PeerFailure (a collective whose peer is gone or timed out) becomes UNAVAILABLE; a c10::Error
// becomes `tensor_code` (INTERNAL unless the caller knows better: RESOURCE_EXHAUSTED while building
// or gathering a model, INVALID_ARGUMENT for a forward on a user's input). Each message is
// prefixed with `what` and ": " unless `what` is empty, and carries no C++ backtrace.
#ifndef TRAINCTL_WORKER_TRAINER_MODEL_STATUS_GUARD_H_
#define TRAINCTL_WORKER_TRAINER_MODEL_STATUS_GUARD_H_

#include <c10/util/Exception.h>

#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace trainctl::model {

// An exception that means a peer went away rather than a tensor operation failing: the base of
// zero::CollectiveError, here so that code below the ZeRO room can tell the two apart.
class PeerFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace internal {

// What Guarded returns for a callable returning R: Status for void and Status, StatusOr<T> for
// StatusOr<T> and for any other T.
template <typename R>
struct GuardedResult {
  using type = absl::StatusOr<R>;
};
template <>
struct GuardedResult<void> {
  using type = absl::Status;
};
template <>
struct GuardedResult<absl::Status> {
  using type = absl::Status;
};
template <typename T>
struct GuardedResult<absl::StatusOr<T>> {
  using type = absl::StatusOr<T>;
};

inline std::string Prefixed(absl::string_view what, absl::string_view message) {
  return what.empty() ? std::string(message) : absl::StrCat(what, ": ", message);
}

}  // namespace internal

// Runs `fn` and returns what it returns (a plain value as StatusOr, OK for void), or the status
// of the exception it threw.
template <typename Fn>
typename internal::GuardedResult<std::invoke_result_t<Fn>>::type Guarded(
    absl::string_view what, Fn&& fn, absl::StatusCode tensor_code = absl::StatusCode::kInternal) {
  try {
    if constexpr (std::is_void_v<std::invoke_result_t<Fn>>) {
      std::forward<Fn>(fn)();
      return absl::OkStatus();
    } else {
      return std::forward<Fn>(fn)();
    }
  } catch (const PeerFailure& e) {
    return absl::UnavailableError(internal::Prefixed(what, e.what()));
  } catch (const c10::Error& e) {
    return absl::Status(tensor_code, internal::Prefixed(what, e.what_without_backtrace()));
  }
}

}  // namespace trainctl::model

#endif  // TRAINCTL_WORKER_TRAINER_MODEL_STATUS_GUARD_H_
