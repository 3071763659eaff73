// `trainctl watch` on a real terminal: a tmux pane (120 x 30) running the real CLI against a real
// coordinator and worker, whose rank (tests/integration/fake_rank.cc) logs a metric every 150 ms
// as the trainer does. The pane's text (tmux capture-pane) must show one live line redrawn in
// place with step/total, bar, loss, tokens/s, ETA and elapsed time, the events above it, and the
// summary at the end. Then ls's PROGRESS and ETA columns, describe's loss chart, `trainctl
// metrics` and the global options before the verb, all against the same daemons.
#include <filesystem>
#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cli/job_client.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/daemons.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace trainctl {
namespace {

namespace fs = std::filesystem;
namespace v1 = trainctl::v1;
using testing::RunResult;
using testing::Subprocess;
using testing::WaitFor;

constexpr int kSteps = 40;

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

class WatchTmuxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string ready = dir_.path() + "/ready";
    coordinator_ = std::make_unique<Subprocess>(
        std::vector<std::string>{TRAINCTL_COORDINATOR_BIN, "--listen", "127.0.0.1:0", "--db",
                                 dir_.path() + "/trainctl.db", "--ready_file", ready, "--db_sync",
                                 "normal"},
        dir_.path() + "/coordinator.log");
    ASSERT_TRUE(WaitFor([&] { return fs::exists(ready); }, absl::Seconds(30))) << Logs();
    address_ = std::string(absl::StripAsciiWhitespace(testing::ReadFileOrEmpty(ready)));
    client_ = std::make_unique<cli::JobClient>(address_);
    worker_ = std::make_unique<Subprocess>(
        std::vector<std::string>{TRAINCTL_WORKER_BIN, "--coordinator", address_, "--node_name",
                                 "node-a", "--work_dir", dir_.path() + "/work", "--slots", "1",
                                 "--heartbeat_interval", "300ms", "--trainer", FAKE_RANK_BIN,
                                 "--nvidia_smi", "/nonexistent/nvidia-smi", "--output_roots",
                                 dir_.path()},
        dir_.path() + "/worker.log");
    ASSERT_TRUE(WaitFor([&] { return testing::OneNodeReady(*client_); }, absl::Seconds(20)))
        << Logs();
  }
  void TearDown() override {
    if (tmux_started_) Tmux({"kill-server"});
    worker_.reset();
    coordinator_.reset();
  }

  RunResult Tmux(std::vector<std::string> args) {
    args.insert(args.begin(), {TRAINCTL_TMUX_BIN, "-S", socket_});
    return testing::Run(args, {}, absl::Seconds(10));
  }
  std::string Pane() { return Tmux({"capture-pane", "-p", "-t", "watch"}).out; }

  // The CLI with the coordinator given before the verb (the global option's place under test).
  RunResult Trainctl(std::vector<std::string> args) {
    args.insert(args.begin(), {TRAINCTL_CLI_BIN, "--coordinator", address_});
    return testing::Run(args);
  }

  std::string Submit() {
    nlohmann::json spec = {{"kind", "sft"},
                           {"name", "watched"},
                           {"model_name_or_path", "tiny"},
                           {"data_path", dir_.path() + "/data"},
                           {"output_dir", dir_.path() + "/out"},
                           {"env",
                            {{"TRAINCTL_FAKE_LINES", absl::StrCat(kSteps)},
                             {"TRAINCTL_FAKE_PERIOD_MS", "150"},
                             {"TRAINCTL_FAKE_TRAINER_METRICS", "1"}}}};
    RunResult submit = Trainctl({"submit", dir_.Write("spec.json", spec.dump()), "-o", "json"});
    EXPECT_EQ(submit.exit_code, 0) << submit.err;
    return nlohmann::json::parse(submit.out, nullptr, false).value("id", "");
  }

  // The scenario's phases, in the order the test runs them.

  // `trainctl watch ID` on a 120 x 30 tmux pane, the shell left open after it exits.
  void StartWatchInTmux(const std::string& id);
  // While it runs: exactly one live line, redrawn in place, with every figure; ls shows progress.
  void ExpectOneLiveLineWhileRunning();
  // Once watch exits: the last live line stays (at 100%, its ETA gone), then the summary.
  void ExpectLastLineThenSummary();
  // Not a terminal: event lines as before, no redrawing, and the summary.
  void ExpectPipedEventsAndSummary(const std::string& id);
  // ls after the end: a full bar, no ETA; the coordinator given after the verb works the same.
  void ExpectLsAfterTheEnd();
  // describe: the loss curve, from 1 down to 0.025 over steps 1..40.
  void ExpectDescribeLossChart(const std::string& id);
  // metrics: every step of the loss, as CSV, and downsampled as JSON; an unknown job is an error.
  void ExpectMetricsCsvAndJson(const std::string& id);

  std::string Logs() {
    return "--- coordinator\n" + testing::ReadFileOrEmpty(dir_.path() + "/coordinator.log") +
           "--- worker\n" + testing::ReadFileOrEmpty(dir_.path() + "/worker.log");
  }

  testing::TempDir dir_;
  const std::string socket_ = dir_.path() + "/tmux.sock";
  bool tmux_started_ = false;
  std::unique_ptr<Subprocess> coordinator_;
  std::unique_ptr<Subprocess> worker_;
  std::string address_;
  std::unique_ptr<cli::JobClient> client_;
};

