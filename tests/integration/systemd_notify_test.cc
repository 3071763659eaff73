// The daemons under systemd-style supervision (Type=notify, WatchdogSec=): the real
// trainctl-coordinator and trainctl-worker started with NOTIFY_SOCKET pointing at a recorded
// datagram socket (tests/testing/notify_socket.h) and WATCHDOG_USEC set, as systemd starts them.
// Each must say READY=1 when it is ready (the coordinator serving, the worker registered), keep a
// STATUS= line, ping WATCHDOG=1 from its work loop every half interval, stop pinging while that
// loop hangs (--testonly_stall_file), and say STOPPING=1 on SIGTERM.
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "tests/testing/notify_socket.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace trainctl {
namespace {

namespace fs = std::filesystem;
using testing::NotifySocket;
using testing::Subprocess;

// systemd's WatchdogSec= for these tests: pings every 500 ms.
constexpr absl::Duration kWatchdog = absl::Seconds(1);

bool IsWatchdog(const std::string& s) { return s == "WATCHDOG=1"; }

class SystemdNotifyTest : public ::testing::Test {
 protected:
  ~SystemdNotifyTest() override {
    worker_.reset();
    coordinator_.reset();
  }

  std::unique_ptr<NotifySocket> Socket(const std::string& name) {
    auto socket = NotifySocket::Bind(dir_.path() + "/" + name + ".sock");
    EXPECT_TRUE(socket.ok()) << socket.status();
    return socket.ok() ? std::move(*socket) : nullptr;
  }

  // `argv` run as systemd runs a Type=notify service with WatchdogSec=1s (env execs in place, so
  // the daemon keeps the pid the test knows).
  std::vector<std::string> Supervised(const NotifySocket& socket, std::vector<std::string> argv) {
    std::vector<std::string> out = {
        "/usr/bin/env", "NOTIFY_SOCKET=" + socket.path(),
        absl::StrCat("WATCHDOG_USEC=", absl::ToInt64Microseconds(kWatchdog))};
    out.insert(out.end(), argv.begin(), argv.end());
    return out;
  }

  void StartCoordinator(const NotifySocket& socket, const std::string& listen) {
    coordinator_ = std::make_unique<Subprocess>(
        Supervised(socket, {TRAINCTL_COORDINATOR_BIN, "--listen", listen, "--db",
                            dir_.path() + "/trainctl.db", "--db_sync", "normal", "--ready_file",
                            ready_file_, "--testonly_stall_file", stall_file_}),
        dir_.path() + "/coordinator.log");
  }

  std::string Logs() {
    return "--- coordinator\n" + testing::ReadFileOrEmpty(dir_.path() + "/coordinator.log") +
           "--- worker\n" + testing::ReadFileOrEmpty(dir_.path() + "/worker.log");
  }

  // Pings keep coming every half interval; the stall file stops them until it goes; then they
  // resume; SIGTERM brings STOPPING=1 and a clean exit.
  void CheckWatchdogStallAndStop(const NotifySocket& socket, Subprocess& daemon) {
    const int first = socket.WaitFor(IsWatchdog, absl::Seconds(10));
    ASSERT_GE(first, 0) << socket.Dump() << Logs();
    const int second = socket.WaitFor(IsWatchdog, absl::Seconds(10), first + 1);
    const int third = socket.WaitFor(IsWatchdog, absl::Seconds(10), second + 1);
    ASSERT_GE(third, 0) << socket.Dump();
    const auto received = socket.Received();
    for (const auto& a : received) EXPECT_EQ(a.sender, daemon.pid()) << a.text;
    // Every half interval, never a burst; late by a loaded machine's scheduling at most (a gap of
    // a whole interval would already get the daemon killed, but this test runs beside others).
    const absl::Duration gap = received[third].arrived - received[second].arrived;
    EXPECT_GE(gap, kWatchdog / 2 - absl::Milliseconds(150)) << socket.Dump();
    EXPECT_LE(gap, kWatchdog * 2) << socket.Dump();

    { std::ofstream(stall_file_) << "test\n"; }
    const int stalled = socket.WaitFor(
        [](const std::string& s) { return absl::StartsWith(s, "STATUS=test-only stall"); },
        absl::Seconds(10), third + 1);
    ASSERT_GE(stalled, 0) << socket.Dump() << Logs();
    // systemd would kill the daemon after kWatchdog without a ping; wait out 2.5 intervals (five
    // missed pings) and see none.
    absl::SleepFor(kWatchdog * 2.5);
    EXPECT_EQ(socket.Count("WATCHDOG=1", stalled + 1), 0) << socket.Dump();
    ASSERT_EQ(unlink(stall_file_.c_str()), 0);
    const int resumed = socket.WaitFor(IsWatchdog, absl::Seconds(10), stalled + 1);
    ASSERT_GE(resumed, 0) << socket.Dump() << Logs();

    daemon.Kill(SIGTERM);
    EXPECT_GE(socket.WaitFor([](const std::string& s) { return s == "STOPPING=1"; },
                             absl::Seconds(10), resumed + 1),
              0)
        << socket.Dump();
    auto exit = daemon.Wait(absl::Seconds(30));
    ASSERT_TRUE(exit.ok()) << Logs();
    EXPECT_EQ(*exit, 0) << Logs();
  }

