// `trainctl-trainer train --launch`: the launch the coordinator decided, as the worker writes it
// (worker/daemon/worker.cc), taken as it is; only its agreement with the rank's environment is
// checked. A probe job needs no model, so these run in a second.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace trainctl {
namespace {

using nlohmann::json;

class TrainerLaunchTest : public ::testing::Test {
 protected:
  std::string Launch(int world_size) {
    const json launch = {{"task_id", "job-1.0.0"},
                         {"job_id", "job-1"},
                         {"world_size", world_size},
                         {"nodes", 1},
                         {"slots", world_size},
                         {"spec",
                          {{"kind", "JOB_KIND_PROBE"},
                           {"resources", {{"nodes", 1}, {"slots_per_node", world_size}}},
                           {"diagnostics", {{"probe_sizes", {1024}}, {"probe_iterations", 1}}}}}};
    return dir_.Write("launch.json", launch.dump(2));
  }

  testing::RunResult Train(std::vector<std::string> args) {
    std::vector<std::string> argv = {TRAINCTL_TRAINER_BIN, "train"};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {"--events", events_, "--threads", "1"});
    return testing::Run(argv, {}, absl::Seconds(60));
  }

  testing::TempDir dir_;
  const std::string events_ = dir_.path() + "/events.jsonl";
};

TEST_F(TrainerLaunchTest, ALaunchRunsAsTheCoordinatorDecidedIt) {
  testing::RunResult r = Train({"--launch", Launch(1)});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(testing::ReadFileOrEmpty(events_), R"("state":"succeeded")"))
      << testing::ReadFileOrEmpty(events_);
}

TEST_F(TrainerLaunchTest, ALaunchForAnotherWorldSizeIsRefusedNamingBoth) {
  testing::RunResult r = Train({"--launch", Launch(2)});  // WORLD_SIZE unset: 1
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(
      absl::StrContains(r.err, "launch.json: the launch is for world size 2, WORLD_SIZE is 1"))
      << r.err;
  EXPECT_TRUE(absl::StrContains(testing::ReadFileOrEmpty(events_), R"("state":"failed")"));
}

TEST_F(TrainerLaunchTest, AnUnreadableLaunchIsNamed) {
  testing::RunResult r = Train({"--launch", dir_.Write("bad.json", "{\"world_size\": ")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(r.err, "bad.json")) << r.err;
  r = Train({"--launch", dir_.Write("typo.json", R"({"world_sise": 1})")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(r.err, "world_sise")) << r.err;
  r = Train({"--launch", dir_.path() + "/missing.json"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(r.err, "cannot read launch file")) << r.err;
}

TEST_F(TrainerLaunchTest, ExactlyOneOfLaunchAndSpec) {
  const std::string launch = Launch(1);
  EXPECT_EQ(Train({}).exit_code, 2);
  testing::RunResult both = Train({"--launch", launch, "--spec", launch});
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(both.err, "usage: trainctl-trainer train --launch")) << both.err;
}

}  // namespace
}  // namespace trainctl
