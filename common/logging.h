// Minimal leveled logging to stderr, shared by the daemons and the CLI.
//
//   TRAINCTL_LOG(INFO) << "listening on " << addr;
//
// Thread-safe: each message is formatted apart and written with one write(2).
#ifndef TRAINCTL_COMMON_LOGGING_H_
#define TRAINCTL_COMMON_LOGGING_H_

#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace trainctl {

enum class LogLevel { kDEBUG = 0, kINFO = 1, kWARNING = 2, kERROR = 3 };

// Messages below `level` are dropped. Default kINFO.
void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// Parses "debug" | "info" | "warning" | "error" (case-insensitive).
absl::Status ParseLogLevel(absl::string_view text, LogLevel* level);

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace trainctl

#define TRAINCTL_LOG(level) \
  ::trainctl::LogMessage(::trainctl::LogLevel::k##level, __FILE__, __LINE__).stream()

#endif  // TRAINCTL_COMMON_LOGGING_H_
