// The worker's /metrics as Prometheus scrapes it: the real trainctl-coordinator and
// trainctl-worker (--metrics_listen on a free loopback port, a fake nvidia-smi that reports two
// H100s, a kernel log file with an Xid in it), a job of fake ranks (tests/integration/fake_rank.cc)
// running on it; the body is checked for its series and labels and by the real promtool.
#include <signal.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cli/job_client.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/daemons.h"
#include "tests/testing/promtool.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace trainctl {
namespace {

namespace fs = std::filesystem;
namespace v1 = trainctl::v1;
using testing::Subprocess;
using testing::WaitFor;

// Answers the worker's two queries as the real nvidia-smi does on an H100 SXM node: discovery
// (with a header and units) and the metrics poll (noheader,nounits); GPU 1's power reads [N/A].
constexpr char kFakeNvidiaSmi[] = R"(#!/bin/sh
case "$1" in
  --query-gpu=index,uuid,name,memory.total)
    echo 'index, uuid, name, memory.total [MiB]'
    echo '0, GPU-8f6c3b1e-2a4d-4c1b-9e77-0d1c5a7e3f21, NVIDIA H100 80GB HBM3, 81559 MiB'
    echo '1, GPU-1b2c9d3e-7f60-4a8b-b1c2-d3e4f5a6b7c8, NVIDIA H100 80GB HBM3, 81559 MiB' ;;
  --query-gpu=index,uuid,name,utilization.gpu,memory.used,memory.total,power.draw,temperature.gpu,clocks.sm,ecc.errors.uncorrected.volatile.total)
    [ "$2" = --format=csv,noheader,nounits ] || { echo "bad format: $2"; exit 2; }
    echo '0, GPU-8f6c3b1e-2a4d-4c1b-9e77-0d1c5a7e3f21, NVIDIA H100 80GB HBM3, 97, 71234, 81559, 686.43, 62, 1980, 0'
    echo '1, GPU-1b2c9d3e-7f60-4a8b-b1c2-d3e4f5a6b7c8, NVIDIA H100 80GB HBM3, 88, 70001, 81559, [N/A], 59, 1980, 0' ;;
  *) echo "unexpected arguments: $*"; exit 2 ;;
esac
)";

// The GPUs' labels as rendered: sorted by name.
constexpr char kGpu0[] =
    R"({Hostname="node-gpu",UUID="GPU-8f6c3b1e-2a4d-4c1b-9e77-0d1c5a7e3f21",gpu="0",model_name="NVIDIA H100 80GB HBM3"})";
constexpr char kGpu1[] =
    R"({Hostname="node-gpu",UUID="GPU-1b2c9d3e-7f60-4a8b-b1c2-d3e4f5a6b7c8",gpu="1",model_name="NVIDIA H100 80GB HBM3"})";

// The value of the sample whose line starts with `series` (name and labels), or -1.
double Sample(const std::string& body, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(body, '\n')) {
    if (!absl::StartsWith(line, series + " ")) continue;
    double v = 0;
    return absl::SimpleAtod(line.substr(series.size() + 1), &v) ? v : -1;
  }
  return -1;
}

class WorkerMetricsTest : public ::testing::Test {
 protected:
  ~WorkerMetricsTest() override {
    worker_.reset();
    coordinator_.reset();
  }

  void StartDaemons() {
    const std::string ready = dir_.path() + "/ready";
    coordinator_ = std::make_unique<Subprocess>(
        std::vector<std::string>{TRAINCTL_COORDINATOR_BIN, "--listen", "127.0.0.1:0", "--db",
                                 dir_.path() + "/trainctl.db", "--ready_file", ready,
                                 "--lease_timeout", "5s", "--db_sync", "normal"},
        dir_.path() + "/coordinator.log");
    ASSERT_TRUE(WaitFor([&] { return fs::exists(ready); }, absl::Seconds(30))) << Logs();
    address_ = std::string(absl::StripAsciiWhitespace(testing::ReadFileOrEmpty(ready)));
    client_ = std::make_unique<cli::JobClient>(address_);

    const std::string smi = dir_.Write("bin/nvidia-smi", kFakeNvidiaSmi);
    ASSERT_EQ(chmod(smi.c_str(), 0755), 0);
    const std::string kernel_log = dir_.Write(
        "kern.log",
        "[    0.000000] Linux version 6.1.0-13-amd64\n"
        "[ 4711.123456] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has "
        "fallen off the bus.\n");
    const std::string metrics_ready = dir_.path() + "/metrics-ready";
    worker_ = std::make_unique<Subprocess>(std::vector<std::string>{TRAINCTL_WORKER_BIN,
                                                                    "--coordinator",
                                                                    address_,
                                                                    "--node_name",
                                                                    "node-gpu",
                                                                    "--work_dir",
                                                                    dir_.path() + "/work",
                                                                    "--heartbeat_interval",
                                                                    "300ms",
                                                                    "--reconnect_max",
                                                                    "500ms",
                                                                    "--trainer",
                                                                    FAKE_RANK_BIN,
                                                                    "--nvidia_smi",
                                                                    smi,
                                                                    "--output_roots",
                                                                    dir_.path(),
                                                                    "--metrics_listen",
                                                                    "127.0.0.1:0",
                                                                    "--metrics_ready_file",
                                                                    metrics_ready,
                                                                    "--kernel_log",
                                                                    kernel_log,
                                                                    "--gpu_metrics_interval",
                                                                    "200ms"},
                                           dir_.path() + "/worker.log");
    ASSERT_TRUE(WaitFor([&] { return fs::exists(metrics_ready); }, absl::Seconds(20))) << Logs();
    const std::string bound =
        std::string(absl::StripAsciiWhitespace(testing::ReadFileOrEmpty(metrics_ready)));
    const size_t colon = bound.rfind(':');
    ASSERT_NE(colon, std::string::npos) << bound;
    metrics_host_ = bound.substr(0, colon);
    ASSERT_TRUE(absl::SimpleAtoi(bound.substr(colon + 1), &metrics_port_)) << bound;
    ASSERT_GT(metrics_port_, 0) << bound;
    ASSERT_TRUE(WaitFor([&] { return testing::OneNodeReady(*client_); }, absl::Seconds(20)))
        << Logs();
  }

