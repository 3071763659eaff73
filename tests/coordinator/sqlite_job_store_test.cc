// What only the SQLite store promises: durability across reopen, migrations, and clear errors for
// files it cannot use.
#include "coordinator/sqlite_job_store.h"

#include <sqlite3.h>

#include <filesystem>
#include <fstream>

#include "coordinator/job_manager.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/coordinator/job_store_test_util.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/temp_dir.h"

namespace trainctl {
namespace {

using google::protobuf::util::MessageDifferencer;
using testing::Line;
using testing::PendingJob;
using testing::StateEvent;

class SqliteJobStoreTest : public ::testing::Test {
 protected:
  // Stores `job` as a coordinator of schema 1 or 2 did: a row of the jobs table, its blob the job
  // without id. Returns its id.
  std::string InsertAsOldSchema(const Job& job) {
    sqlite3* db = nullptr;
    EXPECT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    sqlite3_stmt* st = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db,
                                 "INSERT INTO jobs(state, priority, create_time_us, "
                                 "update_time_us, job) VALUES(?, 0, 0, 0, ?)",
                                 -1, &st, nullptr),
              SQLITE_OK);
    const std::string blob = job.SerializeAsString();
    sqlite3_bind_int64(st, 1, job.state());
    sqlite3_bind_blob(st, 2, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
    EXPECT_EQ(sqlite3_step(st), SQLITE_DONE);
    const int64_t n = sqlite3_last_insert_rowid(db);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return FormatJobId(n);
  }

  absl::StatusOr<std::unique_ptr<SqliteJobStore>> Open(int schema_version = 0) {
    SqliteJobStore::Options options;
    options.path = path_;
    options.schema_version = schema_version;
    return SqliteJobStore::Open(options);
  }
  testing::TempDir dir_;
  std::string path_ = dir_.path() + "/jobs.db";
};

TEST_F(SqliteJobStoreTest, ReopenKeepsJobsEventsAndLogs) {
  Job created;
  {
    auto store = Open();
    ASSERT_TRUE(store.ok()) << store.status();
    auto result = (*store)->CreateJob(
        PendingJob("keep"), "req",
        {StateEvent(trainctl::v1::JOB_STATE_UNSPECIFIED, trainctl::v1::JOB_STATE_PENDING)});
    ASSERT_TRUE(result.ok());
    created = result->job;
    std::vector<LogLine> lines = {Line(created.id(), 0, "hello")};
    ASSERT_TRUE((*store)->AppendLogs(&lines).ok());
  }
  EXPECT_TRUE(std::filesystem::exists(path_ + "-wal") || std::filesystem::file_size(path_) > 0);
  auto store = Open();
  ASSERT_TRUE(store.ok()) << store.status();
  auto job = (*store)->GetJob(created.id());
  ASSERT_TRUE(job.ok());
  EXPECT_TRUE(MessageDifferencer::Equals(*job, created));
  EXPECT_EQ((*store)->ListEvents(created.id(), 0, 10)->size(), 1u);
  EXPECT_EQ((*store)->ListLogs(created.id(), {})->at(0).text(), "hello");
  // The request id survives too: a retried submit after a restart does not duplicate the job.
  auto again = (*store)->CreateJob(PendingJob("other"), "req", {});
  EXPECT_FALSE(again->created);
  EXPECT_EQ(again->job.id(), created.id());
}

TEST_F(SqliteJobStoreTest, ReopenKeepsNodeTopology) {
  {
    auto store = Open();
    ASSERT_TRUE(store.ok()) << store.status();
    trainctl::v1::NodeTopology topology;
    topology.set_node("gpu-1");
    topology.set_peer_memory_module("nvidia_peermem");
    ASSERT_TRUE((*store)->PutNodeTopology(topology).ok());
  }
  auto store = Open();
  ASSERT_TRUE(store.ok()) << store.status();
  auto got = (*store)->GetNodeTopology("gpu-1");
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status();
  EXPECT_EQ((*got)->peer_memory_module(), "nvidia_peermem");
}

TEST_F(SqliteJobStoreTest, UsesWalMode) {
  auto store = Open();
  ASSERT_TRUE(store.ok());
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &st, nullptr);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(st, 0)), "wal");
  sqlite3_finalize(st);
  sqlite3_close(db);
}

