// JobMetrics fed by a real JobManager (in-memory store, fake clock), and the collect-on-scrape
// job and node series, read back from the registry's rendered text as Prometheus would.
#include "coordinator/job_metrics.h"

#include <cmath>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/build_info.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/in_memory_job_store.h"
#include "gtest/gtest.h"
#include "tests/testing/exposition.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/seed.h"

namespace trainctl {
namespace {

namespace v1 = trainctl::v1;

using testing::SampleValue;

v1::MetricSample TrainerSample(int64_t step, double loss) {
  // What worker/trainer/stages/loop.cc's Log() sends, with GRPO's extra figures.
  v1::MetricSample s;
  s.set_step(step);
  auto& v = *s.mutable_values();
  v["loss"] = loss;
  v["learning_rate"] = 2e-5;
  v["grad_norm"] = 1.5;
  v["epoch"] = 0.5;
  v["total_steps"] = 100;
  v["step_time"] = 2;
  v["tokens_per_second"] = 4096;
  v["samples_per_second"] = 8;
  v["mfu"] = 0.42;
  v["flops_per_second"] = 1e12;  // no gauge of its own
  return s;
}

class JobMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override { jobs_.AddObserver(&metrics_); }

  std::string Submit(const std::string& request_id = "") {
    auto r = jobs_.Submit(testing::SeedJobSpec(), request_id);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->job.id() : "";
  }
  std::string Running() {
    const std::string id = Submit();
    EXPECT_TRUE(jobs_.Place(id, {"node-a"}, "placed").ok());
    EXPECT_TRUE(jobs_.Transition(id, v1::JOB_STATE_RUNNING, "ranks up").ok());
    return id;
  }
  // The label set of the seed job's per-job series.
  static std::string Labels(const std::string& id) {
    return "{job=\"" + id + "\",kind=\"sft\",name=\"sft-qwen2-vl-7b-instruct\",nodes=\"1\"}";
  }

