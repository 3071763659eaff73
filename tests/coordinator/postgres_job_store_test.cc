// What only the PostgreSQL store promises: its record outlives the store, one coordinator writes to
// a database (and one cut off from it cannot write again once another took over), migrations
// refuse a newer schema, and text PostgreSQL cannot hold is kept readable.
#include "coordinator/postgres_job_store.h"

#include "absl/strings/match.h"
#include "common/status_macros.h"
#include "coordinator/internal/pg.h"
#include "gtest/gtest.h"
#include "tests/coordinator/job_store_test_util.h"
#include "tests/testing/postgres_server.h"
#include "tests/testing/subprocess.h"

namespace trainctl {
namespace {

using testing::Line;
using testing::PendingJob;

class PostgresJobStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = testing::SharedPostgres();
    ASSERT_TRUE(server.ok()) << server.status();
    auto uri = (*server)->CreateDatabase();
    ASSERT_TRUE(uri.ok()) << uri.status();
    uri_ = *uri;
  }
  // A store that does not lead (a standby's).
  absl::StatusOr<std::unique_ptr<PostgresJobStore>> OpenStandby() {
    PostgresJobStore::Options options;
    options.uri = uri_;
    return PostgresJobStore::Open(options);
  }
  // A store that leads (lease `lease`).
  absl::StatusOr<std::unique_ptr<PostgresJobStore>> Open(absl::Duration lease = absl::Minutes(1)) {
    auto store = OpenStandby();
    if (!store.ok()) return store.status();
    RETURN_IF_ERROR((*store)->TryLead("test", lease));
    return store;
  }
  // A connection of the test's own, as an operator's psql would be.
  std::unique_ptr<pg::Conn> Admin() {
    auto conn = pg::Conn::Open(uri_, {});
    EXPECT_TRUE(conn.ok()) << conn.status();
    return conn.ok() ? *std::move(conn) : nullptr;
  }
  std::string uri_;
};

TEST_F(PostgresJobStoreTest, ReopenKeepsJobsEventsAndLogs) {
  std::string id;
  {
    auto store = Open();
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_EQ(*(*store)->SchemaVersion(), PostgresJobStore::LatestSchemaVersion());
    auto created = (*store)->CreateJob(PendingJob("kept"), "req", {});
    ASSERT_TRUE(created.ok()) << created.status();
    id = created->job.id();
    std::vector<LogLine> lines = {Line(id, 0, "hello")};
    ASSERT_TRUE((*store)->AppendLogs(&lines).ok());
  }
  auto store = Open();
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->GetJob(id)->spec().name(), "kept");
  EXPECT_EQ((*store)->ListLogs(id, {})->at(0).text(), "hello");
  EXPECT_FALSE((*store)->CreateJob(PendingJob("again"), "req", {})->created);
}

TEST_F(PostgresJobStoreTest, OneLeaderWritesAndNoneAfterAnotherTookOver) {
  auto first = Open();
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = OpenStandby();
  ASSERT_TRUE(second.ok()) << second.status();
  const absl::Status refused = (*second)->TryLead("second", absl::Minutes(1));
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "another trainctl-coordinator leads"))
      << refused;
  // Refused as transient: what a caller writes is kept for whichever coordinator leads.
  auto standby_write = (*second)->CreateJob(PendingJob("from-standby"), "", {});
  EXPECT_EQ(standby_write.status().code(), absl::StatusCode::kUnavailable);

  // The first is cut off (its sessions end, as in a network partition): the lead is free.
  std::unique_ptr<pg::Conn> admin = Admin();
  ASSERT_NE(admin, nullptr);
  ASSERT_TRUE(admin
                  ->Exec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                         "application_name = 'trainctl-coordinator' AND datname = "
                         "current_database() AND pid <> pg_backend_pid()")
                  .ok());
  // The ended sessions release the lock as their backends exit, a moment later.
  absl::Status took = absl::UnknownError("not tried");
  ASSERT_TRUE(
      testing::WaitFor([&] { return (took = (*second)->TryLead("second", absl::Minutes(1))).ok(); },
                       absl::Seconds(10)))
      << took;
  // The first comes back: it reconnects, finds the lead taken and writes nothing.
  auto stale = (*first)->CreateJob(PendingJob("stale"), "", {});
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kUnavailable) << stale.status();
  EXPECT_EQ((*first)->RenewLead().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE((*first)->leading());
  ASSERT_TRUE((*second)->CreateJob(PendingJob("fresh"), "", {}).ok());
  auto page = (*second)->ListJobs(JobFilter());
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->jobs.size(), 1u);
  EXPECT_EQ(page->jobs[0].spec().name(), "fresh");
}

