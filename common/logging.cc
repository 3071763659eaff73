#include "common/logging.h"

#include <unistd.h>

#include <atomic>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace trainctl {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kINFO)};

const char* LevelLetter(LogLevel level) {
  switch (level) {
    case LogLevel::kDEBUG:
      return "D";
    case LogLevel::kINFO:
      return "I";
    case LogLevel::kWARNING:
      return "W";
    case LogLevel::kERROR:
      return "E";
  }
  return "?";
}

}  // namespace

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load()); }

absl::Status ParseLogLevel(absl::string_view text, LogLevel* level) {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "debug") {
    *level = LogLevel::kDEBUG;
  } else if (lower == "info") {
    *level = LogLevel::kINFO;
  } else if (lower == "warning" || lower == "warn") {
    *level = LogLevel::kWARNING;
  } else if (lower == "error") {
    *level = LogLevel::kERROR;
  } else {
    return absl::InvalidArgumentError("log level must be debug|info|warning|error, got '" +
                                      std::string(text) + "'");
  }
  return absl::OkStatus();
}

LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  absl::string_view base(file);
  if (auto slash = base.rfind('/'); slash != absl::string_view::npos) base.remove_prefix(slash + 1);
  stream_ << LevelLetter(level)
          << absl::FormatTime("%m%d %H:%M:%E6S", absl::Now(), absl::UTCTimeZone()) << " "
          << getpid() << " " << base << ":" << line << "] ";
}

LogMessage::~LogMessage() {
  if (static_cast<int>(level_) < g_level.load()) return;
  stream_ << '\n';
  const std::string text = stream_.str();
  // One write(2) keeps concurrent messages from interleaving; a failed log write has nowhere to go.
  ssize_t ignored = ::write(STDERR_FILENO, text.data(), text.size());
  (void)ignored;
}

}  // namespace trainctl