TEST_F(SqliteJobStoreTest, MigratesAnOlderSchemaKeepingItsJobs) {
  std::string id;
  {
    auto v1 = Open(/*schema_version=*/1);
    ASSERT_TRUE(v1.ok()) << v1.status();
    EXPECT_EQ(*(*v1)->SchemaVersion(), 1);
    id = InsertAsOldSchema(PendingJob("old"));
    std::vector<LogLine> lines = {Line(id, 0, "x")};
    EXPECT_FALSE((*v1)->AppendLogs(&lines).ok());  // version 1 has no log table
  }
  auto latest = Open();
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*(*latest)->SchemaVersion(), SqliteJobStore::LatestSchemaVersion());
  EXPECT_EQ((*latest)->GetJob(id)->spec().name(), "old");
  std::vector<LogLine> lines = {Line(id, 0, "after migration")};
  EXPECT_TRUE((*latest)->AppendLogs(&lines).ok());
}

// Schema 4 counts jobs by a kind column; jobs stored before get their kind from their blob.
TEST_F(SqliteJobStoreTest, MigrationGivesOlderJobsTheirKind) {
  {
    auto v3 = Open(/*schema_version=*/3);
    ASSERT_TRUE(v3.ok()) << v3.status();
  }
  Job grpo = PendingJob("grpo");
  grpo.mutable_spec()->set_kind(trainctl::v1::JOB_KIND_GRPO);
  InsertAsOldSchema(grpo);
  InsertAsOldSchema(PendingJob("sft"));
  auto store = Open();
  ASSERT_TRUE(store.ok()) << store.status();
  auto counts = (*store)->CountJobs();
  ASSERT_TRUE(counts.ok()) << counts.status();
  ASSERT_EQ(counts->size(), 2u);
  EXPECT_EQ((*counts)[0].kind, trainctl::v1::JOB_KIND_SFT);
  EXPECT_EQ((*counts)[0].count, 1);
  EXPECT_EQ((*counts)[1].kind, trainctl::v1::JOB_KIND_GRPO);
  EXPECT_EQ((*counts)[1].count, 1);
}

// Schema 3 keeps a pipeline's stages in their own table. A pipeline stored before has none; it
// gets them when it is first placed, and they are kept from then on.
TEST_F(SqliteJobStoreTest, MigratedPipelineGetsItsStagesWhenPlaced) {
  std::string id;
  {
    auto v2 = Open(/*schema_version=*/2);
    ASSERT_TRUE(v2.ok()) << v2.status();
    Job old = PendingJob("pipeline");
    trainctl::v1::JobSpec* spec = old.mutable_spec();
    spec->set_kind(trainctl::v1::JOB_KIND_PIPELINE);
    spec->set_model_name_or_path("tiny");
    spec->set_data_path("/data");
    spec->set_output_dir("/out");
    for (auto kind : {trainctl::v1::JOB_KIND_SFT, trainctl::v1::JOB_KIND_EVAL}) {
      spec->add_stages()->set_kind(kind);
    }
    id = InsertAsOldSchema(old);
  }
  auto store = Open();
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(*(*store)->SchemaVersion(), SqliteJobStore::LatestSchemaVersion());
  auto job = (*store)->GetJob(id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec().name(), "pipeline");
  EXPECT_EQ(job->stages_size(), 0);
  EXPECT_EQ(job->current_stage(), 0);

  testing::FakeClock clock;
  JobManager jobs(store->get(), &clock);
  auto placed = jobs.Place(id, {"node-a"}, "placed");
  ASSERT_TRUE(placed.ok()) << placed.status();
  ASSERT_EQ(placed->stages_size(), 2);
  EXPECT_EQ(placed->stages(0).state(), trainctl::v1::STAGE_STATE_RUNNING);
  EXPECT_EQ(placed->stages(1).model_name_or_path(), "/out/sft-0");
  EXPECT_EQ(placed->stages(1).model_from(), "sft-0");
  store->reset();
  auto reopened = Open();
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_TRUE(MessageDifferencer::Equals(*(*reopened)->GetJob(id), *placed));
}

TEST_F(SqliteJobStoreTest, RefusesASchemaNewerThanItKnows) {
  { ASSERT_TRUE(Open().ok()); }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "PRAGMA user_version = 99", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  auto store = Open();
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(store.status().message().find("schema version 99"), absl::string_view::npos)
      << store.status();
  EXPECT_NE(store.status().message().find(path_), absl::string_view::npos);
}

TEST_F(SqliteJobStoreTest, AFileThatIsNotADatabaseIsDataLossNamingIt) {
  std::ofstream(path_) << std::string(4096, 'x');
  auto store = Open();
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
  EXPECT_NE(store.status().message().find(path_), absl::string_view::npos) << store.status();
}

TEST_F(SqliteJobStoreTest, UnopenablePathIsUnavailable) {
  SqliteJobStore::Options options;
  options.path = dir_.path() + "/no/such/dir/jobs.db";
  auto store = SqliteJobStore::Open(options);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable) << store.status();
}
}  // namespace
}  // namespace trainctl
