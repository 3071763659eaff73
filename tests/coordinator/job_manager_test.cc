#include "coordinator/job_manager.h"

#include <atomic>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "coordinator/in_memory_job_store.h"
#include "coordinator/job_notifier.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/fake_clock.h"
#include "tests/testing/seed.h"

namespace trainctl {
namespace {

using trainctl::v1::JobSpec;
using trainctl::v1::JobState;

using testing::SeedJobSpec;

class CountingListener : public JobNotifier::Listener {
 public:
  void OnJobChanged() override { ++calls; }
  std::atomic<int> calls{0};
};

class JobManagerTest : public ::testing::Test {
 protected:
  JobManagerTest() { jobs_.AddObserver(&notifier_); }
  Job Submit(const JobSpec& spec = SeedJobSpec()) {
    auto r = jobs_.Submit(spec, "");
    EXPECT_TRUE(r.ok()) << r.status();
    return r->job;
  }
  void MoveTo(const std::string& id, std::initializer_list<JobState> path) {
    for (JobState s : path) ASSERT_TRUE(jobs_.Transition(id, s, "test").ok()) << s;
  }

  InMemoryJobStore store_;
  testing::FakeClock clock_;
  JobNotifier notifier_;
  JobManager jobs_{&store_, &clock_};
};

TEST_F(JobManagerTest, SubmitStoresAPendingJobWithDefaultsAndResolvedDeepSpeed) {
  auto r = jobs_.Submit(SeedJobSpec(), "");
  ASSERT_TRUE(r.ok()) << r.status();
  const Job& job = r->job;
  EXPECT_TRUE(r->created);
  EXPECT_EQ(job.id(), "job-1");
  EXPECT_EQ(job.state(), trainctl::v1::JOB_STATE_PENDING);
  EXPECT_EQ(job.spec().name(), "sft-qwen2-vl-7b-instruct");
  EXPECT_EQ(job.spec().training().seed(), 42);  // HF default filled in
  EXPECT_EQ(job.spec().resources().nodes(), 1);
  EXPECT_EQ(job.create_time().seconds(), absl::ToUnixSeconds(clock_.Now()));
  const auto resolved = nlohmann::json::parse(job.resolved_deepspeed_config_json());
  EXPECT_EQ(resolved["train_batch_size"], 128);
  EXPECT_EQ(resolved["zero_optimization"]["reduce_bucket_size"], 3584 * 3584);
  EXPECT_EQ(r->warnings.size(), 2u);  // the seed's bf16.loss_scale and bf16.initial_scale_power
  auto events = store_.ListEvents(job.id(), 0, 10);
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].state_change().to(), trainctl::v1::JOB_STATE_PENDING);
}

TEST_F(JobManagerTest, InvalidSpecIsRejectedWithEveryErrorAndNothingStored) {
  JobSpec spec = SeedJobSpec();
  spec.mutable_resources()->set_slots_per_node(0);
  spec.clear_output_dir();
  auto r = jobs_.Submit(spec, "");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("spec.resources.slots_per_node: must be >= 1, got 0"),
            std::string::npos);
  EXPECT_NE(r.status().message().find("spec.output_dir: required"), std::string::npos);
  EXPECT_TRUE(store_.ListJobs({})->jobs.empty());
}

TEST_F(JobManagerTest, ListPagesAreBoundedInBytesAndContinueWhereTheyStop) {
  // 30 jobs of ~250 KB: 7 MB in all, more than fits in one response.
  for (int i = 0; i < 30; ++i) {
    JobSpec spec = SeedJobSpec();
    for (int l = 0; l < 60; ++l)
      (*spec.mutable_labels())[absl::StrCat("l", l)] = std::string(4000, 'x');
    Submit(spec);
  }
  JobFilter filter;
  filter.page_size = 1000;
  std::set<std::string> seen;
  int pages = 0;
  do {
    auto page = jobs_.List(filter);
    ASSERT_TRUE(page.ok()) << page.status();
    size_t bytes = 0;
    for (const Job& job : page->jobs) {
      bytes += job.ByteSizeLong();
      EXPECT_TRUE(seen.insert(job.id()).second) << job.id() << " listed twice";
    }
    EXPECT_LE(bytes, JobManager::kMaxJobPageBytes);
    filter.before_id = page->next_before_id;
    ++pages;
  } while (filter.before_id > 0);
  EXPECT_EQ(seen.size(), 30u);
  EXPECT_GE(pages, 4);
}

TEST_F(JobManagerTest, RetriedSubmitReturnsTheFirstJob) {
  auto first = jobs_.Submit(SeedJobSpec(), "abc");
  auto second = jobs_.Submit(SeedJobSpec(), "abc");
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_FALSE(second->created);
  EXPECT_EQ(first->job.id(), second->job.id());
  EXPECT_EQ(store_.ListJobs({})->jobs.size(), 1u);
}

TEST_F(JobManagerTest, CancelPendingEndsItAtOnce) {
  const Job job = Submit();
  clock_.Advance(absl::Seconds(5));
  auto cancelled = jobs_.Cancel(job.id(), "wrong data");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), trainctl::v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(cancelled->message(), "cancelled: wrong data");
  EXPECT_EQ(cancelled->end_time().seconds(), absl::ToUnixSeconds(clock_.Now()));
  EXPECT_EQ(store_.ListEvents(job.id(), 0, 10)->back().state_change().to(),
            trainctl::v1::JOB_STATE_CANCELLED);
  // Twice is fine and changes nothing.
  auto again = jobs_.Cancel(job.id(), "");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->message(), "cancelled: wrong data");
  EXPECT_EQ(store_.ListEvents(job.id(), 0, 10)->size(), 2u);
}

