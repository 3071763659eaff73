// The coordinator's /metrics as Prometheus scrapes it: the real trainctl-coordinator
// (--metrics_listen on a free loopback port, SQLite file) and a real trainctl-worker whose ranks
// are tests/integration/fake_rank.cc or the real trainctl-trainer on the tiny model. The body is
// checked for its series and labels while a job runs and after it ends, and by the real promtool.
#include <filesystem>
#include <limits>
#include <optional>

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
#include "tests/trainer/shapes_fixture.h"

namespace trainctl {
namespace {

namespace fs = std::filesystem;
namespace v1 = trainctl::v1;
using testing::Subprocess;
using testing::WaitFor;

// The value of the sample whose line starts with `series` (name and labels, sorted by name); NaN's
// text is prometheus-cpp's "Nan".
// nullopt when there is no such line.
std::optional<double> Sample(const std::string& body, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(body, '\n')) {
    if (!absl::ConsumePrefix(&line, series + " ")) continue;
    double v = 0;
    if (line == "Nan") return std::numeric_limits<double>::quiet_NaN();
    return absl::SimpleAtod(line, &v) ? std::optional<double>(v) : std::nullopt;
  }
  return std::nullopt;
}

class CoordinatorMetricsTest : public testing::ShapesTrainingTest {
 protected:
  ~CoordinatorMetricsTest() override {
    worker_.reset();
    coordinator_.reset();
  }

