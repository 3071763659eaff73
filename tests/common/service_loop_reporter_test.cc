// ServiceLoopReporter on a fake clock with a recording notifier (what the daemons send when),
// and SystemdNotifier/TakeSystemdWatchdogInterval through the real libsystemd to a recorded socket.
#include "common/service_loop_reporter.h"

#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/service_notifier.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/notify_socket.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace trainctl {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

class RecordingNotifier final : public ServiceNotifier {
 public:
  void Notify(absl::string_view state) override {
    absl::MutexLock lock(&mu_);
    sent_.emplace_back(state);
  }
  std::vector<std::string> Take() {
    absl::MutexLock lock(&mu_);
    return std::move(sent_);
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> sent_ ABSL_GUARDED_BY(mu_);
};

TEST(ServiceLoopReporterTest, ReadyOnceStatusOnChangeWatchdogEveryHalfInterval) {
  RecordingNotifier notifier;
  testing::FakeClock clock;
  ServiceLoopOptions options;
  options.watchdog_interval = absl::Seconds(10);
  ServiceLoopReporter reporter(&notifier, &clock, options);

  reporter.Tick(false, "connecting");
  EXPECT_THAT(notifier.Take(), ElementsAre("STATUS=connecting\nWATCHDOG=1"));
  clock.Advance(absl::Seconds(4));
  reporter.Tick(false, "connecting");
  EXPECT_THAT(notifier.Take(), IsEmpty());  // nothing changed, 4 s < 5 s
  reporter.Tick(true, "registered\nas a");
  EXPECT_THAT(notifier.Take(), ElementsAre("READY=1\nSTATUS=registered as a"));
  clock.Advance(absl::Seconds(1));
  reporter.Tick(true, "registered as a");
  EXPECT_THAT(notifier.Take(), ElementsAre("WATCHDOG=1"));
  clock.Advance(absl::Seconds(5));
  reporter.Tick(false, "connecting");  // READY is never taken back or sent twice
  reporter.Tick(true, "registered as a");
  EXPECT_THAT(notifier.Take(),
              ElementsAre("STATUS=connecting\nWATCHDOG=1", "STATUS=registered as a"));

  reporter.Stopping("stopping");
  EXPECT_THAT(notifier.Take(), ElementsAre("STOPPING=1\nSTATUS=stopping"));
  clock.Advance(absl::Seconds(5));
  reporter.Tick(true, "registered as a, 1 task");  // only the watchdog from now on
  EXPECT_THAT(notifier.Take(), ElementsAre("WATCHDOG=1"));
}

TEST(ServiceLoopReporterTest, NoWatchdogWithoutInterval) {
  RecordingNotifier notifier;
  testing::FakeClock clock;
  ServiceLoopReporter reporter(&notifier, &clock, ServiceLoopOptions{});
  reporter.Tick(true, "serving");
  clock.Advance(absl::Hours(1));
  reporter.Tick(true, "serving");
  EXPECT_THAT(notifier.Take(), ElementsAre("READY=1\nSTATUS=serving"));
}

TEST(ServiceLoopReporterTest, TestOnlyStallFileHangsTheLoopUntilRemoved) {
  testing::TempDir dir;
  const std::string stall = dir.Write("stall", "");
  RecordingNotifier notifier;
  testing::FakeClock clock;
  ServiceLoopOptions options;
  options.watchdog_interval = absl::Seconds(2);
  options.testonly_stall_file = stall;
  options.stall_poll = absl::Milliseconds(1);
  ServiceLoopReporter reporter(&notifier, &clock, options);
  std::atomic<bool> returned{false};
  std::thread loop([&] {
    reporter.Tick(true, "serving");
    returned = true;
  });
  std::vector<std::string> sent;
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        for (std::string& s : notifier.Take()) sent.push_back(std::move(s));
        return !sent.empty();
      },
      absl::Seconds(10)));
  EXPECT_THAT(sent, ElementsAre(absl::StrCat("STATUS=test-only stall (", stall, ")")));
  EXPECT_FALSE(returned);
  ASSERT_EQ(unlink(stall.c_str()), 0);
  loop.join();
  EXPECT_THAT(notifier.Take(), ElementsAre("READY=1\nSTATUS=serving\nWATCHDOG=1"));
}

// The real libsystemd: sd_notify to $NOTIFY_SOCKET, sd_watchdog_enabled from $WATCHDOG_USEC (and
// the variables removed afterwards, so ranks do not inherit them).
TEST(SystemdNotifierTest, SendsToNotifySocketAndTakesWatchdogInterval) {
  testing::TempDir dir;
  auto socket = testing::NotifySocket::Bind(dir.path() + "/notify");
  ASSERT_TRUE(socket.ok()) << socket.status();
  ASSERT_EQ(setenv("NOTIFY_SOCKET", (*socket)->path().c_str(), 1), 0);
  SystemdNotifier notifier;
  notifier.Notify("READY=1\nSTATUS=serving on :1");
  EXPECT_GE((*socket)->WaitFor([](const std::string& s) { return s == "STATUS=serving on :1"; },
                               absl::Seconds(10)),
            0);
  const auto received = (*socket)->Received();
  ASSERT_FALSE(received.empty());
  EXPECT_EQ(received[0].text, "READY=1");
  EXPECT_EQ(received[0].sender, getpid());
  unsetenv("NOTIFY_SOCKET");
  notifier.Notify("WATCHDOG=1");  // no socket: nothing, no error

  ASSERT_EQ(setenv("WATCHDOG_USEC", "3000000", 1), 0);
  EXPECT_EQ(TakeSystemdWatchdogInterval(), absl::Seconds(3));
  EXPECT_EQ(getenv("WATCHDOG_USEC"), nullptr);
  EXPECT_EQ(TakeSystemdWatchdogInterval(), absl::ZeroDuration());
  // For another process (WATCHDOG_PID names someone else): not ours.
  ASSERT_EQ(setenv("WATCHDOG_USEC", "3000000", 1), 0);
  ASSERT_EQ(setenv("WATCHDOG_PID", absl::StrCat(getpid() + 1).c_str(), 1), 0);
  EXPECT_EQ(TakeSystemdWatchdogInterval(), absl::ZeroDuration());
  EXPECT_EQ((*socket)->Count("WATCHDOG=1"), 0);
}

}  // namespace
}  // namespace trainctl