TEST_F(JobManagerTest, CancelRunningOnlyMarksIt) {
  const Job job = Submit();
  MoveTo(job.id(), {trainctl::v1::JOB_STATE_SCHEDULED, trainctl::v1::JOB_STATE_RUNNING});
  auto r = jobs_.Cancel(job.id(), "");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->state(), trainctl::v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(r->cancel_requested());
  ASSERT_TRUE(jobs_.Transition(job.id(), trainctl::v1::JOB_STATE_CANCELLED, "ranks stopped").ok());
}

TEST_F(JobManagerTest, CancelFinishedJobIsFailedPrecondition) {
  const Job job = Submit();
  MoveTo(job.id(), {trainctl::v1::JOB_STATE_SCHEDULED, trainctl::v1::JOB_STATE_RUNNING,
                    trainctl::v1::JOB_STATE_SUCCEEDED});
  auto r = jobs_.Cancel(job.id(), "");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message(), "job job-1 already succeeded; nothing to cancel");
  EXPECT_EQ(jobs_.Cancel("job-9", "").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(JobManagerTest, TransitionsStampTimesAndCountAttempts) {
  const Job job = Submit();
  clock_.Advance(absl::Seconds(10));
  MoveTo(job.id(), {trainctl::v1::JOB_STATE_SCHEDULED, trainctl::v1::JOB_STATE_RUNNING});
  const int64_t started = absl::ToUnixSeconds(clock_.Now());
  clock_.Advance(absl::Seconds(10));
  MoveTo(job.id(), {trainctl::v1::JOB_STATE_RESTARTING, trainctl::v1::JOB_STATE_SCHEDULED,
                    trainctl::v1::JOB_STATE_RUNNING});
  clock_.Advance(absl::Seconds(10));
  auto done = jobs_.Transition(job.id(), trainctl::v1::JOB_STATE_SUCCEEDED, "done");
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->attempt(), 1);
  EXPECT_EQ(done->start_time().seconds(), started);  // the first start, not the restart
  EXPECT_EQ(done->end_time().seconds(), absl::ToUnixSeconds(clock_.Now()));
  EXPECT_EQ(store_.ListEvents(job.id(), 0, 100)->size(), 7u);
}

TEST_F(JobManagerTest, IllegalTransitionIsRejectedAndRecordsNothing) {
  const Job job = Submit();
  auto r = jobs_.Transition(job.id(), trainctl::v1::JOB_STATE_SUCCEEDED, "");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(jobs_.Get(job.id())->state(), trainctl::v1::JOB_STATE_PENDING);
  EXPECT_EQ(store_.ListEvents(job.id(), 0, 10)->size(), 1u);
}

TEST_F(JobManagerTest, MetricsAndCheckpointsUpdateProgress) {
  const Job job = Submit();
  trainctl::v1::MetricSample sample;
  sample.set_step(10);
  (*sample.mutable_values())["loss"] = 1.25;
  (*sample.mutable_values())["total_steps"] = 300;
  auto r = jobs_.RecordMetric(job.id(), sample);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->progress().step(), 10);
  EXPECT_EQ(r->progress().total_steps(), 300);
  EXPECT_DOUBLE_EQ(r->progress().loss(), 1.25);
  trainctl::v1::Checkpoint ckpt;
  ckpt.set_step(10);
  ckpt.set_path("/ckpt/checkpoint-10");
  auto c = jobs_.RecordCheckpoint(job.id(), ckpt);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->last_checkpoint().path(), "/ckpt/checkpoint-10");
  EXPECT_EQ(store_.ListEvents(job.id(), 0, 10)->back().checkpoint().step(), 10);
  EXPECT_FALSE(jobs_.RecordCheckpoint(job.id(), trainctl::v1::Checkpoint()).ok());
}

TEST_F(JobManagerTest, WatchersAreWokenByEventsAndLogs) {
  const Job job = Submit();
  auto listener = std::make_shared<CountingListener>();
  notifier_.Subscribe(job.id(), listener);
  LogLine line;
  line.set_job_id(job.id());
  line.set_text("hello");
  ASSERT_TRUE(jobs_.AppendLogs({line}).ok());
  EXPECT_EQ(listener->calls.load(), 1);
  ASSERT_TRUE(jobs_.Cancel(job.id(), "").ok());
  EXPECT_EQ(listener->calls.load(), 2);
  ASSERT_TRUE(jobs_.Cancel(job.id(), "").ok());  // no new event, no wake-up
  EXPECT_EQ(listener->calls.load(), 2);
  listener.reset();
  EXPECT_EQ(notifier_.ListenerCount(job.id()), 0);
}

TEST_F(JobManagerTest, ListRejectsBadPageSizes) {
  JobFilter filter;
  filter.page_size = 0;
  EXPECT_EQ(jobs_.List(filter).status().code(), absl::StatusCode::kInvalidArgument);
  filter.page_size = 1001;
  EXPECT_EQ(jobs_.List(filter).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainctl
