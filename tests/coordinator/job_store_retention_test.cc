// The metric retention every JobStore implements (coordinator/metric_retention.h), run against each
// implementation as the conformance suite is: a job's metric events stay bounded, evenly spread
// over the run, with its first and newest ones and every other event kept.
#include <functional>
#include <memory>
#include <vector>

#include "coordinator/in_memory_job_store.h"
#include "coordinator/metric_retention.h"
#include "coordinator/sqlite_job_store.h"
#include "google/protobuf/util/time_util.h"
#include "gtest/gtest.h"
#include "tests/coordinator/job_store_test_util.h"
#include "tests/testing/temp_dir.h"

namespace trainctl {
namespace {

using google::protobuf::util::TimeUtil;
using testing::PendingJob;

constexpr int kMax = 40;

struct RetentionStoreFactory {
  std::string name;
  std::function<std::unique_ptr<JobStore>(const std::string& dir, int max_metric_events)> make;
};

class JobStoreRetentionTest : public ::testing::TestWithParam<RetentionStoreFactory> {
 protected:
  void SetUp() override {
    store_ = GetParam().make(dir_.path(), kMax);
    ASSERT_NE(store_, nullptr);
  }

  // One metric event at `step`, recorded `step` seconds into the run; every 50th step a checkpoint
  // event too.
  void Log(const std::string& id, int64_t step) {
    auto r = store_->UpdateJob(
        id,
        [step](Job*, std::vector<JobEvent>* events) {
          JobEvent e;
          *e.mutable_time() = TimeUtil::SecondsToTimestamp(1'800'000'000 + step);
          e.mutable_metric()->set_step(step);
          (*e.mutable_metric()->mutable_values())["loss"] = 1.0 / static_cast<double>(step);
          events->push_back(e);
          if (step % 50 == 0) {
            JobEvent c;
            *c.mutable_time() = e.time();
            c.mutable_checkpoint()->set_step(step);
            c.mutable_checkpoint()->set_path("/ckpt");
            events->push_back(c);
          }
          return absl::OkStatus();
        },
        nullptr);
    ASSERT_TRUE(r.ok()) << r.status();
  }

  // The steps of the job's stored metric events, and how many checkpoint events it has.
  std::vector<int64_t> MetricSteps(const std::string& id, int* checkpoints = nullptr) {
    auto events = store_->ListEvents(id, 0, 100000);
    EXPECT_TRUE(events.ok()) << events.status();
    std::vector<int64_t> steps;
    if (checkpoints != nullptr) *checkpoints = 0;
    for (const JobEvent& e : events.value_or(std::vector<JobEvent>{})) {
      if (e.has_metric()) steps.push_back(e.metric().step());
      if (e.has_checkpoint() && checkpoints != nullptr) ++*checkpoints;
    }
    return steps;
  }

  testing::TempDir dir_;
  std::unique_ptr<JobStore> store_;
};

TEST_P(JobStoreRetentionTest, MetricEventsStayBoundedAndEvenlySpreadOverTheRun) {
  const std::string id = store_->CreateJob(PendingJob("long"), "", {})->job.id();
  const std::string other = store_->CreateJob(PendingJob("short"), "", {})->job.id();
  constexpr int kSteps = 1000;
  for (int64_t step = 1; step <= kSteps; ++step) {
    Log(id, step);
    if (step <= 30) Log(other, step);
    if (step % 97 == 0) {
      ASSERT_LE(MetricSteps(id).size(), static_cast<size_t>(kMax)) << step;
    }
  }
  int checkpoints = 0;
  const std::vector<int64_t> steps = MetricSteps(id, &checkpoints);
  EXPECT_EQ(checkpoints, kSteps / 50);  // other events are never thinned
  ASSERT_LE(steps.size(), static_cast<size_t>(kMax));
  ASSERT_GE(steps.size(), static_cast<size_t>(kMax / 4));
  EXPECT_EQ(steps.front(), 1);
  EXPECT_EQ(steps.back(), kSteps);
  EXPECT_TRUE(std::is_sorted(steps.begin(), steps.end()));
  // The newest kMax/4 at full resolution.
  for (int i = 0; i < kMax / 4; ++i) EXPECT_EQ(steps[steps.size() - 1 - i], kSteps - i);
  // The rest evenly spread: no gap much wider than an even spread of kMax/4 points would leave
  // (thinning by position would leave the oldest part ever sparser instead).
  const double even = static_cast<double>(kSteps) / (kMax / 4 - 1);
  for (size_t i = 1; i < steps.size(); ++i) {
    EXPECT_LE(steps[i] - steps[i - 1], 2 * even)
        << "between steps " << steps[i - 1] << " and " << steps[i];
  }
  // A job under the bound keeps everything.
  EXPECT_EQ(MetricSteps(other).size(), 30u);
}

TEST_P(JobStoreRetentionTest, ThinningKeepsWatchersOrderAndSeqs) {
  const std::string id = store_->CreateJob(PendingJob("a"), "", {})->job.id();
  for (int64_t step = 1; step <= 3 * kMax; ++step) Log(id, step);
  auto events = store_->ListEvents(id, 0, 100000);
  ASSERT_TRUE(events.ok());
  for (size_t i = 1; i < events->size(); ++i) EXPECT_LT((*events)[i - 1].seq(), (*events)[i].seq());
  // A watcher resuming after the newest event it saw misses nothing recent.
  const int64_t before_last = (*events)[events->size() - 2].seq();
  Log(id, 3 * kMax + 1);
  auto after = store_->ListEvents(id, before_last, 100);
  ASSERT_TRUE(after.ok());
  ASSERT_EQ(after->size(), 2u);
  EXPECT_EQ(after->back().metric().step(), 3 * kMax + 1);
}

// SqliteJobStore counts a job's metric events once per process and keeps the count in memory: a
// reopened store counts again from the database.
TEST(SqliteJobStoreRetentionTest, AReopenedStoreCountsWhatIsThere) {
  testing::TempDir dir;
  SqliteJobStore::Options options;
  options.path = dir.path() + "/jobs.db";
  options.synchronous_full = false;
  options.max_metric_events = kMax;
  auto log = [](JobStore& store, int64_t step) {
    ASSERT_TRUE(store
                    .UpdateJob(
                        "job-1",
                        [step](Job*, std::vector<JobEvent>* events) {
                          JobEvent e;
                          *e.mutable_time() = TimeUtil::SecondsToTimestamp(step);
                          e.mutable_metric()->set_step(step);
                          events->push_back(e);
                          return absl::OkStatus();
                        },
                        nullptr)
                    .ok());
  };
  auto count = [](JobStore& store) {
    absl::StatusOr<std::vector<JobEvent>> events = store.ListEvents("job-1", 0, 100000);
    EXPECT_TRUE(events.ok()) << events.status();
    size_t n = 0;
    if (events.ok()) {
      for (const JobEvent& e : *events) n += e.has_metric() ? 1 : 0;
    }
    return n;
  };
  {
    auto store = SqliteJobStore::Open(options).value();
    ASSERT_TRUE(store->CreateJob(PendingJob("a"), "", {}).ok());
    for (int64_t step = 1; step <= kMax; ++step) log(*store, step);
    EXPECT_EQ(count(*store), static_cast<size_t>(kMax));
  }
  auto store = SqliteJobStore::Open(options).value();
  log(*store, kMax + 1);  // one over the bound: thinned at once
  EXPECT_LE(count(*store), static_cast<size_t>(kMax / 2 + 1));
  for (int64_t step = kMax + 2; step <= 5 * kMax; ++step) log(*store, step);
  EXPECT_LE(count(*store), static_cast<size_t>(kMax));
}

INSTANTIATE_TEST_SUITE_P(
    AllStores, JobStoreRetentionTest,
    ::testing::Values(
        RetentionStoreFactory{"InMemory",
                              [](const std::string&, int max) -> std::unique_ptr<JobStore> {
                                InMemoryJobStore::Options options;
                                options.max_metric_events = max;
                                return std::make_unique<InMemoryJobStore>(options);
                              }},
        RetentionStoreFactory{"Sqlite",
                              [](const std::string& dir, int max) -> std::unique_ptr<JobStore> {
                                SqliteJobStore::Options options;
                                options.path = dir + "/jobs.db";
                                options.synchronous_full = false;
                                options.max_metric_events = max;
                                return std::move(SqliteJobStore::Open(options).value());
                              }},
        RetentionStoreFactory{
            "Postgres",
            [](const std::string&, int max) { return testing::FreshPostgresStore(max); }}),
    [](const ::testing::TestParamInfo<RetentionStoreFactory>& param_info) {
      return param_info.param.name;
    });

}  // namespace
}  // namespace trainctl