  testing::TempDir dir_;
  const std::string ready_file_ = dir_.path() + "/ready";
  std::string stall_file_ = dir_.path() + "/stall";  // of the daemon under test
  std::unique_ptr<Subprocess> coordinator_;
  std::unique_ptr<Subprocess> worker_;
};

TEST_F(SystemdNotifyTest, CoordinatorReadyOnceServingStatusWatchdogStallStopping) {
  auto socket = Socket("coordinator");
  ASSERT_NE(socket, nullptr);
  StartCoordinator(*socket, "127.0.0.1:0");
  const int ready =
      socket->WaitFor([](const std::string& s) { return s == "READY=1"; }, absl::Seconds(30));
  ASSERT_GE(ready, 0) << socket->Dump() << Logs();
  // READY only once it serves: the address is bound and written by then.
  ASSERT_TRUE(fs::exists(ready_file_));
  const std::string address(absl::StripAsciiWhitespace(testing::ReadFileOrEmpty(ready_file_)));
  const int status =
      socket->WaitFor([](const std::string& s) { return absl::StartsWith(s, "STATUS="); },
                      absl::Seconds(1), ready + 1);
  ASSERT_GE(status, 0) << socket->Dump();
  EXPECT_EQ(socket->Received()[status].text,
            absl::StrCat("STATUS=serving on ", address, ", 0 jobs running, 0 waiting, 0 nodes"));
  EXPECT_EQ(socket->Count("READY=1"), 1);
  CheckWatchdogStallAndStop(*socket, *coordinator_);
  EXPECT_EQ(socket->Count("READY=1"), 1) << socket->Dump();
}

TEST_F(SystemdNotifyTest, WorkerReadyOnlyOnceRegisteredStatusWatchdogStallStopping) {
  const int port = testing::FreeLoopbackPort();
  ASSERT_GT(port, 0);
  const std::string address = absl::StrCat("127.0.0.1:", port);
  auto socket = Socket("worker");
  ASSERT_NE(socket, nullptr);
  // The worker first, with nobody at the coordinator's address: it runs (and pings) but is not
  // ready.
  worker_ = std::make_unique<Subprocess>(Supervised(*socket, {TRAINCTL_WORKER_BIN,
                                                              "--coordinator",
                                                              address,
                                                              "--node_name",
                                                              "node-a",
                                                              "--work_dir",
                                                              dir_.path() + "/work",
                                                              "--slots",
                                                              "2",
                                                              "--heartbeat_interval",
                                                              "300ms",
                                                              "--reconnect_max",
                                                              "300ms",
                                                              "--kill_grace",
                                                              "2s",
                                                              "--trainer",
                                                              FAKE_RANK_BIN,
                                                              "--nvidia_smi",
                                                              "/nonexistent/nvidia-smi",
                                                              "--testonly_stall_file",
                                                              dir_.path() + "/worker-stall"}),
                                         dir_.path() + "/worker.log");
  const int connecting = socket->WaitFor(
      [&](const std::string& s) {
        return s == absl::StrCat("STATUS=connecting to ", address, " as node-a, 0 tasks");
      },
      absl::Seconds(30));
  ASSERT_GE(connecting, 0) << socket->Dump() << Logs();
  const int early_ping = socket->WaitFor(IsWatchdog, absl::Seconds(10));
  ASSERT_GE(early_ping, 0) << socket->Dump();
  EXPECT_EQ(socket->Count("READY=1"), 0) << socket->Dump();

  auto coordinator_socket = Socket("coordinator");
  ASSERT_NE(coordinator_socket, nullptr);
  StartCoordinator(*coordinator_socket, address);
  const int ready =
      socket->WaitFor([](const std::string& s) { return s == "READY=1"; }, absl::Seconds(30));
  ASSERT_GE(ready, 0) << socket->Dump() << Logs();
  const int registered =
      socket->WaitFor([](const std::string& s) { return absl::StartsWith(s, "STATUS="); },
                      absl::Seconds(1), ready + 1);
  ASSERT_GE(registered, 0) << socket->Dump();
  EXPECT_EQ(socket->Received()[registered].text,
            absl::StrCat("STATUS=registered as node-a with ", address, ", 0 tasks"));
  // The coordinator's status counts the node.
  EXPECT_GE(
      coordinator_socket->WaitFor(
          [](const std::string& s) { return absl::EndsWith(s, ", 1 node"); }, absl::Seconds(10)),
      0)
      << coordinator_socket->Dump();

  stall_file_ = dir_.path() + "/worker-stall";
  CheckWatchdogStallAndStop(*socket, *worker_);
  EXPECT_EQ(socket->Count("READY=1"), 1) << socket->Dump();
}

}  // namespace
}  // namespace trainctl
