// RunTrainctl's handling of options before the verb, without a coordinator (usage errors only;
// tests/integration/watch_tmux_test.cc runs `trainctl --coordinator H:P ls` against a real one).
#include "cli/commands.h"

#include <sstream>

#include "gtest/gtest.h"

namespace trainctl::cli {
namespace {

struct Result {
  int code;
  std::string out, err;
};

Result Trainctl(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  const int code = RunTrainctl(args, "", out, err);
  return {code, out.str(), err.str()};
}

TEST(RunTrainctlTest, GlobalOptionsBeforeTheVerbAreCheckedAsAfterIt) {
  Result bad = Trainctl({"--state", "running", "ls"});
  EXPECT_EQ(bad.code, kExitUsage);
  EXPECT_EQ(bad.err.substr(0, bad.err.find('\n')),
            "trainctl: --state: unknown option before the command (only --coordinator and -o may "
            "come before it)");

  Result no_verb = Trainctl({"--coordinator", "h:1"});
  EXPECT_EQ(no_verb.code, kExitUsage);
  EXPECT_EQ(no_verb.err.substr(0, no_verb.err.find('\n')), "trainctl: no command given");

  Result not_for_verb =
      Trainctl({"--coordinator", "h:1", "tokenize", "--tokenizer", "/nonexistent"});
  EXPECT_EQ(not_for_verb.code, kExitUsage);
  EXPECT_EQ(not_for_verb.err, "trainctl tokenize: --coordinator: not an option of this command\n");

  Result format = Trainctl({"-o", "csv", "ls"});
  EXPECT_EQ(format.code, kExitUsage);
  EXPECT_EQ(format.err, "trainctl ls: -o must be table or json, got 'csv'\n");
  Result metrics_format = Trainctl({"-o", "yaml", "metrics", "job-1"});
  EXPECT_EQ(metrics_format.err, "trainctl metrics: -o must be table, csv or json, got 'yaml'\n");

  Result data = Trainctl({"-o", "json", "prepare"});
  EXPECT_EQ(data.code, kExitUsage);
  EXPECT_EQ(data.err, "trainctl prepare: --output: not an option of this command\n");
}

TEST(RunTrainctlTest, MetricsChecksItsArguments) {
  Result none = Trainctl({"metrics"});
  EXPECT_EQ(none.code, kExitFailed);
  EXPECT_EQ(none.err, "trainctl: metrics needs one job ID\n");
  Result points = Trainctl({"metrics", "job-1", "--max_points", "0"});
  EXPECT_EQ(points.code, kExitFailed);
  EXPECT_EQ(points.err, "trainctl: --max_points: must be a positive integer\n");
}

}  // namespace
}  // namespace trainctl::cli