  std::string Scrape() {
    std::string content_type;
    int status = 0;
    std::string body =
        testing::HttpGet(metrics_host_, metrics_port_, "/metrics", &content_type, &status);
    EXPECT_EQ(status, 200) << body;
    EXPECT_EQ(content_type, "text/plain; version=0.0.4; charset=utf-8");
    return body;
  }

  std::string Submit(const nlohmann::json& env) {
    const nlohmann::json spec = {{"kind", "sft"},
                                 {"name", "metrics"},
                                 {"model_name_or_path", "tiny"},
                                 {"data_path", dir_.path() + "/data"},
                                 {"output_dir", dir_.path() + "/out"},
                                 {"resources", {{"nodes", 1}, {"slots_per_node", 2}}},
                                 {"env", env}};
    testing::RunResult r = testing::Run(
        {TRAINCTL_CLI_BIN, "submit", dir_.Write("job.json", spec.dump()), "-o", "json"},
        {{"TRAINCTL_COORDINATOR", address_}});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    return j.is_object() && j.contains("id") ? j["id"].get<std::string>() : "";
  }

  v1::Job Get(const std::string& id) {
    auto job = client_->Get(id);
    return job.ok() ? *job : v1::Job();
  }

  std::string Logs() {
    return "--- coordinator\n" + testing::ReadFileOrEmpty(dir_.path() + "/coordinator.log") +
           "--- worker\n" + testing::ReadFileOrEmpty(dir_.path() + "/worker.log");
  }

  testing::TempDir dir_;
  std::unique_ptr<Subprocess> coordinator_;
  std::unique_ptr<Subprocess> worker_;
  std::string address_;
  std::unique_ptr<cli::JobClient> client_;
  std::string metrics_host_;
  int metrics_port_ = 0;
};