  // The coordinator with /metrics, and one worker of one slot whose ranks run `trainer`.
  void StartDaemons(const std::string& trainer) {
    const std::string ready = dir_.path() + "/ready";
    const std::string metrics_ready = dir_.path() + "/metrics-ready";
    coordinator_ = std::make_unique<Subprocess>(
        std::vector<std::string>{TRAINCTL_COORDINATOR_BIN, "--listen", "127.0.0.1:0", "--db",
                                 dir_.path() + "/var/trainctl.db", "--ready_file", ready,
                                 "--metrics_listen", "127.0.0.1:0", "--metrics_ready_file",
                                 metrics_ready, "--lease_timeout", "5s", "--db_sync", "normal"},
        dir_.path() + "/coordinator.log");
    ASSERT_TRUE(WaitFor([&] { return fs::exists(ready); }, absl::Seconds(30))) << Logs();
    // Written before the gRPC ready file.
    ASSERT_TRUE(fs::exists(metrics_ready));
    address_ = std::string(absl::StripAsciiWhitespace(testing::ReadFileOrEmpty(ready)));
    client_ = std::make_unique<cli::JobClient>(address_);
    const std::string bound =
        std::string(absl::StripAsciiWhitespace(testing::ReadFileOrEmpty(metrics_ready)));
    const size_t colon = bound.rfind(':');
    ASSERT_NE(colon, std::string::npos) << bound;
    metrics_host_ = bound.substr(0, colon);
    ASSERT_TRUE(absl::SimpleAtoi(bound.substr(colon + 1), &metrics_port_)) << bound;

    worker_ = std::make_unique<Subprocess>(std::vector<std::string>{TRAINCTL_WORKER_BIN,
                                                                    "--coordinator",
                                                                    address_,
                                                                    "--node_name",
                                                                    "node-a",
                                                                    "--work_dir",
                                                                    dir_.path() + "/work",
                                                                    "--slots",
                                                                    "1",
                                                                    "--heartbeat_interval",
                                                                    "300ms",
                                                                    "--reconnect_max",
                                                                    "500ms",
                                                                    "--kill_grace",
                                                                    "2s",
                                                                    "--trainer",
                                                                    trainer,
                                                                    "--nvidia_smi",
                                                                    "/nonexistent/nvidia-smi",
                                                                    "--output_roots",
                                                                    dir_.path()},
                                           dir_.path() + "/worker.log");
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

  // `trainctl submit` (one SubmitJob RPC).
  std::string Submit(const std::string& spec_file) {
    testing::RunResult r = testing::Run({TRAINCTL_CLI_BIN, "submit", spec_file, "-o", "json"},
                                        {{"TRAINCTL_COORDINATOR", address_}});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    auto out = nlohmann::json::parse(r.out, nullptr, false);
    return out.is_object() && out.contains("id") ? out["id"].get<std::string>() : "";
  }

  // Waits until the job's series are gone from /metrics; returns the last body.
  std::string WaitSeriesGone(const std::string& id) {
    std::string body;
    EXPECT_TRUE(WaitFor(
        [&] { return !absl::StrContains(body = Scrape(), absl::StrCat("job=\"", id, "\"")); },
        absl::Seconds(30)))
        << body << Logs();
    return body;
  }

  std::string Logs() {
    return "--- coordinator\n" + testing::ReadFileOrEmpty(dir_.path() + "/coordinator.log") +
           "--- worker\n" + testing::ReadFileOrEmpty(dir_.path() + "/worker.log");
  }

  std::unique_ptr<Subprocess> coordinator_;
  std::unique_ptr<Subprocess> worker_;
  std::string address_;
  std::unique_ptr<cli::JobClient> client_;
  std::string metrics_host_;
  int metrics_port_ = 0;
};

TEST_F(CoordinatorMetricsTest, JobsNodesRpcsAndARunningJobsSeriesPromtoolClean) {
  StartDaemons(FAKE_RANK_BIN);
  std::string body = Scrape();
  EXPECT_EQ(testing::PromtoolCheckMetrics(body), "") << body;
  EXPECT_TRUE(absl::StrContains(body, "trainctl_build_info{revision=\"")) << body;
  EXPECT_EQ(Sample(body, R"(trainctl_nodes{state="live"})"), 1) << body;
  EXPECT_EQ(Sample(body, R"(trainctl_nodes{state="lost"})"), 0) << body;
  EXPECT_EQ(Sample(body, "trainctl_cluster_slots"), 1) << body;
  EXPECT_EQ(Sample(body, "trainctl_cluster_free_slots"), 1) << body;
  EXPECT_EQ(Sample(body, R"(trainctl_jobs{kind="sft",state="running"})"), 0) << body;

  // Fake ranks that log a loss every 20 ms for long enough to be scraped.
  const std::string id = Submit(WriteSpec("fake", dir_.path() + "/out-fake", {},
                                          {{"resources", {{"nodes", 1}, {"slots_per_node", 1}}},
                                           {"env",
                                            {{"TRAINCTL_FAKE_LINES", "100000"},
                                             {"TRAINCTL_FAKE_PERIOD_MS", "20"},
                                             {"TRAINCTL_FAKE_TRAINER_METRICS", "1"}}}}));
  ASSERT_FALSE(id.empty());
  const std::string labels =
      absl::StrCat(R"({job=")", id, R"(",kind="sft",name="fake",nodes="1"})");
  ASSERT_TRUE(WaitFor(
      [&] {
        body = Scrape();
        return Sample(body, "trainctl_job_loss" + labels).has_value() &&
               Sample(body, R"(trainctl_jobs{kind="sft",state="running"})") == 1;
      },
      absl::Seconds(30)))
      << body << Logs();
  EXPECT_EQ(testing::PromtoolCheckMetrics(body), "") << body;
  const double step = Sample(body, "trainctl_job_step" + labels).value_or(-1);
  EXPECT_GE(step, 1) << body;
  // fake_rank logs loss 1/step.
  EXPECT_GT(Sample(body, "trainctl_job_loss" + labels).value_or(-1), 0) << body;
  EXPECT_EQ(Sample(body, "trainctl_job_total_steps" + labels), 100000) << body;
  EXPECT_GT(Sample(body, "trainctl_job_progress_ratio" + labels).value_or(-1), 0) << body;
  EXPECT_EQ(Sample(body, "trainctl_job_tokens_per_second" + labels), 1500) << body;
  EXPECT_EQ(Sample(body, "trainctl_job_attempt" + labels), 0) << body;
  EXPECT_EQ(Sample(body, R"(trainctl_job_submissions_total{kind="sft"})"), 1) << body;
  EXPECT_EQ(Sample(body, "trainctl_cluster_free_slots"), 0) << body;
  // The submit's RPC, timed, with every bucket line and its count.
  EXPECT_EQ(Sample(body, R"(trainctl_rpc_duration_seconds_count{code="OK",method="SubmitJob"})"), 1)
      << body;
  EXPECT_EQ(
      Sample(body,
             R"(trainctl_rpc_duration_seconds_bucket{code="OK",method="SubmitJob",le="+Inf"})"),
      1)
      << body;
  EXPECT_TRUE(absl::StrContains(
      body, R"(trainctl_rpc_duration_seconds_sum{code="OK",method="SubmitJob"} )"))
      << body;
  EXPECT_TRUE(absl::StrContains(
      body, R"(trainctl_rpc_duration_seconds_count{code="OK",method="ListNodes"} )"))
      << body;
  // ETA appears once two samples gave a step time.
  ASSERT_TRUE(WaitFor(
      [&] { return Sample(body = Scrape(), "trainctl_job_eta_seconds" + labels).value_or(0) > 0; },
      absl::Seconds(20)))
      << body;

  // Cancelled: its series go; it is counted where it ended.
  ASSERT_TRUE(client_->Cancel(id, "test done").ok());
  body = WaitSeriesGone(id);
  ASSERT_TRUE(WaitFor(
      [&] {
        return Sample(body = Scrape(), R"(trainctl_jobs{kind="sft",state="cancelled"})") == 1;
      },
      absl::Seconds(30)))
      << body << Logs();
  EXPECT_EQ(Sample(body, R"(trainctl_jobs{kind="sft",state="running"})"), 0) << body;
  EXPECT_EQ(Sample(body, "trainctl_job_cancellations_total"), 1) << body;
  EXPECT_EQ(Sample(body, R"(trainctl_jobs_finished_total{kind="sft",state="cancelled"})"), 1)
      << body;
  EXPECT_EQ(Sample(body, R"(trainctl_rpc_duration_seconds_count{code="OK",method="CancelJob"})"), 1)
      << body;
  EXPECT_EQ(testing::PromtoolCheckMetrics(body), "") << body;
}

// The real trainer's metric names reach their gauges: a one-rank SFT on the tiny model, scraped
// while it trains, then cancelled.
TEST_F(CoordinatorMetricsTest, RealTrainersFiguresUnderTheJobsLabels) {
  StartDaemons(TRAINCTL_TRAINER_BIN);
  const std::string id = Submit(WriteSpec("sft", dir_.path() + "/out-sft",
                                          {{"max_steps", 500}, {"save_strategy", "no"}},
                                          {{"resources", {{"nodes", 1}, {"slots_per_node", 1}}},
                                           {"env", {{"TRAINCTL_PEAK_FLOPS", "1e12"}}}}));
  ASSERT_FALSE(id.empty());
  const std::string labels = absl::StrCat(R"({job=")", id, R"(",kind="sft",name="sft",nodes="1"})");
  std::string body;
  ASSERT_TRUE(WaitFor(
      [&] {
        body = Scrape();
        return Sample(body, "trainctl_job_step" + labels).value_or(0) >= 2;
      },
      absl::Seconds(50)))
      << body << Logs();
  EXPECT_EQ(testing::PromtoolCheckMetrics(body), "") << body;
  for (const char* name :
       {"trainctl_job_loss", "trainctl_job_learning_rate", "trainctl_job_grad_norm",
        "trainctl_job_tokens_per_second", "trainctl_job_samples_per_second",
        "trainctl_job_mfu_ratio", "trainctl_job_progress_ratio", "trainctl_job_eta_seconds"}) {
    const std::optional<double> v = Sample(body, name + labels);
    ASSERT_TRUE(v.has_value()) << name << "\n" << body;
    EXPECT_GT(*v, 0) << name << "\n" << body;
  }
  EXPECT_EQ(Sample(body, "trainctl_job_total_steps" + labels), 500) << body;
  EXPECT_LT(Sample(body, "trainctl_job_mfu_ratio" + labels).value_or(2), 1) << body;
  EXPECT_FALSE(absl::StrContains(body, "trainctl_job_reward{")) << "SFT logs no reward\n" << body;

  ASSERT_TRUE(client_->Cancel(id, "test done").ok());
  body = WaitSeriesGone(id);
  EXPECT_EQ(testing::PromtoolCheckMetrics(body), "") << body;
}

}  // namespace
}  // namespace trainctl
