// `trainctl diagnose` end to end: the real trainctl-coordinator, one trainctl-worker with two CPU
// slots and the real trainctl-trainer on loopback. `trainctl diagnose --probe` runs a bandwidth
// probe job (kind: probe) on Gloo and prints its table; a probe job whose env points NCCL's sockets
// at the loopback interface is diagnosed with that finding and its remedy (-o json).
#include <filesystem>
#include <string>
#include <vector>

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
using testing::WaitFor;

class DiagnoseTest : public ::testing::Test, protected testing::Daemons {
 protected:
  std::string daemon_dir() const override { return dir_.path(); }
  ~DiagnoseTest() override { StopDaemons(); }

  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(StartCoordinator());
    StartWorker("node-a", TRAINCTL_TRAINER_BIN, {"--slots", "2", "--output_roots", dir_.path()});
    ASSERT_TRUE(WaitFor([&] { return testing::OneNodeReady(*client_); }, absl::Seconds(20)))
        << Logs();
  }

  RunResult Cli(std::vector<std::string> args) {
    args.insert(args.begin(), TRAINCTL_CLI_BIN);
    return testing::Run(args, {{"TRAINCTL_COORDINATOR", address_}}, absl::Seconds(180));
  }

  testing::TempDir dir_;
};

TEST_F(DiagnoseTest, ProbeOnGlooAndAFindingWithItsRemedy) {
  RunResult probe = Cli({"diagnose", "--probe", "--slots_per_node", "2", "--sizes", "4096,262144",
                         "--timeout", "120"});
  ASSERT_EQ(probe.exit_code, 0) << probe.out << probe.err << Logs();
  for (const char* want : {"Diagnosis of job", "node-a", "BANDWIDTH PROBE", "gloo, 2 ranks",
                           "all_reduce", "all_gather", "reduce_scatter", "256 KiB", "FINDINGS"}) {
    EXPECT_NE(probe.out.find(want), std::string::npos) << want << "\n" << probe.out;
  }

  const std::string spec = dir_.Write("probe.yaml",
                                      "name: probe-on-lo\n"
                                      "kind: probe\n"
                                      "resources: {nodes: 1, slots_per_node: 2}\n"
                                      "env: {NCCL_SOCKET_IFNAME: lo}\n"
                                      "diagnostics: {probe_sizes: [4096], probe_iterations: 2}\n");
  RunResult submitted = Cli({"submit", spec, "-o", "json"});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.err;
  const auto job = nlohmann::json::parse(submitted.out, nullptr, false);
  ASSERT_TRUE(job.is_object() && job.contains("id")) << submitted.out;
  const std::string id = job["id"].get<std::string>();
  WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(120));

  RunResult diagnosed = Cli({"diagnose", id, "-o", "json"});
  ASSERT_EQ(diagnosed.exit_code, 0) << diagnosed.err;
  const auto d = nlohmann::json::parse(diagnosed.out, nullptr, false);
  ASSERT_TRUE(d.is_object()) << diagnosed.out;
  EXPECT_EQ(d["job_id"], id);
  ASSERT_EQ(d["nodes"].size(), 1u) << diagnosed.out;
  EXPECT_EQ(d["nodes"][0]["node"], "node-a");
  EXPECT_EQ(d["bandwidth"]["backend"], "gloo");
  EXPECT_EQ(d["bandwidth"]["rows"].size(), 3u) << diagnosed.out;  // three collectives, one size
  ASSERT_EQ(d["findings"].size(), 1u) << diagnosed.out;
  EXPECT_EQ(d["findings"][0]["rule"], "socket_ifname_bad_interface");
  EXPECT_EQ(d["findings"][0]["severity"], "SEVERITY_WARNING");
  EXPECT_NE(d["findings"][0]["remedy"].get<std::string>().find("NCCL_SOCKET_IFNAME"),
            std::string::npos);

  RunResult text = Cli({"diagnose", id});
  EXPECT_NE(text.out.find("WARNING  socket_ifname_bad_interface (node-a)"), std::string::npos)
      << text.out;
  EXPECT_EQ(Cli({"diagnose", "424242"}).exit_code, 1);
}

}  // namespace
}  // namespace trainctl
