// JobStore::WriteBatch on every implementation: what the cluster's event ingester relies on when
// it writes many worker messages at once.
#include <memory>
#include <string>
#include <vector>

#include "coordinator/in_memory_job_store.h"
#include "coordinator/sqlite_job_store.h"
#include "gtest/gtest.h"
#include "tests/coordinator/job_store_test_util.h"
#include "tests/testing/temp_dir.h"

namespace trainctl {
namespace {

using testing::Line;
using testing::PendingJob;

struct BatchStoreFactory {
  std::string name;
  std::function<std::unique_ptr<JobStore>(const std::string& dir)> make;
};

class JobStoreBatchTest : public ::testing::TestWithParam<BatchStoreFactory> {
 protected:
  void SetUp() override {
    store_ = GetParam().make(dir_.path());
    ASSERT_NE(store_, nullptr);
  }

  std::string NewJob(const std::string& name) {
    auto created = store_->CreateJob(PendingJob(name), "", {});
    EXPECT_TRUE(created.ok()) << created.status();
    return created.ok() ? created->job.id() : "";
  }

  // A mutation that sets progress.step and adds one metric event at that step.
  static BatchRecord StepRecord(const std::string& id, int64_t step) {
    BatchRecord r;
    r.job_id = id;
    r.mutate = [step](Job* job, std::vector<JobEvent>* events) -> absl::Status {
      job->mutable_progress()->set_step(step);
      JobEvent e;
      e.mutable_metric()->set_step(step);
      events->push_back(std::move(e));
      return absl::OkStatus();
    };
    return r;
  }

  static BatchRecord Logs(std::vector<LogLine> lines) {
    BatchRecord r;
    r.lines = std::move(lines);
    return r;
  }

  testing::TempDir dir_;
  std::unique_ptr<JobStore> store_;
};

TEST_P(JobStoreBatchTest, WritesEveryRecordInOrder) {
  const std::string a = NewJob("a");
  const std::string b = NewJob("b");
  std::vector<BatchRecord> batch;
  batch.push_back(Logs({Line(a, 0, "a0"), Line(b, 1, "b0")}));
  batch.push_back(StepRecord(a, 1));
  batch.push_back(StepRecord(b, 7));
  batch.push_back(StepRecord(a, 2));
  batch.push_back(Logs({Line(a, 0, "a1")}));
  ASSERT_TRUE(store_->WriteBatch(&batch).ok());
  for (const BatchRecord& r : batch) EXPECT_TRUE(r.status.ok()) << r.status;

  // A job's mutations apply in order, each seeing the one before; the job is as the last left it.
  EXPECT_EQ(batch[1].job.progress().step(), 1);
  EXPECT_EQ(batch[3].job.progress().step(), 2);
  EXPECT_EQ(batch[3].job.id(), a);
  EXPECT_EQ(store_->GetJob(a)->progress().step(), 2);
  EXPECT_EQ(store_->GetJob(b)->progress().step(), 7);
  // Events carry their seq and job, in record order.
  ASSERT_EQ(batch[1].events.size(), 1u);
  ASSERT_EQ(batch[3].events.size(), 1u);
  EXPECT_LT(batch[1].events[0].seq(), batch[3].events[0].seq());
  EXPECT_EQ(batch[3].events[0].job_id(), a);
  auto events = store_->ListEvents(a, 0, 100);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[0].metric().step(), 1);
  EXPECT_EQ((*events)[1].metric().step(), 2);
  // Log lines get their seqs, in order, across records.
  auto lines = store_->ListLogs(a, LogQuery());
  ASSERT_TRUE(lines.ok());
  ASSERT_EQ(lines->size(), 2u);
  EXPECT_EQ((*lines)[0].text(), "a0");
  EXPECT_EQ((*lines)[1].text(), "a1");
  EXPECT_EQ(batch[0].lines[0].seq(), (*lines)[0].seq());
  EXPECT_EQ(store_->ListLogs(b, LogQuery())->size(), 1u);
}

TEST_P(JobStoreBatchTest, ARecordThatFailsOnItsOwnIsSkippedAndTheOthersAreWritten) {
  const std::string a = NewJob("a");
  std::vector<BatchRecord> batch;
  batch.push_back(Logs({Line(a, 0, "kept")}));
  batch.push_back(Logs({Line(a, 0, "not kept"), Line("job-99", 0, "unknown job")}));
  batch.push_back(StepRecord("job-99", 1));
  BatchRecord refused;
  refused.job_id = a;
  refused.mutate = [](Job* job, std::vector<JobEvent>* events) -> absl::Status {
    job->mutable_progress()->set_step(1000);  // must not be kept
    events->emplace_back();
    return absl::InvalidArgumentError("checkpoint.path: required");
  };
  batch.push_back(std::move(refused));
  batch.push_back(StepRecord(a, 3));
  ASSERT_TRUE(store_->WriteBatch(&batch).ok());

  EXPECT_TRUE(batch[0].status.ok());
  EXPECT_EQ(batch[1].status.code(), absl::StatusCode::kNotFound) << batch[1].status;
  EXPECT_EQ(batch[2].status.code(), absl::StatusCode::kNotFound) << batch[2].status;
  EXPECT_EQ(batch[3].status.code(), absl::StatusCode::kInvalidArgument) << batch[3].status;
  EXPECT_TRUE(batch[4].status.ok()) << batch[4].status;

  auto lines = store_->ListLogs(a, LogQuery());
  ASSERT_EQ(lines->size(), 1u);  // nothing of the record naming an unknown job
  EXPECT_EQ((*lines)[0].text(), "kept");
  EXPECT_EQ(store_->GetJob(a)->progress().step(), 3);  // the refused mutation left no trace
  EXPECT_EQ(batch[4].job.progress().step(), 3);
  EXPECT_EQ(store_->ListEvents(a, 0, 100)->size(), 1u);
}

TEST_P(JobStoreBatchTest, AnEmptyBatchWritesNothing) {
  std::vector<BatchRecord> batch;
  EXPECT_TRUE(store_->WriteBatch(&batch).ok());
}

INSTANTIATE_TEST_SUITE_P(
    AllStores, JobStoreBatchTest,
    ::testing::Values(BatchStoreFactory{"InMemory",
                                        [](const std::string&) -> std::unique_ptr<JobStore> {
                                          return std::make_unique<InMemoryJobStore>();
                                        }},
                      BatchStoreFactory{"Sqlite",
                                        [](const std::string& dir) -> std::unique_ptr<JobStore> {
                                          SqliteJobStore::Options options;
                                          options.path = dir + "/jobs.db";
                                          options.synchronous_full = false;
                                          return std::move(SqliteJobStore::Open(options).value());
                                        }},
                      BatchStoreFactory{
                          "Postgres",
                          [](const std::string&) { return testing::FreshPostgresStore(); }}),
    [](const ::testing::TestParamInfo<BatchStoreFactory>& p) { return p.param.name; });

}  // namespace
}  // namespace trainctl