  InMemoryJobStore store_;
  testing::FakeClock clock_;
  JobManager jobs_{&store_, &clock_};
  metrics::Registry registry_;
  JobMetrics metrics_{&registry_};
};

TEST_F(JobMetricsTest, RunningJobHasTheLatestSampleUnderItsLabels) {
  const std::string id = Running();
  ASSERT_TRUE(jobs_.RecordMetric(id, TrainerSample(10, 2.5)).ok());
  ASSERT_TRUE(jobs_.RecordMetric(id, TrainerSample(20, 1.25)).ok());
  const std::string text = registry_.Render();
  const std::string l = Labels(id);
  EXPECT_EQ(SampleValue(text, "trainctl_job_loss" + l), "1.25") << text;
  EXPECT_EQ(SampleValue(text, "trainctl_job_step" + l), "20");
  EXPECT_EQ(SampleValue(text, "trainctl_job_total_steps" + l), "100");
  EXPECT_EQ(SampleValue(text, "trainctl_job_progress_ratio" + l), "0.2");
  EXPECT_EQ(SampleValue(text, "trainctl_job_attempt" + l), "0");
  EXPECT_EQ(SampleValue(text, "trainctl_job_learning_rate" + l), "2e-05");
  EXPECT_EQ(SampleValue(text, "trainctl_job_grad_norm" + l), "1.5");
  EXPECT_EQ(SampleValue(text, "trainctl_job_tokens_per_second" + l), "4096");
  EXPECT_EQ(SampleValue(text, "trainctl_job_samples_per_second" + l), "8");
  EXPECT_EQ(SampleValue(text, "trainctl_job_mfu_ratio" + l), "0.42");
  // ETA: 80 steps left at a step time that is some positive figure (JobManager's wall-clock one
  // once it has two samples, else the trainer's).
  double eta = 0;
  ASSERT_TRUE(absl::SimpleAtod(SampleValue(text, "trainctl_job_eta_seconds" + l), &eta)) << text;
  EXPECT_GE(eta, 0);
  // An SFT job logs no GRPO figures: no series for them.
  EXPECT_FALSE(absl::StrContains(text, "trainctl_job_reward{")) << text;
  EXPECT_FALSE(absl::StrContains(text, "trainctl_job_kl{")) << text;
}

TEST_F(JobMetricsTest, EtaFromTheTrainersStepTimeBeforeTheCoordinatorHasOne) {
  const std::string id = Running();
  ASSERT_TRUE(jobs_.RecordMetric(id, TrainerSample(10, 2.5)).ok());
  // One sample: no wall-clock step time yet; 90 steps x 2 s.
  EXPECT_EQ(SampleValue(registry_.Render(), "trainctl_job_eta_seconds" + Labels(id)), "180");
}

TEST_F(JobMetricsTest, GrpoFiguresHaveTheirOwnSeries) {
  const std::string id = Running();
  v1::MetricSample s;
  s.set_step(3);
  (*s.mutable_values())["reward"] = 0.75;
  (*s.mutable_values())["reward_std"] = 0.25;
  (*s.mutable_values())["kl"] = 0.01;
  (*s.mutable_values())["completions/mean_length"] = 37;
  ASSERT_TRUE(jobs_.RecordMetric(id, s).ok());
  const std::string text = registry_.Render();
  const std::string l = Labels(id);
  EXPECT_EQ(SampleValue(text, "trainctl_job_reward" + l), "0.75") << text;
  EXPECT_EQ(SampleValue(text, "trainctl_job_reward_std" + l), "0.25");
  EXPECT_EQ(SampleValue(text, "trainctl_job_kl" + l), "0.01");
  EXPECT_EQ(SampleValue(text, "trainctl_job_completion_length_tokens" + l), "37");
}

TEST_F(JobMetricsTest, NanLossIsExportedAsNan) {
  const std::string id = Running();
  ASSERT_TRUE(
      jobs_.RecordMetric(id, TrainerSample(5, std::numeric_limits<double>::quiet_NaN())).ok());
  // prometheus-cpp's spelling; Prometheus reads it as NaN.
  EXPECT_EQ(SampleValue(registry_.Render(), "trainctl_job_loss" + Labels(id)), "Nan");
}

TEST_F(JobMetricsTest, SeriesGoWhenTheJobEndsAndLateSamplesDoNotBringThemBack) {
  const std::string id = Running();
  ASSERT_TRUE(jobs_.RecordMetric(id, TrainerSample(10, 2.5)).ok());
  ASSERT_TRUE(jobs_.Transition(id, v1::JOB_STATE_SUCCEEDED, "done").ok());
  std::string text = registry_.Render();
  EXPECT_FALSE(absl::StrContains(text, "job=\"" + id + "\"")) << text;
  EXPECT_EQ(SampleValue(text, "trainctl_jobs_finished_total{kind=\"sft\",state=\"succeeded\"}"),
            "1");
  // A sample the store took before the end, told after it.
  Job ended = *jobs_.Get(id);
  metrics_.OnMetric(ended, TrainerSample(11, 2.4));
  ended.set_state(v1::JOB_STATE_RUNNING);  // even one that claims to be running
  metrics_.OnMetric(ended, TrainerSample(11, 2.4));
  EXPECT_TRUE(metrics_.JobsWithSeries().empty());
}

TEST_F(JobMetricsTest, CountersForSubmitsCancelsRestartsAndEnds) {
  Submit("req-1");
  Submit("req-1");  // the same request again: one job
  const std::string pending = Submit();
  ASSERT_TRUE(jobs_.Cancel(pending, "").ok());
  ASSERT_TRUE(jobs_.Cancel(pending, "").ok());  // again: nothing new to do
  const std::string running = Running();
  ASSERT_TRUE(jobs_.RecordMetric(running, TrainerSample(1, 3)).ok());
  ASSERT_TRUE(jobs_.Transition(running, v1::JOB_STATE_RESTARTING, "rank 1 exited 1").ok());
  ASSERT_TRUE(jobs_.Transition(running, v1::JOB_STATE_SCHEDULED, "placed again").ok());
  // The new attempt shows at once.
  EXPECT_EQ(SampleValue(registry_.Render(), "trainctl_job_attempt" + Labels(running)), "1");
  ASSERT_TRUE(jobs_.Cancel(running, "").ok());  // placed: marked, its workers stop it
  ASSERT_TRUE(jobs_.Cancel(running, "").ok());
  ASSERT_TRUE(jobs_.Transition(running, v1::JOB_STATE_CANCELLED, "ranks stopped").ok());

  const std::string text = registry_.Render();
  EXPECT_EQ(SampleValue(text, "trainctl_job_submissions_total{kind=\"sft\"}"), "3") << text;
  EXPECT_EQ(SampleValue(text, "trainctl_job_cancellations_total"), "2");
  EXPECT_EQ(SampleValue(text, "trainctl_job_restarts_total{kind=\"sft\"}"), "1");
  EXPECT_EQ(SampleValue(text, "trainctl_jobs_finished_total{kind=\"sft\",state=\"cancelled\"}"),
            "2");
  EXPECT_TRUE(metrics_.JobsWithSeries().empty());
}

TEST_F(JobMetricsTest, ScrapeCountsJobsByStateAndKindAndNodes) {
  std::vector<v1::Node> nodes(3);
  nodes[0].set_state("ready");
  nodes[0].set_total_slots(8);
  nodes[0].set_free_slots(2);
  nodes[1].set_state("disconnected");  // within its lease: still live
  nodes[1].set_total_slots(4);
  nodes[1].set_free_slots(4);
  nodes[2].set_state("lost");
  nodes[2].set_total_slots(8);
  nodes[2].set_free_slots(8);
  AddCoordinatorCollectors(&registry_, &store_, [&nodes] { return nodes; });
  Submit();
  Submit();
  Running();

  std::string text = registry_.Render();
  EXPECT_EQ(SampleValue(text, "trainctl_jobs{kind=\"sft\",state=\"pending\"}"), "2") << text;
  EXPECT_EQ(SampleValue(text, "trainctl_jobs{kind=\"sft\",state=\"running\"}"), "1");
  // Every pair has a series, 0 when empty.
  EXPECT_EQ(SampleValue(text, "trainctl_jobs{kind=\"grpo\",state=\"failed\"}"), "0");
  EXPECT_EQ(SampleValue(text, "trainctl_jobs{kind=\"pipeline\",state=\"restarting\"}"), "0");
  EXPECT_EQ(SampleValue(text, "trainctl_nodes{state=\"live\"}"), "2");
  EXPECT_EQ(SampleValue(text, "trainctl_nodes{state=\"lost\"}"), "1");
  EXPECT_EQ(SampleValue(text, "trainctl_cluster_slots"), "12");
  EXPECT_EQ(SampleValue(text, "trainctl_cluster_free_slots"), "6");
  EXPECT_EQ(SampleValue(text, std::string("trainctl_build_info{revision=\"") + BuildRevision() +
                                  "\",version=\"" + BuildVersion() + "\"}"),
            "1");
  EXPECT_FALSE(std::string(BuildVersion()).empty());

  // Collected anew on every scrape.
  nodes.pop_back();
  ASSERT_TRUE(jobs_.Cancel("job-1", "").ok());
  text = registry_.Render();
  EXPECT_EQ(SampleValue(text, "trainctl_jobs{kind=\"sft\",state=\"pending\"}"), "1") << text;
  EXPECT_EQ(SampleValue(text, "trainctl_jobs{kind=\"sft\",state=\"cancelled\"}"), "1");
  EXPECT_EQ(SampleValue(text, "trainctl_nodes{state=\"lost\"}"), "0");
}

}  // namespace
}  // namespace trainctl
