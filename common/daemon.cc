#include "common/daemon.h"

#include <pthread.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <utility>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/str_cat.h"
#include "common/build_info.h"
#include "common/logging.h"

namespace trainctl {

absl::Status InitDaemon(absl::string_view log_level, sigset_t* stop_signals) {
  LogLevel level;
  if (absl::Status s = ParseLogLevel(log_level, &level); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--log_level: ", s.message()));
  }
  SetLogLevel(level);
  sigemptyset(stop_signals);
  sigaddset(stop_signals, SIGINT);
  sigaddset(stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, stop_signals, nullptr);
  return absl::OkStatus();
}

void ParseDaemonFlags(int argc, char** argv, const char* program, const char* usage) {
  absl::SetProgramUsageMessage(usage);
  absl::FlagsUsageConfig usage_config;
  usage_config.version_string = [program] { return VersionText(program); };
  absl::SetFlagsUsageConfig(usage_config);
  absl::ParseCommandLine(argc, argv);
}

absl::Status WriteReadyFile(const std::string& path, const std::string& text) {
  if (path.empty()) return absl::OkStatus();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << text << "\n";
    if (!out.flush()) {
      return absl::UnavailableError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot rename ", tmp, " to ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

StopSignalThread::StopSignalThread(sigset_t signals, std::function<void(int)> on_stop,
                                   std::function<void()> on_hangup) {
  thread_ = std::thread([signals, on_stop = std::move(on_stop), on_hangup = std::move(on_hangup)] {
    int sig = 0;
    while (sigwait(&signals, &sig) == 0 && sig == SIGHUP) on_hangup();
    TRAINCTL_LOG(INFO) << "signal " << sig << ": shutting down";
    on_stop(sig);
  });
}

StopSignalThread::~StopSignalThread() { thread_.join(); }

}  // namespace trainctl
