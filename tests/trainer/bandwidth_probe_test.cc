// The bandwidth probe on real Gloo process groups: forked ranks (before this process runs any
// LibTorch op) rendezvous on loopback, run the sweep and write their reports; and a `kind: probe`
// job through real trainer processes, down to the `bandwidth` event the coordinator reads.
#include "worker/trainer/diagnostics/bandwidth_probe.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/diagnostics_reports.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace trainctl::trainer {
namespace {

namespace v1 = trainctl::v1;

// Runs the probe on `world` forked ranks with `options_of(rank)`; each rank writes its report (as
// JSON) to <dir>/report-<rank>.json. True when every rank succeeded.
bool ProbeOnRanks(int world, const std::string& dir,
                  const std::function<BandwidthProbeOptions(int)>& options_of) {
  const int port = testing::FreeLoopbackPort();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      zero::CommOptions options;
      options.rank = r;
      options.world_size = world;
      options.master_port = port;
      options.timeout = std::chrono::seconds(30);
      auto comm = zero::Comm::Create(options);
      if (!comm.ok()) {
        std::cerr << comm.status() << "\n";
        _exit(2);
      }
      auto report = RunBandwidthProbe(**comm, torch::kCPU, options_of(r));
      if (!report.ok()) {
        std::cerr << "rank " << r << ": " << report.status() << "\n";
        _exit(1);
      }
      std::ofstream(absl::StrCat(dir, "/report-", r, ".json")) << ReportJson(*report).dump();
      _exit(0);
    }
    pids.push_back(pid);
  }
  bool all = true;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    all = all && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return all;
}

v1::BandwidthReport ReadReport(const std::string& path) {
  auto report =
      BandwidthReportFromEvent({{"report", nlohmann::json::parse(testing::ReadFileOrEmpty(path))}});
  EXPECT_TRUE(report.ok()) << report.status();
  return report.ok() ? *report : v1::BandwidthReport();
}

TEST(BandwidthProbeTest, ThreeRanksMeasureEveryCollectiveWithNcclTestsFormulas) {
  testing::TempDir dir;
  ASSERT_TRUE(ProbeOnRanks(3, dir.path(), [](int r) {
    BandwidthProbeOptions o;
    o.sizes = {1024, 64 << 10, 1 << 20};
    o.iterations = 3;
    o.host = r < 2 ? "node-a" : "node-b";
    return o;
  }));
  const v1::BandwidthReport report = ReadReport(dir.path() + "/report-0.json");
  EXPECT_EQ(report.world_size(), 3);
  EXPECT_EQ(report.nodes(), 2);
  EXPECT_EQ(report.backend(), "gloo");
  EXPECT_EQ(report.dtype(), "float32");
  EXPECT_EQ(report.iterations(), 3);
  EXPECT_THAT(report.rank_hosts(), ::testing::ElementsAre("node-a", "node-a", "node-b"));
  ASSERT_EQ(report.rows_size(), 9);
  // 1024 bytes: 256 floats, rounded down to 255 (a multiple of 3 ranks).
  const int64_t bytes[] = {1020, 65532, 1048572};
  const char* collectives[] = {"all_reduce", "all_gather", "reduce_scatter"};
  for (int i = 0; i < 9; ++i) {
    const v1::BandwidthRow& row = report.rows(i);
    SCOPED_TRACE(absl::StrCat(row.collective(), " ", row.bytes()));
    EXPECT_EQ(row.collective(), collectives[i % 3]);
    EXPECT_EQ(row.bytes(), bytes[i / 3]);
    ASSERT_EQ(row.rank_time_us_size(), 3);
    double slowest = 0;
    for (double t : row.rank_time_us()) slowest = std::max(slowest, t);
    EXPECT_GT(slowest, 0);
    EXPECT_DOUBLE_EQ(row.time_us(), slowest);
    EXPECT_DOUBLE_EQ(row.algbw_gbps(), row.bytes() / row.time_us() / 1e3);
    // nccl-tests: all_reduce x 2(n-1)/n, all_gather and reduce_scatter x (n-1)/n.
    EXPECT_NEAR(row.busbw_gbps() / row.algbw_gbps(), i % 3 == 0 ? 4.0 / 3 : 2.0 / 3, 1e-12);
  }
  // Every rank has the whole report.
  for (int r = 1; r < 3; ++r) {
    const v1::BandwidthReport other = ReadReport(absl::StrCat(dir.path(), "/report-", r, ".json"));
    ASSERT_EQ(other.rows_size(), 9);
    EXPECT_EQ(other.rows(8).rank_time_us(2), report.rows(8).rank_time_us(2));
  }
  for (const v1::BandwidthRow& row : report.rows()) {
    std::cout << absl::StrFormat(
        "gloo 3 ranks %-15s %8d B  %9.1f us  algbw %7.4f GB/s  busbw %7.4f GB/s\n",
        row.collective(), row.bytes(), row.time_us(), row.algbw_gbps(), row.busbw_gbps());
  }
}

