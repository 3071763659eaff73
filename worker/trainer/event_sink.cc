#include "worker/trainer/event_sink.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace trainctl::trainer {

absl::StatusOr<std::unique_ptr<JsonLinesEventSink>> JsonLinesEventSink::FromEnvironment(
    const std::string& fallback_path) {
  if (const char* env = std::getenv("TRAINCTL_EVENT_FD"); env != nullptr && *env != '\0') {
    int fd = -1;
    if (!absl::SimpleAtoi(env, &fd) || fd < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("TRAINCTL_EVENT_FD must be a file descriptor, got '", env, "'"));
    }
    return std::unique_ptr<JsonLinesEventSink>(new JsonLinesEventSink(fd, /*owned=*/false));
  }
  if (fallback_path.empty()) {
    return std::unique_ptr<JsonLinesEventSink>(new JsonLinesEventSink(STDERR_FILENO, false));
  }
  const int fd = open(fallback_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot open event file ", fallback_path, ": ", std::strerror(errno)));
  }
  return std::unique_ptr<JsonLinesEventSink>(new JsonLinesEventSink(fd, /*owned=*/true));
}

JsonLinesEventSink::~JsonLinesEventSink() {
  if (owned_) close(fd_);
}

void JsonLinesEventSink::Emit(const std::string& type, nlohmann::json fields) {
  fields["type"] = type;
  fields["time"] = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  const std::string line =
      fields.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  absl::MutexLock lock(&mu_);
  size_t written = 0;
  while (written < line.size()) {
    const ssize_t n = write(fd_, line.data() + written, line.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the reader is gone; see the header
    written += static_cast<size_t>(n);
  }
}

}  // namespace trainctl::trainer
