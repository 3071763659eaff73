// JobManager::RestartWithRemedy over both stores: the remedy is kept with the job (SQLite across a
// reopen), recorded as an event after the restart's state change, and counted in
// trainctl_job_remedies_total by cause.
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "common/metrics.h"
#include "coordinator/in_memory_job_store.h"
#include "coordinator/job_manager.h"
#include "coordinator/job_metrics.h"
#include "coordinator/sqlite_job_store.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/seed.h"
#include "tests/testing/temp_dir.h"

namespace trainctl {
namespace {

namespace v1 = trainctl::v1;

v1::Remedy OomRemedy() {
  v1::Remedy r;
  r.set_attempt(1);
  r.set_cause("oom");
  r.set_rank(3);
  r.set_change("gradient_checkpointing on");
  r.set_detail("DefaultCPUAllocator: can't allocate memory");
  (*r.mutable_settings())["gradient_checkpointing"] = "true";
  return r;
}

// Submits the seed's job with remedies and runs it into its first failure's restart.
std::string RunIntoRemedy(JobManager& jobs) {
  v1::JobSpec spec = testing::SeedJobSpec();
  spec.set_max_restarts(2);
  spec.mutable_remedies()->set_oom(true);
  auto submitted = jobs.Submit(spec, "");
  EXPECT_TRUE(submitted.ok()) << submitted.status();
  const std::string id = submitted->job.id();
  EXPECT_TRUE(jobs.Place(id, {"node-a"}, "placed").ok());
  EXPECT_TRUE(jobs.Transition(id, v1::JOB_STATE_RUNNING, "running").ok());
  auto restarted = jobs.RestartWithRemedy(id, OomRemedy(), "attempt 0 failed; with a remedy");
  EXPECT_TRUE(restarted.ok()) << restarted.status();
  EXPECT_EQ(restarted->state(), v1::JOB_STATE_RESTARTING);
  return id;
}

void ExpectRemedyKept(JobManager& jobs, const std::string& id) {
  auto job = jobs.Get(id);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->remedies_size(), 1);
  EXPECT_EQ(job->remedies(0).change(), "gradient_checkpointing on");
  EXPECT_EQ(job->remedies(0).settings().at("gradient_checkpointing"), "true");
  auto events = jobs.store()->ListEvents(id, 0, 100);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_GE(events->size(), 2u);
  const v1::JobEvent& last = events->back();
  ASSERT_TRUE(last.has_remedy());
  EXPECT_EQ(last.remedy().rank(), 3);
  const v1::JobEvent& before = (*events)[events->size() - 2];
  ASSERT_TRUE(before.has_state_change());
  EXPECT_EQ(before.state_change().to(), v1::JOB_STATE_RESTARTING);
}

TEST(JobRemediesTest, InMemoryStoreKeepsTheRemedyAndTheMetricCountsIt) {
  InMemoryJobStore store;
  testing::FakeClock clock;
  JobManager jobs(&store, &clock);
  metrics::Registry registry;
  JobMetrics job_metrics(&registry);
  jobs.AddObserver(&job_metrics);
  const std::string id = RunIntoRemedy(jobs);
  ExpectRemedyKept(jobs, id);
  EXPECT_TRUE(absl::StrContains(registry.Render(), "trainctl_job_remedies_total{cause=\"oom\"} 1"))
      << registry.Render();
  // The next attempt is placed with attempt 1, the remedy's.
  auto placed = jobs.Place(id, {"node-a"}, "placed again");
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->attempt(), 1);
}

TEST(JobRemediesTest, SqliteStoreKeepsTheRemedyAcrossAReopen) {
  testing::TempDir dir;
  SqliteJobStore::Options options;
  options.path = dir.path() + "/jobs.db";
  std::string id;
  {
    auto store = SqliteJobStore::Open(options);
    ASSERT_TRUE(store.ok()) << store.status();
    testing::FakeClock clock;
    JobManager jobs(store->get(), &clock);
    id = RunIntoRemedy(jobs);
  }
  auto store = SqliteJobStore::Open(options);
  ASSERT_TRUE(store.ok()) << store.status();
  testing::FakeClock clock;
  JobManager jobs(store->get(), &clock);
  ExpectRemedyKept(jobs, id);
}

}  // namespace
}  // namespace trainctl
