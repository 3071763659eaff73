// Clients given several coordinator addresses (issue 28: an active coordinator and standbys that
// take no connection until they lead) follow the one that listens: the real trainctl and
// trainctl-worker, the real coordinator over SQLite, and addresses nobody listens on standing in
// for the standbys. Failover itself is played by stopping the coordinator and starting another at
// a second address over the same database (SQLite allows one at a time).
#include <signal.h>

#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/robustness_fixture.h"
#include "tests/testing/subprocess.h"

namespace trainctl {
namespace {

namespace v1 = trainctl::v1;
using testing::RunResult;
using testing::WaitFor;

class CoordinatorListTest : public testing::RobustnessTest {
 protected:
  // An address nobody listens on (connections to it are refused, as a standby's are).
  static std::string Dead() { return absl::StrCat("127.0.0.1:", testing::FreeLoopbackPort()); }

  // The real trainctl with TRAINCTL_COORDINATOR=`coordinators`.
  RunResult Trainctl(std::vector<std::string> args, const std::string& coordinators) {
    args.insert(args.begin(), TRAINCTL_CLI_BIN);
    return testing::Run(args, {{"TRAINCTL_COORDINATOR", coordinators}}, absl::Seconds(60));
  }

  // Submits a one-rank job through trainctl; its id, or "" (the test has failed then).
  std::string SubmitThrough(const std::string& coordinators, const std::string& name) {
    const nlohmann::json spec = {{"kind", "sft"},
                                 {"name", name},
                                 {"model_name_or_path", "tiny"},
                                 {"data_path", dir_.path() + "/data"},
                                 {"output_dir", dir_.path() + "/out-" + name},
                                 {"resources", {{"nodes", 1}, {"slots_per_node", 1}}}};
    RunResult r =
        Trainctl({"submit", dir_.Write(name + ".json", spec.dump()), "-o", "json"}, coordinators);
    EXPECT_EQ(r.exit_code, 0) << r.err << Logs();
    auto reply = nlohmann::json::parse(r.out, nullptr, false);
    return reply.is_object() && reply.contains("id") ? reply["id"].get<std::string>() : "";
  }

  // How often `needle` occurs in `text`.
  static int Count(const std::string& text, const std::string& needle) {
    int n = 0;
    for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
      ++n;
    }
    return n;
  }
  std::string WorkerLog() { return testing::ReadFileOrEmpty(dir_.path() + "/worker-node-a.log"); }
};

TEST_F(CoordinatorListTest, CliAndWorkerPassOverAnAddressThatRefusesInEitherOrder) {
  StartCoordinator();
  const std::string live = address_, dead = Dead();
  // The worker tries the dead address first, then the live one.
  StartWorker("node-a", 1, Script("rank.sh", "echo ran\n"), {"--coordinator", dead + "," + live});
  ASSERT_TRUE(WaitFor([&] { return NodeReady("node-a"); }, absl::Seconds(20))) << Logs();
  EXPECT_TRUE(WaitFor([&] { return absl::StrContains(WorkerLog(), "connected to " + live); },
                      absl::Seconds(5)))
      << Logs();

  const std::vector<std::string> lists = {dead + "," + live, live + ", " + dead};
  for (size_t i = 0; i < lists.size(); ++i) {
    const std::string& list = lists[i];
    SCOPED_TRACE(list);
    const std::string id = SubmitThrough(list, absl::StrCat("job-", i));
    ASSERT_FALSE(id.empty());
    RunResult watched = Trainctl({"watch", id}, list);
    EXPECT_EQ(watched.exit_code, 0) << watched.err << watched.out << Logs();
    EXPECT_LT(watched.elapsed, absl::Seconds(30));
    RunResult listed = Trainctl({"ls"}, list);
    EXPECT_EQ(listed.exit_code, 0) << listed.err;
    EXPECT_TRUE(absl::StrContains(listed.out, id)) << listed.out;
    EXPECT_EQ(Get(id).state(), v1::JOB_STATE_SUCCEEDED);
  }
}

// The worker holds a running task when its coordinator goes; a while later the next one comes up
// at the other address of the worker's list: the worker finds it within its --reconnect_max (1 s
// here), reports the task, and the new coordinator adopts it (the rank was never stopped,
// attempt 0).
TEST_F(CoordinatorListTest, WorkerFollowsTheCoordinatorToItsOtherAddressAndTheTaskIsAdopted) {
  StartCoordinator();
  const std::string first = address_, second = Dead();
  const std::string pid_file = dir_.path() + "/rank.pid", release = dir_.path() + "/release";
  StartWorker("node-a", 1,
              Script("wait.sh", absl::StrCat("echo $$ > ", pid_file, "\nwhile [ ! -e ", release,
                                             " ]; do sleep 0.05; done\n")),
              {"--coordinator", first + "," + second});
  ASSERT_TRUE(WaitFor([&] { return NodeReady("node-a"); }, absl::Seconds(20))) << Logs();
  const std::string id = SubmitThrough(first + "," + second, "held");
  ASSERT_FALSE(id.empty());
  WaitState(id, v1::JOB_STATE_RUNNING, absl::Seconds(20));
  int rank_pid = 0;
  ASSERT_TRUE(WaitFor(
      [&] {
        return absl::SimpleAtoi(absl::StripAsciiWhitespace(testing::ReadFileOrEmpty(pid_file)),
                                &rank_pid);
      },
      absl::Seconds(10)));

  coordinator_->Kill(SIGKILL);
  ASSERT_TRUE(coordinator_->Wait(absl::Seconds(10)).ok());
  // No coordinator for a while, as while a standby waits out the leader's lease: the worker goes
  // round its list until its back-off is at --reconnect_max (100 ms doubling: 5 rounds, 10 tries).
  const int ended_before = Count(WorkerLog(), "; reconnecting");
  ASSERT_TRUE(WaitFor([&] { return Count(WorkerLog(), "; reconnecting") >= ended_before + 10; },
                      absl::Seconds(20)))
      << Logs();
  address_ = second;
  StartCoordinator();  // over the same database, listening at `second`
  ASSERT_FALSE(HasFatalFailure());
  const absl::Time serving = absl::Now();
  ASSERT_TRUE(WaitFor([&] { return NodeReady("node-a"); }, absl::Seconds(10))) << Logs();
  const absl::Duration found = absl::Now() - serving;
  std::cout << "[ failover ] the worker registered with the coordinator at its second address "
            << absl::FormatDuration(found) << " after that one served\n";
  RecordProperty("failover_ms", static_cast<int>(absl::ToInt64Milliseconds(found)));
  EXPECT_LT(found, absl::Seconds(3)) << Logs();
  EXPECT_TRUE(WaitFor([&] { return absl::StrContains(WorkerLog(), "connected to " + second); },
                      absl::Seconds(5)))
      << Logs();

  EXPECT_EQ(kill(rank_pid, 0), 0) << "the rank must live through the failover";
  const v1::Job running = Get(id);
  EXPECT_EQ(running.state(), v1::JOB_STATE_RUNNING) << running.message();
  EXPECT_EQ(running.attempt(), 0);
  dir_.Write("release", "");
  const v1::Job done = WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(20));
  EXPECT_EQ(done.attempt(), 0) << "adopted, not restarted";
  // The CLI with the same list finds the new coordinator too.
  RunResult described = Trainctl({"describe", id}, first + "," + second);
  EXPECT_EQ(described.exit_code, 0) << described.err;
  EXPECT_TRUE(absl::StrContains(described.out, "succeeded")) << described.out;
}

}  // namespace
}  // namespace trainctl
