// A stand-in rank program for the worker's fault tests. It behaves as its environment says:
//   TRAINCTL_FAKE_LINES=N            print N numbered lines "rank R line i" (stdout), one every
//   TRAINCTL_FAKE_PERIOD_MS
//                           (default 20), each followed by a metric event on $TRAINCTL_EVENT_FD
//   TRAINCTL_FAKE_TRAINER_METRICS=1  those metric events also carry total_steps (N) and tokens_per_second,
//                           as the trainer's do
//   TRAINCTL_FAKE_FAIL_RANK=R        that rank prints "rank R: fatal: injected failure" to stderr and exits
//   TRAINCTL_FAKE_EXIT_CODE=C        with C (default 1) after its lines
//   TRAINCTL_FAKE_HANG=1             after its lines, sleep forever (a hung rank)
//   TRAINCTL_FAKE_IGNORE_TERM=1      ignore SIGTERM (so only SIGKILL stops it)
// Then it exits 0. It also prints its launch environment once, for the tests to check.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v ? std::atoi(v) : fallback;
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

}  // namespace

int main() {
  if (EnvInt("TRAINCTL_FAKE_IGNORE_TERM", 0) == 1) signal(SIGTERM, SIG_IGN);
  const int rank = EnvInt("RANK", -1);
  const int event_fd = EnvInt("TRAINCTL_EVENT_FD", -1);
  std::printf(
      "rank %d env RANK=%s LOCAL_RANK=%s WORLD_SIZE=%s LOCAL_WORLD_SIZE=%s NODE_RANK=%s "
      "MASTER_ADDR=%s MASTER_PORT=%s JOB=%s\n",
      rank, Env("RANK").c_str(), Env("LOCAL_RANK").c_str(), Env("WORLD_SIZE").c_str(),
      Env("LOCAL_WORLD_SIZE").c_str(), Env("NODE_RANK").c_str(), Env("MASTER_ADDR").c_str(),
      Env("MASTER_PORT").c_str(), Env("TRAINCTL_JOB_ID").c_str());
  std::fflush(stdout);
  const int lines = EnvInt("TRAINCTL_FAKE_LINES", 0);
  const int period_ms = EnvInt("TRAINCTL_FAKE_PERIOD_MS", 20);
  for (int i = 0; i < lines; ++i) {
    std::printf("rank %d line %d\n", rank, i);
    std::fflush(stdout);
    if (event_fd >= 0 && rank == 0) {
      const std::string extra =
          EnvInt("TRAINCTL_FAKE_TRAINER_METRICS", 0) == 1
              ? ",\"total_steps\":" + std::to_string(lines) + ",\"tokens_per_second\":1500"
              : "";
      const std::string event = "{\"type\":\"metric\",\"step\":" + std::to_string(i + 1) +
                                ",\"values\":{\"loss\":" + std::to_string(1.0 / (i + 1)) +
                                extra + "}}\n";
      if (write(event_fd, event.data(), event.size()) < 0) return 9;
    }
    usleep(static_cast<useconds_t>(period_ms) * 1000);
  }
  if (rank == EnvInt("TRAINCTL_FAKE_FAIL_RANK", -2)) {
    std::fprintf(stderr, "rank %d: fatal: injected failure\n", rank);
    return EnvInt("TRAINCTL_FAKE_EXIT_CODE", 1);
  }
  if (EnvInt("TRAINCTL_FAKE_HANG", 0) == 1) {
    while (true) pause();
  }
  return 0;
}