void WatchTmuxTest::StartWatchInTmux(const std::string& id) {
  RunResult tmux = Tmux({"new-session", "-d", "-s", "watch", "-x", "120", "-y", "30",
                         absl::StrCat(TRAINCTL_CLI_BIN, " --coordinator ", address_, " watch ", id,
                                      "; echo EXIT=$?; sleep 600")});
  ASSERT_EQ(tmux.exit_code, 0) << tmux.err;
  tmux_started_ = true;
}

void WatchTmuxTest::ExpectOneLiveLineWhileRunning() {
  const std::regex live(
      "job-1 running  step ([0-9]+)/40 ▕.{30,}▏ ([0-9]+)%  loss [0-9.]+  1\\.5k tok/s  "
      "ETA ([0-9]+)s  elapsed ([0-9]+)s");
  std::string pane, ls_running;
  int live_step = 0;
  ASSERT_TRUE(WaitFor(
      [&] {
        pane = Pane();
        int live_lines = 0;
        for (const std::string& line : Lines(pane)) {
          std::smatch m;
          if (absl::StartsWith(line, "job-1 running")) ++live_lines;
          if (std::regex_match(line, m, live)) live_step = std::stoi(m[1]);
        }
        EXPECT_LE(live_lines, 1) << pane;
        if (live_step >= 10 && ls_running.empty()) ls_running = Trainctl({"ls"}).out;
        return live_step >= 10 && live_step < kSteps;
      },
      absl::Seconds(40)))
      << pane << "\n"
      << Logs();
  EXPECT_TRUE(absl::StrContains(pane, "state      pending -> scheduled")) << pane;
  // ls while it runs: a bar, a percentage and an ETA in seconds.
  EXPECT_TRUE(std::regex_search(ls_running, std::regex("job-1 .*▕.*▏ [0-9]+%   [0-9]+s ")))
      << ls_running;
}

void WatchTmuxTest::ExpectLastLineThenSummary() {
  std::string pane;
  ASSERT_TRUE(WaitFor([&] { return absl::StrContains(pane = Pane(), "EXIT="); }, absl::Seconds(40)))
      << pane << "\n"
      << Logs();
  EXPECT_TRUE(absl::StrContains(pane, "EXIT=0")) << pane;
  const std::vector<std::string> lines = Lines(pane);
  ASSERT_GE(lines.size(), 3u) << pane;
  EXPECT_TRUE(std::regex_match(
      lines[lines.size() - 3],
      std::regex("job-1 succeeded  step 40/40 ▕(█){30}▏ 100%  loss 0\\.025  1\\.5k tok/s  "
                 "elapsed [0-9]+s")))
      << pane;
  EXPECT_TRUE(std::regex_match(
      lines[lines.size() - 2],
      std::regex("job-1 succeeded after [0-9]+s: step 40/40, loss 1 -> 0\\.025, 0\\.1[4-9][0-9]* "
                 "s/step")))
      << pane;
  for (const std::string& line : lines) EXPECT_LE(line.size(), 3u * 120) << line;
}