// A leader that stops renewing (paused, as by SIGSTOP) while its session lives: once the lease has
// run out a standby ends that session and leads, and the old leader, resumed, writes nothing.
TEST_F(PostgresJobStoreTest, AnExpiredLeaseIsTakenOverAndItsHolderFenced) {
  auto paused = Open(absl::Milliseconds(300));
  ASSERT_TRUE(paused.ok()) << paused.status();
  ASSERT_TRUE((*paused)->CreateJob(PendingJob("before"), "", {}).ok());
  auto standby = OpenStandby();
  ASSERT_TRUE(standby.ok()) << standby.status();
  EXPECT_EQ((*standby)->TryLead("standby", absl::Minutes(1)).code(),
            absl::StatusCode::kFailedPrecondition);
  absl::Status took = absl::UnknownError("not tried");
  ASSERT_TRUE(testing::WaitFor(
      [&] { return (took = (*standby)->TryLead("standby", absl::Minutes(1))).ok(); },
      absl::Seconds(10)))
      << took;
  auto resumed = (*paused)->CreateJob(PendingJob("after-pause"), "", {});
  EXPECT_EQ(resumed.status().code(), absl::StatusCode::kUnavailable) << resumed.status();
  EXPECT_FALSE((*paused)->RenewLead().ok());
  auto page = (*standby)->ListJobs(JobFilter());
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->jobs.size(), 1u);
  EXPECT_EQ(page->jobs[0].spec().name(), "before");
  EXPECT_TRUE((*standby)->CreateJob(PendingJob("new-leader"), "", {}).ok());
}

TEST_F(PostgresJobStoreTest, RefusesASchemaNewerThanItKnows) {
  { ASSERT_TRUE(Open().ok()); }
  std::unique_ptr<pg::Conn> admin = Admin();
  ASSERT_NE(admin, nullptr);
  ASSERT_TRUE(admin->Exec("UPDATE trainctl_schema SET version = 99").ok());
  auto store = Open();
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(store.status().message(), "schema version 99")) << store.status();
  EXPECT_TRUE(absl::StrContains(store.status().message(), uri_)) << store.status();
}

TEST_F(PostgresJobStoreTest, ANulByteInALogLineIsKeptAsAReplacementCharacter) {
  auto store = Open();
  ASSERT_TRUE(store.ok()) << store.status();
  auto created = (*store)->CreateJob(PendingJob("nul"), "", {});
  ASSERT_TRUE(created.ok());
  std::vector<LogLine> lines = {Line(created->job.id(), 0, std::string("a\0b", 3))};
  ASSERT_TRUE((*store)->AppendLogs(&lines).ok());
  EXPECT_EQ((*store)->ListLogs(created->job.id(), {})->at(0).text(),
            "a\xEF\xBF\xBD"
            "b");
}

TEST(PostgresUriTest, PasswordsAreRedactedAndSchemesKnown) {
  EXPECT_EQ(pg::RedactUri("postgresql://u:pw@h:5432/db"), "postgresql://u:***@h:5432/db");
  EXPECT_EQ(pg::RedactUri("postgresql://u@h/db"), "postgresql://u@h/db");
  EXPECT_EQ(pg::RedactUri("postgres://h:5432/db"), "postgres://h:5432/db");
  EXPECT_EQ(pg::RedactUri("postgresql://u:p/w@d@h/db"), "postgresql://u:***@h/db");
  EXPECT_EQ(pg::RedactUri("postgresql://h/db?sslmode=require&password=pw&x=1"),
            "postgresql://h/db?sslmode=require&password=***&x=1");
  EXPECT_TRUE(pg::IsPostgresUri("postgres://h/db"));
  EXPECT_TRUE(pg::IsPostgresUri("postgresql://h/db"));
  EXPECT_FALSE(pg::IsPostgresUri("./var/postgresql.db"));
}

}  // namespace
}  // namespace trainctl
