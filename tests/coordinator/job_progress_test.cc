// JobManager's progress figures: the smoothed step time and ETA that RecordMetric keeps (see
// Progress.step_time in job.proto), and GetMetrics over the stored history.
#include <cmath>

#include "coordinator/in_memory_job_store.h"
#include "coordinator/job_manager.h"
#include "google/protobuf/util/time_util.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/seed.h"

namespace trainctl {
namespace {

using trainctl::v1::JobState;

class JobProgressTest : public ::testing::Test {
 protected:
  std::string Submit() {
    auto r = jobs_.Submit(testing::SeedJobSpec(), "");
    EXPECT_TRUE(r.ok()) << r.status();
    return r->job.id();
  }
  void MoveTo(const std::string& id, std::initializer_list<JobState> path) {
    for (JobState s : path) ASSERT_TRUE(jobs_.Transition(id, s, "test").ok()) << s;
  }
  // A sample at `step` of 100, `seconds` after the previous one (by the coordinator's clock).
  trainctl::v1::Progress Log(const std::string& id, int64_t step, double seconds,
                             double loss = 1.0) {
    clock_.Advance(absl::Seconds(seconds));
    trainctl::v1::MetricSample sample;
    sample.set_step(step);
    (*sample.mutable_values())["loss"] = loss;
    (*sample.mutable_values())["total_steps"] = 100;
    (*sample.mutable_values())["tokens_per_second"] = 1234.5;
    auto r = jobs_.RecordMetric(id, sample);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->progress() : trainctl::v1::Progress();
  }

  InMemoryJobStore store_;
  testing::FakeClock clock_;
  JobManager jobs_{&store_, &clock_};
};

TEST_F(JobProgressTest, StepTimeIsWallTimePerStepWhateverTheLoggingInterval) {
  const std::string id = Submit();
  MoveTo(id, {trainctl::v1::JOB_STATE_SCHEDULED, trainctl::v1::JOB_STATE_RUNNING});
  // The first sample only starts an interval: how long the start took is not a step time.
  trainctl::v1::Progress p = Log(id, 10, 600);
  EXPECT_EQ(p.step_time(), 0);
  EXPECT_EQ(p.eta_seconds(), 0);
  EXPECT_DOUBLE_EQ(p.tokens_per_second(), 1234.5);
  p = Log(id, 20, 5);  // logging_steps 10, half a second a step
  EXPECT_DOUBLE_EQ(p.step_time(), 0.5);
  EXPECT_DOUBLE_EQ(p.eta_seconds(), 0.5 * 80);
  p = Log(id, 30, 5);
  EXPECT_DOUBLE_EQ(p.step_time(), 0.5);
  EXPECT_DOUBLE_EQ(p.eta_seconds(), 35);
  // More figures for the same step (an eval at step 30) do not start a new interval.
  p = Log(id, 30, 3);
  p = Log(id, 40, 2);
  EXPECT_DOUBLE_EQ(p.step_time(), 0.5);
}

TEST_F(JobProgressTest, SmoothingWeighsStepsNotSamples) {
  // Two jobs slow down from 1 s to 2 s a step: one logs every step, one every 10 steps. After the
  // same 10 slow steps both averages must agree.
  const std::string every = Submit();
  const std::string tenth = Submit();
  Log(every, 0, 0);
  for (int s = 1; s <= 10; ++s) Log(every, s, 1);
  for (int s = 11; s <= 20; ++s) Log(every, s, 2);
  const trainctl::v1::Progress p_every = jobs_.Get(every)->progress();
  Log(tenth, 0, 0);
  Log(tenth, 10, 10);
  const trainctl::v1::Progress p_tenth = Log(tenth, 20, 20);
  const double expected = 1.0 + (1 - std::pow(0.95, 10));  // kStepTimeSmoothing = 0.05 a step
  EXPECT_NEAR(p_every.step_time(), expected, 1e-9);
  EXPECT_NEAR(p_tenth.step_time(), expected, 1e-9);
  EXPECT_NEAR(p_tenth.eta_seconds(), expected * 80, 1e-6);
}

TEST_F(JobProgressTest, ARestartsDowntimeAndRepeatedStepsDoNotCount) {
  const std::string id = Submit();
  MoveTo(id, {trainctl::v1::JOB_STATE_SCHEDULED, trainctl::v1::JOB_STATE_RUNNING});
  Log(id, 10, 30);
  Log(id, 20, 10);  // 1 s a step
  // The attempt fails; the next one resumes from a checkpoint at step 20, after 10 minutes.
  MoveTo(id, {trainctl::v1::JOB_STATE_RESTARTING, trainctl::v1::JOB_STATE_SCHEDULED,
              trainctl::v1::JOB_STATE_RUNNING});
  trainctl::v1::Progress p = Log(id, 30, 600);
  EXPECT_DOUBLE_EQ(p.step_time(), 1.0);  // the 600 s were not 60 s a step
  EXPECT_DOUBLE_EQ(p.eta_seconds(), 70);
  EXPECT_EQ(p.rate_attempt(), 1);
  p = Log(id, 40, 10);
  EXPECT_DOUBLE_EQ(p.step_time(), 1.0);
  // Within an attempt, a step that goes back (a stage's own restart, a replay) starts afresh too,
  // and the ETA counts from where the run is, not from the furthest step seen.
  p = Log(id, 35, 5);
  EXPECT_EQ(p.step(), 40);
  EXPECT_DOUBLE_EQ(p.step_time(), 1.0);
  EXPECT_DOUBLE_EQ(p.eta_seconds(), 65);
}

TEST_F(JobProgressTest, TheTrainersTimeStampWinsOverArrival) {
  // Samples a worker held back arrive at once; their own times keep their spacing.
  const std::string id = Submit();
  for (int64_t step : {10, 20, 30}) {
    trainctl::v1::MetricSample sample;
    sample.set_step(step);
    (*sample.mutable_values())["total_steps"] = 100;
    *sample.mutable_time() =
        google::protobuf::util::TimeUtil::SecondsToTimestamp(1'900'000'000 + 2 * step);
    ASSERT_TRUE(jobs_.RecordMetric(id, sample).ok());
  }
  EXPECT_DOUBLE_EQ(jobs_.Get(id)->progress().step_time(), 2.0);
  EXPECT_DOUBLE_EQ(jobs_.Get(id)->progress().eta_seconds(), 140);
}

TEST_F(JobProgressTest, GetMetricsReturnsTheHistoryDownsampled) {
  const std::string id = Submit();
  for (int step = 1; step <= 50; ++step) Log(id, step, 1, 10.0 / step);
  auto all = jobs_.GetMetrics(id, {}, 0);
  ASSERT_TRUE(all.ok()) << all.status();
  std::vector<std::string> names;
  for (const auto& s : all->series()) names.push_back(s.name());
  EXPECT_EQ(names, (std::vector<std::string>{"loss", "tokens_per_second", "total_steps"}));
  EXPECT_EQ(all->series(0).points_size(), 50);
  auto loss = jobs_.GetMetrics(id, {"loss"}, 3);
  ASSERT_TRUE(loss.ok());
  ASSERT_EQ(loss->series_size(), 1);
  ASSERT_EQ(loss->series(0).points_size(), 3);
  EXPECT_EQ(loss->series(0).points(1).step(), 26);
  EXPECT_DOUBLE_EQ(loss->series(0).points(2).value(), 0.2);
  EXPECT_EQ(jobs_.GetMetrics("job-99", {}, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(jobs_.GetMetrics(id, {}, -5).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainctl
