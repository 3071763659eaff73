// The control plane on PostgreSQL (`--db postgresql://...`): the real coordinator over a real
// PostgreSQL server (tests/testing/postgres_server.h), killed, restarted, and losing its server.
#include <atomic>
#include <filesystem>
#include <iostream>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/access_tokens.h"
#include "gtest/gtest.h"
#include "tests/integration/control_plane_fixture.h"
#include "tests/testing/postgres_server.h"

namespace trainctl {
namespace {

using testing::PostgresServer;
using testing::RunResult;
using testing::Subprocess;
using testing::WaitFor;

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

  // A second coordinator with the same flags, as a standby (extra_flags_ hold --standby), written
  // to `ready` once it leads; returns once it says whom it waits for, not serving.
  void StartStandby(const std::string& ready, std::unique_ptr<Subprocess>* standby) {
    *standby = std::make_unique<Subprocess>(
        Argv({"--listen", "127.0.0.1:0", "--db", db_, "--ready_file", ready}),
        dir_.path() + "/standby.log");
    ASSERT_TRUE(WaitFor(
        [&] {
          return absl::StrContains(testing::ReadFileOrEmpty(dir_.path() + "/standby.log"),
                                   "another trainctl-coordinator leads this database");
        },
        absl::Seconds(20)));
    ASSERT_FALSE(std::filesystem::exists(ready));
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

  // Four clients submit until the server has been down a while; the server dies mid-flight.
  constexpr int kClients = 4;
  std::mutex mu;
  std::map<std::string, trainctl::v1::Job> acked;  // request id -> the acknowledged job
  std::vector<absl::Status> refusals;
  std::atomic<int> next{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&] {
      cli::JobClient client(address_, absl::Seconds(20));
      while (!stop) {
        const std::string name = absl::StrCat("submit-", next++);
        auto r = client.Submit(Request(name));
        std::lock_guard<std::mutex> lock(mu);
        if (r.ok()) {
          acked[name] = r->job();
        } else {
          refusals.push_back(r.status());
        }
      }
    });
  }
  ASSERT_TRUE(WaitFor([&] { return next.load() >= 40; }, absl::Seconds(20)));
  ASSERT_TRUE((*server)->Kill().ok());
  ASSERT_TRUE(WaitFor(
      [&] {
        std::lock_guard<std::mutex> lock(mu);
        return refusals.size() >= 8;
      },
      absl::Seconds(20)));
  stop = true;
  for (std::thread& t : clients) t.join();
  for (const absl::Status& refused : refusals) {
    EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
    EXPECT_TRUE(absl::StrContains(refused.message(), absl::StrCat("127.0.0.1:", (*server)->port())))
        << refused;
  }

  // The server is back: the coordinator carries on, every acknowledged job is there as
  // acknowledged, and retrying every submit with its request id completes the set once.
  ASSERT_TRUE((*server)->Restart().ok());
  cli::JobClient client(address_, absl::Seconds(20));
  for (const auto& [name, job] : acked) {
    auto stored = client.Get(job.id());
    ASSERT_TRUE(stored.ok()) << job.id() << ": " << stored.status();
    EXPECT_EQ(stored->spec().name(), name);
  }
  const int submitted = next.load();
  for (int i = 0; i < submitted; ++i) {
    const std::string name = absl::StrCat("submit-", i);
    auto r = client.Submit(Request(name));
    ASSERT_TRUE(r.ok()) << r.status();
    if (acked.count(name)) {
      EXPECT_EQ(r->job().id(), acked[name].id());
    }
  }
  trainctl::v1::ListJobsRequest list;
  list.set_page_size(1000);
  auto all = client.List(list);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->jobs_size(), submitted);
}