TEST_F(WorkerMetricsTest, ServesGpuRankAndSessionSeriesWhileAJobRunsPromtoolClean) {
  StartDaemons();
  const std::string node = R"({node="node-gpu"})";
  std::string body;
  // The first GPU poll and the session's registration land shortly after start-up.
  ASSERT_TRUE(WaitFor(
      [&] {
        body = Scrape();
        return Sample(body, std::string("trainctl_gpu_utilization_ratio") + kGpu0) >= 0 &&
               Sample(body, "trainctl_worker_connected" + node) == 1;
      },
      absl::Seconds(20)))
      << body << Logs();
  EXPECT_EQ(testing::PromtoolCheckMetrics(body), "") << body;
  EXPECT_EQ(Sample(body, "trainctl_worker_slots" + node), 2) << body;
  EXPECT_EQ(Sample(body, "trainctl_worker_tasks" + node), 0) << body;
  EXPECT_EQ(Sample(body, "trainctl_worker_reconnects_total" + node), 0) << body;
  EXPECT_GE(Sample(body, "trainctl_worker_outbox_messages" + node), 0) << body;
  EXPECT_EQ(Sample(body, "trainctl_worker_outbox_spilled_bytes" + node), 0) << body;
  EXPECT_TRUE(absl::StrContains(body, R"(trainctl_worker_info{node="node-gpu",version=")")) << body;

  // The fake nvidia-smi's readings, in base units, with DCGM-exporter's labels.
  EXPECT_EQ(Sample(body, std::string("trainctl_gpu_utilization_ratio") + kGpu0), 0.97) << body;
  EXPECT_EQ(Sample(body, std::string("trainctl_gpu_memory_used_bytes") + kGpu0),
            71234.0 * 1024 * 1024);
  EXPECT_EQ(Sample(body, std::string("trainctl_gpu_memory_total_bytes") + kGpu1),
            81559.0 * 1024 * 1024);
  EXPECT_EQ(Sample(body, std::string("trainctl_gpu_power_watts") + kGpu0), 686.43);
  EXPECT_EQ(Sample(body, std::string("trainctl_gpu_power_watts") + kGpu1), -1) << "[N/A]";
  EXPECT_EQ(Sample(body, std::string("trainctl_gpu_temperature_celsius") + kGpu1), 59);
  EXPECT_EQ(Sample(body, std::string("trainctl_gpu_sm_clock_hertz") + kGpu0), 1980e6);
  EXPECT_EQ(Sample(body, std::string("trainctl_gpu_ecc_uncorrected_errors_total") + kGpu1), 0);
  EXPECT_EQ(Sample(body, R"(trainctl_gpu_xid_errors_total{Hostname="node-gpu",xid="79"})"), 1)
      << body;

  // A two-rank job: each rank's CPU time and resident set while it runs.
  const std::string id =
      Submit({{"TRAINCTL_FAKE_LINES", "100000"}, {"TRAINCTL_FAKE_PERIOD_MS", "5"}});
  ASSERT_FALSE(id.empty());
  auto rank = [&](int r) {
    return absl::StrCat(R"({job=")", id, R"(",node="node-gpu",rank=")", r, R"(",task=")", id,
                        R"(.0.0"})");
  };
  ASSERT_TRUE(WaitFor(
      [&] {
        body = Scrape();
        return Sample(body, "trainctl_rank_resident_memory_bytes" + rank(0)) > 0 &&
               Sample(body, "trainctl_rank_resident_memory_bytes" + rank(1)) > 0;
      },
      absl::Seconds(30)))
      << body << Logs();
  EXPECT_EQ(testing::PromtoolCheckMetrics(body), "") << body;
  EXPECT_GE(Sample(body, "trainctl_rank_cpu_seconds_total" + rank(0)), 0) << body;
  EXPECT_GE(Sample(body, "trainctl_rank_cpu_seconds_total" + rank(1)), 0) << body;
  EXPECT_EQ(Sample(body, "trainctl_worker_tasks" + node), 1) << body;
  // The ranks print a line every 5 ms: the outbox is busy, and acknowledged as it goes.
  EXPECT_GE(Sample(body, "trainctl_worker_outbox_messages" + node), 0) << body;
  EXPECT_EQ(Sample(body, "trainctl_worker_connected" + node), 1) << body;

  // Cancelled: the ranks' series go with them.
  ASSERT_TRUE(client_->Cancel(id, "test done").ok());
  ASSERT_TRUE(WaitFor(
      [&] {
        body = Scrape();
        return !absl::StrContains(body, "trainctl_rank_cpu_seconds_total{") &&
               Sample(body, "trainctl_worker_tasks" + node) == 0;
      },
      absl::Seconds(30)))
      << body << Logs();
  EXPECT_FALSE(absl::StrContains(body, "trainctl_rank_resident_memory_bytes{")) << body;
  EXPECT_EQ(testing::PromtoolCheckMetrics(body), "") << body;
}

// The coordinator restarts: the session's gauge drops while it is away and the reconnect is
// counted.
TEST_F(WorkerMetricsTest, CountsReconnectsAfterTheCoordinatorRestarts) {
  StartDaemons();
  const std::string node = R"({node="node-gpu"})";
  std::string body;
  ASSERT_TRUE(
      WaitFor([&] { return Sample(body = Scrape(), "trainctl_worker_connected" + node) == 1; },
              absl::Seconds(20)))
      << body;
  coordinator_->Kill(SIGKILL);
  ASSERT_TRUE(coordinator_->Wait(absl::Seconds(10)).ok());
  ASSERT_TRUE(
      WaitFor([&] { return Sample(body = Scrape(), "trainctl_worker_connected" + node) == 0; },
              absl::Seconds(20)))
      << body;
  // Again on the same address, so the worker finds it.
  const std::string ready = dir_.path() + "/ready";
  fs::remove(ready);
  coordinator_ = std::make_unique<Subprocess>(
      std::vector<std::string>{TRAINCTL_COORDINATOR_BIN, "--listen", address_, "--db",
                               dir_.path() + "/trainctl.db", "--ready_file", ready,
                               "--lease_timeout", "5s", "--db_sync", "normal"},
      dir_.path() + "/coordinator-2.log");
  ASSERT_TRUE(WaitFor(
      [&] {
        body = Scrape();
        return Sample(body, "trainctl_worker_connected" + node) == 1 &&
               Sample(body, "trainctl_worker_reconnects_total" + node) == 1;
      },
      absl::Seconds(30)))
      << body << Logs();
  EXPECT_EQ(testing::PromtoolCheckMetrics(body), "") << body;
}

}  // namespace
}  // namespace trainctl