TEST(BandwidthProbeTest, ASlowRankStandsOutInItsOwnTimes) {
  testing::TempDir dir;
  constexpr auto kDelay = std::chrono::milliseconds(50);
  ASSERT_TRUE(ProbeOnRanks(3, dir.path(), [&](int r) {
    BandwidthProbeOptions o;
    o.sizes = {4096, 256 << 10};
    o.iterations = 2;
    o.host = "node-a";
    if (r == 1) {  // rank 1 finishes every collective late (a slow device or link of its own)
      o.after_collective = [&](const std::string&, int64_t) {
        std::this_thread::sleep_for(kDelay);
      };
    }
    return o;
  }));
  const v1::BandwidthReport report = ReadReport(dir.path() + "/report-0.json");
  ASSERT_EQ(report.rows_size(), 6);
  for (const v1::BandwidthRow& row : report.rows()) {
    SCOPED_TRACE(absl::StrCat(row.collective(), " ", row.bytes()));
    ASSERT_EQ(row.rank_time_us_size(), 3);
    // Its peers' times hold no part of its delay (a loaded machine's collectives still take far
    // less than the delay).
    EXPECT_GE(row.rank_time_us(1), 50000);
    EXPECT_GT(row.rank_time_us(1), row.rank_time_us(0) + 25000);
    EXPECT_GT(row.rank_time_us(1), row.rank_time_us(2) + 25000);
    EXPECT_EQ(row.time_us(), row.rank_time_us(1));
  }
}

TEST(BandwidthProbeTest, OptionsOutOfRangeAreRefused) {
  testing::TempDir dir;
  EXPECT_FALSE(ProbeOnRanks(1, dir.path(), [](int) {
    BandwidthProbeOptions o;
    o.sizes = {1024};
    o.iterations = 0;
    return o;
  }));
  EXPECT_FALSE(ProbeOnRanks(1, dir.path(), [](int) {
    BandwidthProbeOptions o;
    o.sizes = {2};
    return o;
  }));
  EXPECT_EQ(BusBandwidthFactor("all_reduce", 8), 2.0 * 7 / 8);
  EXPECT_EQ(BusBandwidthFactor("all_gather", 8), 7.0 / 8);
  EXPECT_EQ(BusBandwidthFactor("reduce_scatter", 1), 0);
}

TEST(BandwidthProbeTest, AProbeJobThroughTheTrainerEmitsTheBandwidthEvent) {
  testing::TempDir dir;
  const std::string spec = dir.Write(
      "spec.json", R"({"kind": "probe", "resources": {"nodes": 1, "slots_per_node": 2},)"
                   R"( "diagnostics": {"probe_sizes": [4096, 65536], "probe_iterations": 2}})");
  const int port = testing::FreeLoopbackPort();
  std::vector<std::unique_ptr<testing::Subprocess>> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(std::make_unique<testing::Subprocess>(
        std::vector<std::string>{
            "/usr/bin/env", absl::StrCat("RANK=", r), absl::StrCat("LOCAL_RANK=", r),
            "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", absl::StrCat("MASTER_PORT=", port),
            TRAINCTL_TRAINER_BIN, "train", "--spec", spec, "--events",
            absl::StrCat(dir.path(), "/events-", r, ".jsonl"), "--threads", "1"},
        absl::StrCat(dir.path(), "/rank-", r, ".log")));
  }
  for (int r = 0; r < 2; ++r) {
    auto code = ranks[r]->Wait(absl::Seconds(120));
    ASSERT_TRUE(code.ok() && *code == 0)
        << "rank " << r << ": "
        << testing::ReadFileOrEmpty(absl::StrCat(dir.path(), "/rank-", r, ".log"));
  }
  std::optional<v1::BandwidthReport> report;
  bool succeeded = false;
  for (absl::string_view line : absl::StrSplit(
           testing::ReadFileOrEmpty(dir.path() + "/events-0.jsonl"), '\n', absl::SkipEmpty())) {
    const nlohmann::json event = nlohmann::json::parse(line);
    if (event["type"] == "bandwidth") {
      auto parsed = BandwidthReportFromEvent(event);
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      report = *parsed;
    }
    if (event["type"] == "status" && event["state"] == "succeeded") succeeded = true;
  }
  EXPECT_TRUE(succeeded);
  ASSERT_TRUE(report.has_value());
  EXPECT_EQ(report->world_size(), 2);
  EXPECT_EQ(report->backend(), "gloo");
  ASSERT_EQ(report->rows_size(), 6);
  EXPECT_EQ(report->rows(5).collective(), "reduce_scatter");
  EXPECT_EQ(report->rows(5).bytes(), 65536);
  EXPECT_EQ(report->rows(5).rank_time_us_size(), 2);
  // Rank 1 speaks for no one: no bandwidth event of its own.
  EXPECT_THAT(testing::ReadFileOrEmpty(dir.path() + "/events-1.jsonl"),
              ::testing::Not(::testing::HasSubstr("\"bandwidth\"")));
}

}  // namespace
}  // namespace trainctl::trainer