// A leader paused (SIGSTOP) past its lease: a standby takes over, and the old leader, resumed,
// writes nothing and exits; the new one serves the jobs acknowledged before.
TEST_F(PostgresControlPlaneTest, APausedLeaderIsTakenOverAndExitsWhenResumed) {
  ASSERT_NO_FATAL_FAILURE(UseFreshDatabase());
  extra_flags_ = {"--standby", "--leader_lease", "1s"};
  ASSERT_NO_FATAL_FAILURE(StartCoordinator());
  auto acked = cli::JobClient(address_).Submit(Request("before-pause"));
  ASSERT_TRUE(acked.ok()) << acked.status();
  const std::string ready = dir_.path() + "/standby-ready";
  std::unique_ptr<Subprocess> standby;
  ASSERT_NO_FATAL_FAILURE(StartStandby(ready, &standby));

  coordinator_->Kill(SIGSTOP);
  const absl::Time paused = absl::Now();
  ASSERT_TRUE(WaitFor([&] { return std::filesystem::exists(ready); }, absl::Seconds(20)))
      << testing::ReadFileOrEmpty(dir_.path() + "/standby.log");
  const absl::Duration takeover = absl::Now() - paused;
  EXPECT_LT(takeover, absl::Seconds(10));
  std::cerr << "standby led " << takeover << " after the leader's pause (lease 1s)\n";
  const std::string leader =
      std::string(absl::StripAsciiWhitespace(testing::ReadFileOrEmpty(ready)));

  coordinator_->Kill(SIGCONT);
  absl::StatusOr<int> code = coordinator_->Wait(absl::Seconds(20));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 3) << testing::ReadFileOrEmpty(dir_.path() + "/coordinator.log");
  EXPECT_TRUE(absl::StrContains(testing::ReadFileOrEmpty(dir_.path() + "/coordinator.log"),
                                "lost the lead"));

  cli::JobClient client(leader);
  auto stored = client.Get(acked->job().id());
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->spec().name(), "before-pause");
  ASSERT_TRUE(client.Submit(Request("after-takeover")).ok());
}

// A standby reads its tokens file again when it takes the lead: a token the operator rotated while
// it stood by works with it, the one it replaced does not.
TEST_F(PostgresControlPlaneTest, AStandbyThatTakesOverUsesTheTokensAsTheyAreThen) {
  ASSERT_NO_FATAL_FAILURE(UseFreshDatabase());
  const std::string tokens =
      dir_.Write("tokens", absl::StrCat("ops admin ", Sha256Hex("old"), "\n"));
  extra_flags_ = {"--standby", "--tokens_file", tokens};
  ASSERT_NO_FATAL_FAILURE(StartCoordinator());
  const std::string ready = dir_.path() + "/standby-ready";
  std::unique_ptr<Subprocess> standby;
  ASSERT_NO_FATAL_FAILURE(StartStandby(ready, &standby));
  dir_.Write("tokens", absl::StrCat("ops admin ", Sha256Hex("new"), "\n"));
  coordinator_->Kill(SIGKILL);
  ASSERT_TRUE(WaitFor([&] { return std::filesystem::exists(ready); }, absl::Seconds(20)))
      << testing::ReadFileOrEmpty(dir_.path() + "/standby.log");
  auto with = [&](const std::string& token) {
    cli::Connection c = cli::PlaintextConnection(
        std::string(absl::StripAsciiWhitespace(testing::ReadFileOrEmpty(ready))));
    c.token = token;
    return cli::JobClient(std::move(c)).List(trainctl::v1::ListJobsRequest()).status();
  };
  EXPECT_TRUE(with("new").ok()) << with("new");
  EXPECT_EQ(with("old").code(), absl::StatusCode::kUnauthenticated) << with("old");
}

TEST_F(PostgresControlPlaneTest, ASecondCoordinatorOnTheSameDatabaseIsRefused) {
  ASSERT_NO_FATAL_FAILURE(UseFreshDatabase());
  ASSERT_NO_FATAL_FAILURE(StartCoordinator());
  RunResult second = testing::Run(
      {TRAINCTL_COORDINATOR_BIN, "--listen", "127.0.0.1:0", "--db", db_}, {}, absl::Seconds(20));
  EXPECT_EQ(second.exit_code, 1) << second.err;
  EXPECT_TRUE(absl::StrContains(second.err, "another trainctl-coordinator leads this database"))
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
