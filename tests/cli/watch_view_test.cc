// What watch shows of a job as its events arrive: the live line's figures and the summary.
#include "cli/watch_view.h"

#include "google/protobuf/util/time_util.h"
#include "gtest/gtest.h"

namespace trainctl::cli {
namespace {

using google::protobuf::util::TimeUtil;
using trainctl::v1::JobEvent;

constexpr int64_t kT0 = 1'800'000'000;
const absl::Time kStart = absl::FromUnixSeconds(kT0);

JobEvent State(trainctl::v1::JobState to, int64_t at, const std::string& reason = "") {
  JobEvent e;
  *e.mutable_time() = TimeUtil::SecondsToTimestamp(kT0 + at);
  e.mutable_state_change()->set_to(to);
  e.mutable_state_change()->set_reason(reason);
  return e;
}

JobEvent Metric(int64_t step, double loss, int64_t at) {
  JobEvent e;
  *e.mutable_time() = TimeUtil::SecondsToTimestamp(kT0 + at);
  e.mutable_metric()->set_step(step);
  (*e.mutable_metric()->mutable_values())["loss"] = loss;
  (*e.mutable_metric()->mutable_values())["total_steps"] = 300;
  (*e.mutable_metric()->mutable_values())["tokens_per_second"] = 2000;
  return e;
}

trainctl::v1::Job Pending() {
  trainctl::v1::Job job;
  job.set_id("job-3");
  job.set_state(trainctl::v1::JOB_STATE_PENDING);
  return job;
}

TEST(WatchViewTest, FollowsTheJobAndCountsTheEtaDown) {
  WatchView view(Pending());
  EXPECT_TRUE(view.OnEvent(State(trainctl::v1::JOB_STATE_RUNNING, 10)));
  EXPECT_FALSE(view.OnEvent(Metric(100, 2.0, 60)));
  EXPECT_FALSE(view.OnEvent(Metric(120, 1.5, 70)));
  trainctl::v1::Job fresh = Pending();
  fresh.mutable_progress()->set_eta_seconds(90);
  fresh.mutable_progress()->set_step_time(0.5);
  *fresh.mutable_progress()->mutable_rate_time() = TimeUtil::SecondsToTimestamp(kT0 + 70);
  view.OnJob(fresh, kStart + absl::Seconds(71));
  ProgressView v = view.View(kStart + absl::Seconds(81));
  EXPECT_EQ(v.job_id, "job-3");
  EXPECT_EQ(v.state, "running");
  EXPECT_EQ(v.step, 120);
  EXPECT_EQ(v.total_steps, 300);
  EXPECT_TRUE(v.has_loss);
  EXPECT_DOUBLE_EQ(v.loss, 1.5);
  EXPECT_DOUBLE_EQ(v.tokens_per_second, 2000);
  EXPECT_DOUBLE_EQ(v.eta_seconds, 80);  // 90 s as of 71 s, ten seconds later
  EXPECT_DOUBLE_EQ(v.elapsed_seconds, 71);
  // The same estimate fetched again does not restart the countdown.
  view.OnJob(fresh, kStart + absl::Seconds(85));
  EXPECT_DOUBLE_EQ(view.View(kStart + absl::Seconds(91)).eta_seconds, 70);
  EXPECT_DOUBLE_EQ(view.View(kStart + absl::Seconds(500)).eta_seconds, 0);

  EXPECT_TRUE(view.OnEvent(State(trainctl::v1::JOB_STATE_SUCCEEDED, 250, "every rank exited 0")));
  EXPECT_EQ(view.state(), trainctl::v1::JOB_STATE_SUCCEEDED);
  v = view.View(kStart + absl::Seconds(900));
  EXPECT_LT(v.eta_seconds, 0);  // no ETA once it is over
  EXPECT_DOUBLE_EQ(v.elapsed_seconds, 240);
  EXPECT_EQ(view.Summary(kStart + absl::Seconds(900)),
            "job-3 succeeded after 4m00s: step 120/300, loss 2 -> 1.5, 0.5 s/step");
}

TEST(WatchViewTest, AFailedJobSaysWhyAndAJobThatNeverRanSaysLittle) {
  WatchView failed(Pending());
  failed.OnEvent(State(trainctl::v1::JOB_STATE_RUNNING, 0));
  failed.OnEvent(Metric(5, 3.0, 5));
  failed.OnEvent(State(trainctl::v1::JOB_STATE_FAILED, 65, "rank 1 exited 1"));
  EXPECT_EQ(failed.Summary(kStart + absl::Seconds(100)),
            "job-3 failed after 1m05s: step 5/300, loss 3 (rank 1 exited 1)");

  WatchView cancelled(Pending());
  cancelled.OnEvent(State(trainctl::v1::JOB_STATE_CANCELLED, 3, "cancelled by user"));
  EXPECT_EQ(cancelled.Summary(kStart), "job-3 cancelled (cancelled by user)");
  EXPECT_EQ(cancelled.View(kStart).elapsed_seconds, -1);
}

}  // namespace
}  // namespace trainctl::cli
