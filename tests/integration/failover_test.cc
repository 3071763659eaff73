// Active/standby coordinators on one PostgreSQL database (issue 28 §2), with real parts: two
// trainctl-coordinator processes, a real PostgreSQL server, a worker given both addresses and a
// two-rank job. The leader is killed mid-run and the standby takes over.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "cli/job_client.h"
#include "gtest/gtest.h"
#include "tests/integration/daemons.h"
#include "tests/testing/postgres_server.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace trainctl {
namespace {

namespace v1 = trainctl::v1;
using testing::Subprocess;
using testing::WaitFor;

// A loopback port free now (bound and released), for a coordinator that listens only later.
int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

class FailoverTest : public ::testing::Test, protected testing::Daemons {
 protected:
  std::string daemon_dir() const override { return dir_.path(); }
  ~FailoverTest() override {
    standby_.reset();
    StopDaemons();
  }

  // A job of two fake ranks that print `lines` lines each, one every 40 ms, each with a metric.
  v1::SubmitJobRequest FakeJob(const std::string& name, int lines, int slots = 2) {
    v1::SubmitJobRequest request;
    v1::JobSpec* spec = request.mutable_spec();
    spec->set_name(name);
    spec->set_kind(v1::JOB_KIND_SFT);
    spec->set_model_name_or_path("tiny");
    spec->set_data_path(dir_.path() + "/data");
    spec->set_output_dir(dir_.path() + "/out-" + name);
    spec->mutable_resources()->set_nodes(1);
    spec->mutable_resources()->set_slots_per_node(slots);
    (*spec->mutable_env())["TRAINCTL_FAKE_LINES"] = absl::StrCat(lines);
    (*spec->mutable_env())["TRAINCTL_FAKE_PERIOD_MS"] = "40";
    request.set_request_id(name);
    return request;
  }

  testing::TempDir dir_;
  std::unique_ptr<Subprocess> standby_;
};

// kill -9 of the leader while a two-rank job runs: the standby leads within a second or two, the
// worker (given both addresses) reconnects to it and its ranks are adopted without a restart, every
// acknowledged submit is there, and no log line or metric the worker had acknowledged is lost.
TEST_F(FailoverTest, TheStandbyTakesOverFromAKilledLeaderAndAdoptsTheRunningJob) {
  auto server = testing::SharedPostgres();
  ASSERT_TRUE(server.ok()) << server.status();
  auto db = (*server)->CreateDatabase();
  ASSERT_TRUE(db.ok()) << db.status();
  const std::string leader = absl::StrCat("127.0.0.1:", FreeLoopbackPort());
  const std::string standby = absl::StrCat("127.0.0.1:", FreeLoopbackPort());
  const std::vector<std::string> ha = {"--db", *db, "--standby", "--leader_lease", "2s"};
  std::vector<std::string> flags = {"--listen", leader};
  flags.insert(flags.end(), ha.begin(), ha.end());
  ASSERT_NO_FATAL_FAILURE(StartCoordinator(flags));
  const std::string standby_ready = dir_.path() + "/standby-ready";
  std::vector<std::string> argv = {
      TRAINCTL_COORDINATOR_BIN, "--listen", standby, "--ready_file", standby_ready,
      "--lease_timeout",        "3s"};
  argv.insert(argv.end(), ha.begin(), ha.end());
  standby_ = std::make_unique<Subprocess>(argv, dir_.path() + "/standby.log");
  StartWorker("node-a", FAKE_RANK_BIN,
              {"--slots", "2", "--output_roots", dir_.path(), "--coordinator",
               absl::StrCat(leader, ",", standby)});
  ASSERT_TRUE(WaitFor([&] { return testing::OneNodeReady(*client_); }, absl::Seconds(20)))
      << Logs();

  auto running = client_->Submit(FakeJob("survivor", 150));
  ASSERT_TRUE(running.ok()) << running.status();
  const std::string id = running->job().id();
  // Jobs that wait (they ask for more slots than the node has): acknowledged, then the failover.
  std::vector<v1::Job> waiting;
  for (int i = 0; i < 3; ++i) {
    auto r = client_->Submit(FakeJob(absl::StrCat("waiting-", i), 1, 4));
    ASSERT_TRUE(r.ok()) << r.status();
    waiting.push_back(r->job());
  }
  ASSERT_TRUE(WaitFor([&] { return Get(id).progress().step() >= 20; }, absl::Seconds(30)))
      << Logs();

  coordinator_->Kill(SIGKILL);
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(coordinator_->Wait(absl::Seconds(10)).ok());
  ASSERT_TRUE(WaitFor([&] { return std::filesystem::exists(standby_ready); }, absl::Seconds(20)))
      << testing::ReadFileOrEmpty(dir_.path() + "/standby.log");
  const absl::Duration takeover = absl::Now() - killed;
  std::cerr << "the standby served " << takeover << " after the leader's kill -9\n";
  EXPECT_LT(takeover, absl::Seconds(10));
  address_ = standby;
  client_ = std::make_unique<cli::JobClient>(address_);

  const v1::Job job = WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60));
  EXPECT_EQ(job.attempt(), 0) << "adopted by the new leader, not restarted";
  std::set<int64_t> steps;
  for (const v1::JobEvent& e : Events(id)) {
    if (e.has_metric()) steps.insert(e.metric().step());
  }
  EXPECT_EQ(steps.size(), 150u);
  std::map<int, std::multiset<std::string>> stored;
  for (const v1::LogLine& l : StoredLogs(id)) stored[l.rank()].insert(l.text());
  for (int rank = 0; rank < 2; ++rank) {
    const std::string file = testing::ReadFileOrEmpty(
        absl::StrCat(dir_.path(), "/work-node-a/tasks/", id, ".0.0/rank-", rank, ".log"));
    int lines = 0, missing = 0;
    for (absl::string_view line : absl::StrSplit(file, '\n', absl::SkipEmpty())) {
      ++lines;
      if (!stored[rank].count(std::string(line))) ++missing;
    }
    EXPECT_GT(lines, 150) << "rank " << rank;
    EXPECT_EQ(missing, 0) << "rank " << rank;
  }
  for (const v1::Job& w : waiting) {
    const v1::Job stored_job = Get(w.id());
    EXPECT_EQ(stored_job.spec().name(), w.spec().name());
    EXPECT_EQ(stored_job.state(), v1::JOB_STATE_PENDING);
  }
}

}  // namespace
}  // namespace trainctl