void WatchTmuxTest::ExpectPipedEventsAndSummary(const std::string& id) {
  RunResult piped = Trainctl({"watch", id});
  EXPECT_EQ(piped.exit_code, 0) << piped.err;
  EXPECT_FALSE(absl::StrContains(piped.out, "\r")) << piped.out;
  EXPECT_FALSE(absl::StrContains(piped.out, "\x1b")) << piped.out;
  EXPECT_TRUE(absl::StrContains(piped.out, "metric     step 40  loss=0.025")) << piped.out;
  EXPECT_TRUE(absl::StartsWith(Lines(piped.out).back(), "job-1 succeeded after ")) << piped.out;
}

void WatchTmuxTest::ExpectLsAfterTheEnd() {
  RunResult ls = testing::Run({TRAINCTL_CLI_BIN, "ls", "--coordinator", address_});
  ASSERT_EQ(ls.exit_code, 0) << ls.err;
  EXPECT_TRUE(absl::StrContains(Lines(ls.out)[0], "STEP    PROGRESS            ETA   AGE"))
      << ls.out;
  EXPECT_TRUE(absl::StrContains(ls.out, "40/40   ▕██████████▏ 100%   -     ")) << ls.out;
}

void WatchTmuxTest::ExpectDescribeLossChart(const std::string& id) {
  RunResult describe = Trainctl({"describe", id});
  ASSERT_EQ(describe.exit_code, 0) << describe.err;
  EXPECT_TRUE(absl::StrContains(describe.out, "\nloss\n    1 ┤")) << describe.out;
  EXPECT_TRUE(absl::StrContains(describe.out, "0.025 ┤")) << describe.out;
  EXPECT_TRUE(absl::StrContains(
      describe.out, "      └" +
                        [] {
                          std::string axis;
                          for (int i = 0; i < 60; ++i) axis += "─";
                          return axis;
                        }()))
      << describe.out;
  EXPECT_TRUE(std::regex_search(describe.out, std::regex("\n +1 +40\n"))) << describe.out;
  EXPECT_TRUE(absl::StrContains(describe.out, "s/step")) << describe.out;
}

void WatchTmuxTest::ExpectMetricsCsvAndJson(const std::string& id) {
  RunResult csv = Trainctl({"metrics", id, "--name", "loss", "-o", "csv"});
  ASSERT_EQ(csv.exit_code, 0) << csv.err;
  const std::vector<std::string> rows = Lines(csv.out);
  ASSERT_EQ(rows.size(), 1u + kSteps) << csv.out;
  EXPECT_EQ(rows[0], "step,loss");
  EXPECT_EQ(rows[1], "1,1");
  EXPECT_EQ(rows[kSteps], "40,0.025000000000000001");
  RunResult json = Trainctl({"-o", "json", "metrics", id, "--max_points", "5"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  const auto parsed = nlohmann::json::parse(json.out);
  ASSERT_EQ(parsed["series"].size(), 3u) << json.out;  // loss, tokens_per_second, total_steps
  EXPECT_EQ(parsed["series"][0]["name"], "loss");
  EXPECT_EQ(parsed["series"][0]["points"].size(), 5u);
  RunResult unknown = Trainctl({"metrics", "job-7"});
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_EQ(unknown.err, "trainctl: job job-7 not found\n");
}

TEST_F(WatchTmuxTest, OneLiveLineOnATerminalThenTheSummary) {
  ASSERT_NE(std::string(TRAINCTL_TMUX_BIN), "")
      << "tmux not found when CMake was configured; scripts/setup.sh installs it";
  const std::string id = Submit();
  ASSERT_EQ(id, "job-1");
  ASSERT_NO_FATAL_FAILURE(StartWatchInTmux(id));
  ASSERT_NO_FATAL_FAILURE(ExpectOneLiveLineWhileRunning());
  ASSERT_NO_FATAL_FAILURE(ExpectLastLineThenSummary());

  // Then the other views of the same job, against the same daemons.
  ASSERT_NO_FATAL_FAILURE(ExpectPipedEventsAndSummary(id));
  ASSERT_NO_FATAL_FAILURE(ExpectLsAfterTheEnd());
  ASSERT_NO_FATAL_FAILURE(ExpectDescribeLossChart(id));
  ASSERT_NO_FATAL_FAILURE(ExpectMetricsCsvAndJson(id));
}

}  // namespace
}  // namespace trainctl
