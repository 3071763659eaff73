// The control plane on PostgreSQL (`--db postgresql://...`): the real coordinator over a real
// PostgreSQL server (tests/testing/postgres_server.h), killed, restarted, and losing its server.
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/control_plane_fixture.h"
#include "tests/testing/postgres_server.h"

namespace trainctl {
namespace {

using testing::PostgresServer;
using testing::RunResult;

class PostgresControlPlaneTest : public testing::ControlPlaneTest {
 protected:
  // The coordinator's database: a fresh one on the process's server, or on `server`.
  void UseFreshDatabase(PostgresServer* server = nullptr) {
    if (server == nullptr) {
      absl::StatusOr<PostgresServer*> shared = testing::SharedPostgres();
      ASSERT_TRUE(shared.ok()) << shared.status();
      server = *shared;
    }
    absl::StatusOr<std::string> uri = server->CreateDatabase();
    ASSERT_TRUE(uri.ok()) << uri.status();
    db_ = *uri;
  }

  trainctl::v1::SubmitJobRequest Request(const std::string& name) {
    trainctl::v1::SubmitJobRequest request;
    auto* spec = request.mutable_spec();
    spec->set_name(name);
    spec->set_kind(trainctl::v1::JOB_KIND_SFT);
    spec->set_model_name_or_path("Qwen/Qwen2-VL-7B-Instruct");
    spec->set_data_path("/data/d");
    spec->set_output_dir("/out/" + name);
    request.set_request_id(name);
    return request;
  }
};

TEST_F(PostgresControlPlaneTest, KillNineDuringConcurrentSubmitsLosesNoAcknowledgedJob) {
  ASSERT_NO_FATAL_FAILURE(UseFreshDatabase());
  ASSERT_NO_FATAL_FAILURE(StartCoordinator());
  KillNineDuringConcurrentSubmitsLosesNoAcknowledgedJob();
}

// The database server dies under a coordinator: submits fail UNAVAILABLE naming the server, no
// acknowledged job is lost, and once the server is back the coordinator carries on by itself.
TEST_F(PostgresControlPlaneTest, LosingTheServerFailsSubmitsUnavailableAndLosesNothing) {
  auto server = PostgresServer::Start();  // its own: this test kills it
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_NO_FATAL_FAILURE(UseFreshDatabase(server->get()));
  ASSERT_NO_FATAL_FAILURE(StartCoordinator());
  cli::JobClient client(address_, absl::Seconds(20));
  std::vector<trainctl::v1::Job> acked;
  for (int i = 0; i < 5; ++i) {
    auto r = client.Submit(Request(absl::StrCat("before-", i)));
    ASSERT_TRUE(r.ok()) << r.status();
    acked.push_back(r->job());
  }

  ASSERT_TRUE((*server)->Kill().ok());
  auto refused = client.Submit(Request("while-down"));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  EXPECT_TRUE(
      absl::StrContains(refused.status().message(), absl::StrCat("127.0.0.1:", (*server)->port())))
      << refused.status();

  ASSERT_TRUE((*server)->Restart().ok());
  // The same request id again: stored once, whatever the failed attempt left.
  auto again = client.Submit(Request("while-down"));
  ASSERT_TRUE(again.ok()) << again.status();
  acked.push_back(again->job());
  for (const trainctl::v1::Job& job : acked) {
    auto stored = client.Get(job.id());
    ASSERT_TRUE(stored.ok()) << job.id() << ": " << stored.status();
    EXPECT_EQ(stored->spec().name(), job.spec().name());
  }
  trainctl::v1::ListJobsRequest list;
  auto all = client.List(list);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->jobs_size(), 6);
}

TEST_F(PostgresControlPlaneTest, ASecondCoordinatorOnTheSameDatabaseIsRefused) {
  ASSERT_NO_FATAL_FAILURE(UseFreshDatabase());
  ASSERT_NO_FATAL_FAILURE(StartCoordinator());
  RunResult second = testing::Run(
      {TRAINCTL_COORDINATOR_BIN, "--listen", "127.0.0.1:0", "--db", db_}, {}, absl::Seconds(20));
  EXPECT_EQ(second.exit_code, 1) << second.err;
  EXPECT_TRUE(absl::StrContains(second.err, "another trainctl-coordinator writes to this database"))
      << second.err;
  // The lock is the session's: it goes with a killed holder, and the next coordinator starts.
  coordinator_->Kill(SIGKILL);
  ASSERT_TRUE(coordinator_->Wait(absl::Seconds(10)).ok());
  ASSERT_NO_FATAL_FAILURE(StartCoordinator());
  EXPECT_EQ(Trainctl({"ls"}).exit_code, 0);
}

// A --db with a scheme the coordinator does not know is an error, not a SQLite file at a path
// that begins "mysql:"; a PostgreSQL server that is not there is named.
TEST_F(PostgresControlPlaneTest, UnknownSchemesAndUnreachableServersAreRefusedAtStart) {
  RunResult mysql = testing::Run({TRAINCTL_COORDINATOR_BIN, "--db", "mysql://db:3306/jobs"}, {},
                                 absl::Seconds(20), dir_.path());
  EXPECT_EQ(mysql.exit_code, 1) << mysql.err;
  EXPECT_TRUE(absl::StrContains(mysql.err, "--db: unknown scheme 'mysql://'")) << mysql.err;
  EXPECT_FALSE(std::filesystem::exists(dir_.path() + "/mysql:"));

  RunResult down =
      testing::Run({TRAINCTL_COORDINATOR_BIN, "--db", "postgresql://trainctl:secret@127.0.0.1:1/x"},
                   {}, absl::Seconds(20), dir_.path());
  EXPECT_EQ(down.exit_code, 1) << down.err;
  EXPECT_TRUE(
      absl::StrContains(down.err, "postgresql://trainctl:***@127.0.0.1:1/x: cannot connect"))
      << down.err;
  EXPECT_FALSE(absl::StrContains(down.err, "secret")) << down.err;
}

}  // namespace
}  // namespace trainctl
