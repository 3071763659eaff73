// A secured cluster as deployed: the real trainctl-coordinator with TLS, client certificates and a
// tokens file, a real trainctl-worker with its certificate and worker token, a job of fake ranks
// (tests/integration/fake_rank.cc) submitted by the real trainctl binary, which takes its CA from
// its config file and its token from ~/.config/trainctl/token (HOME points into the test's
// directory). Certificates are made with the openssl command (tests/testing/test_pki.h).
#include <signal.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "cli/job_client.h"
#include "common/access_tokens.h"
#include "common/credentials.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/daemons.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/test_pki.h"

namespace trainctl {
namespace {

namespace fs = std::filesystem;
namespace v1 = trainctl::v1;
using testing::RunResult;
using testing::Subprocess;
using testing::WaitFor;

constexpr char kAdminToken[] = "admin-7c1f0e";
constexpr char kAliceToken[] = "alice-3b9d22";
constexpr char kWorkerToken[] = "worker-a-51e8";

class SecureClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pki = testing::TestPki::Create(dir_.path());
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_ = std::make_unique<testing::TestPki>(*std::move(pki));
    auto server = pki_->Server();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *server;
    auto worker = pki_->Client("node-a");
    ASSERT_TRUE(worker.ok()) << worker.status();
    worker_cert_ = *worker;
    tokens_ = dir_.Write("tokens", absl::StrCat("admin admin ", Sha256Hex(kAdminToken), "\n",
                                                "alice user ", Sha256Hex(kAliceToken), "\n",
                                                "node-a worker ", Sha256Hex(kWorkerToken), "\n"));
    // trainctl's own files, as a user keeps them.
    home_ = dir_.path() + "/home";
    dir_.Write("home/.config/trainctl/config",
               absl::StrCat("# trainctl client settings\ntls_ca = ", pki_->ca(), "\n"));
    dir_.Write("home/.config/trainctl/token", std::string(kAliceToken) + "\n");
  }
  ~SecureClusterTest() override {
    worker_.reset();
    coordinator_.reset();
  }

  std::vector<std::string> CoordinatorArgs(const std::string& listen = "127.0.0.1:0") {
    return {TRAINCTL_COORDINATOR_BIN,
            "--listen",
            listen,
            "--db",
            dir_.path() + "/trainctl.db",
            "--ready_file",
            dir_.path() + "/ready",
            "--lease_timeout",
            "5s",
            "--db_sync",
            "normal",
            "--tls_cert",
            server_.cert,
            "--tls_key",
            server_.key,
            "--tls_ca",
            pki_->ca(),
            "--tokens_file",
            tokens_};
  }
  std::vector<std::string> WorkerArgs(const std::string& node) {
    return {TRAINCTL_WORKER_BIN,
            "--coordinator",
            address_,
            "--node_name",
            node,
            "--work_dir",
            dir_.path() + "/work",
            "--slots",
            "2",
            "--heartbeat_interval",
            "300ms",
            "--reconnect_max",
            "500ms",
            "--trainer",
            FAKE_RANK_BIN,
            "--nvidia_smi",
            "/nonexistent/nvidia-smi",
            "--output_roots",
            dir_.path(),
            "--tls_ca",
            pki_->ca(),
            "--tls_cert",
            worker_cert_.cert,
            "--tls_key",
            worker_cert_.key,
            "--token_file",
            dir_.Write("worker-token", kWorkerToken)};
  }

  // On `listen`; a restart passes address_ to come back where the worker dials.
  void StartCoordinator(const std::string& listen = "127.0.0.1:0") {
    fs::remove(dir_.path() + "/ready");
    coordinator_ =
        std::make_unique<Subprocess>(CoordinatorArgs(listen), dir_.path() + "/coordinator.log");
    ASSERT_TRUE(WaitFor([&] { return fs::exists(dir_.path() + "/ready"); }, absl::Seconds(30)))
        << Logs();
    address_ =
        std::string(absl::StripAsciiWhitespace(testing::ReadFileOrEmpty(dir_.path() + "/ready")));
    TlsOptions tls;
    tls.ca = pki_->ca();
    cli::Connection admin;
    admin.addresses = {address_};
    admin.credentials = *MakeChannelCredentials(tls);
    admin.token = kAdminToken;
    admin_ = std::make_unique<cli::JobClient>(admin);
  }

  void StartDaemons() {
    StartCoordinator();
    if (HasFatalFailure()) return;
    worker_ = std::make_unique<Subprocess>(WorkerArgs("node-a"), dir_.path() + "/worker.log");
    ASSERT_TRUE(NodeReady()) << Logs();
  }

  // Whether node-a, the one worker, is registered and ready within 20 s.
  bool NodeReady() {
    return WaitFor([&] { return testing::OneNodeReady(*admin_); }, absl::Seconds(20));
  }

  // The real trainctl as the user runs it: HOME holds its config and token.
  RunResult Trainctl(std::vector<std::string> args, std::map<std::string, std::string> env = {}) {
    args.insert(args.begin(), TRAINCTL_CLI_BIN);
    env.emplace("HOME", home_);
    env.emplace("TRAINCTL_COORDINATOR", address_);
    return testing::Run(args, env, absl::Seconds(30));
  }

  // Rewrites the tokens file, sends the coordinator SIGHUP (systemctl reload) and waits for its log
  // line about it; false when none comes within 10 s.
  bool ReloadTokens(const std::string& text) {
    dir_.Write("tokens", text);
    const std::string log = dir_.path() + "/coordinator.log";
    auto count = [&log] {
      const std::string logged = testing::ReadFileOrEmpty(log);
      int seen = 0;
      for (size_t at = logged.find("SIGHUP: "); at != std::string::npos;
           at = logged.find("SIGHUP: ", at + 1)) {
        ++seen;
      }
      return seen;
    };
    const int before = count();
    coordinator_->Kill(SIGHUP);
    return WaitFor([&] { return count() > before; }, absl::Seconds(10));
  }

  std::string Logs() {
    return "--- coordinator\n" + testing::ReadFileOrEmpty(dir_.path() + "/coordinator.log") +
           "--- worker\n" + testing::ReadFileOrEmpty(dir_.path() + "/worker.log");
  }

  testing::TempDir dir_;
  std::unique_ptr<testing::TestPki> pki_;
  testing::CertFiles server_;
  testing::CertFiles worker_cert_;
  std::string tokens_;
  std::string home_;
  std::string address_;
  std::unique_ptr<Subprocess> coordinator_;
  std::unique_ptr<Subprocess> worker_;
  std::unique_ptr<cli::JobClient> admin_;
};

TEST_F(SecureClusterTest, AJobRunsOverMutualTlsWithTokensAndRecordsItsOwner) {
  StartDaemons();
  const nlohmann::json spec = {
      {"kind", "sft"},
      {"name", "secure"},
      {"model_name_or_path", "tiny"},
      {"data_path", dir_.path() + "/data"},
      {"output_dir", dir_.path() + "/out"},
      {"resources", {{"nodes", 1}, {"slots_per_node", 2}}},
      {"env", {{"TRAINCTL_FAKE_LINES", "3"}, {"TRAINCTL_FAKE_PERIOD_MS", "5"}}}};
  RunResult submitted = Trainctl({"submit", dir_.Write("job.json", spec.dump()), "-o", "json"});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.err << Logs();
  auto reply = nlohmann::json::parse(submitted.out, nullptr, false);
  ASSERT_TRUE(reply.is_object() && reply.contains("id")) << submitted.out;
  const std::string id = reply["id"].get<std::string>();

  v1::Job job;
  ASSERT_TRUE(WaitFor(
      [&] {
        auto got = admin_->Get(id);
        if (got.ok()) job = *got;
        return got.ok() && job.state() == v1::JOB_STATE_SUCCEEDED;
      },
      absl::Seconds(30)))
      << v1::JobState_Name(job.state()) << " " << job.message() << "\n"
      << Logs();
  EXPECT_EQ(job.owner(), "alice");
  RunResult described = Trainctl({"describe", id});
  ASSERT_EQ(described.exit_code, 0) << described.err;
  EXPECT_TRUE(absl::StrContains(described.out, "Owner:")) << described.out;
  EXPECT_TRUE(absl::StrContains(described.out, "alice")) << described.out;

  // The environment overrides the token file; an unknown token is refused, saying so.
  RunResult wrong = Trainctl({"ls"}, {{"TRAINCTL_TOKEN", "not-a-token"}});
  EXPECT_EQ(wrong.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(wrong.err, "not one the coordinator's tokens file lists"))
      << wrong.err;
  // A home without a token file: the call carries none.
  fs::remove(home_ + "/.config/trainctl/token");
  RunResult none = Trainctl({"ls"});
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(none.err, "needs a bearer token")) << none.err;
  // Without the CA (no config file), trainctl talks plaintext to a TLS port: it fails, fast.
  RunResult plaintext = Trainctl({"ls"}, {{"HOME", dir_.path()}, {"TRAINCTL_TOKEN", kAliceToken}});
  EXPECT_EQ(plaintext.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(plaintext.err, "cannot reach coordinator")) << plaintext.err;
  EXPECT_LT(plaintext.elapsed, absl::Seconds(10));
}

// `systemctl reload`: SIGHUP reads the tokens file again. A token added works, one revoked is
// refused, and a file that does not parse changes nothing.
TEST_F(SecureClusterTest, SighupReloadsTheTokensFileAndABrokenFileChangesNothing) {
  StartCoordinator();
  constexpr char kBobToken[] = "bob-90ac4d";
  const std::map<std::string, std::string> bob = {{"TRAINCTL_TOKEN", kBobToken}};
  const std::string original = testing::ReadFileOrEmpty(tokens_);
  const std::string log = dir_.path() + "/coordinator.log";

  RunResult refused = Trainctl({"ls"}, bob);
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(refused.err, "not one the coordinator's tokens file lists"))
      << refused.err;

  ASSERT_TRUE(ReloadTokens(absl::StrCat(original, "bob viewer ", Sha256Hex(kBobToken), "\n")))
      << Logs();
  RunResult listed = Trainctl({"ls"}, bob);
  EXPECT_EQ(listed.exit_code, 0) << listed.err << Logs();
  EXPECT_TRUE(absl::StrContains(testing::ReadFileOrEmpty(log), "4 bearer tokens from " + tokens_))
      << Logs();

  // A typo on line 2: the four tokens stay in force, and the log names the file and line.
  ASSERT_TRUE(ReloadTokens(
      absl::StrCat("admin admin ", Sha256Hex(kAdminToken), "\n", "bob viewer not-a-hash\n")))
      << Logs();
  EXPECT_TRUE(absl::StrContains(testing::ReadFileOrEmpty(log), "tokens file not reloaded"))
      << Logs();
  EXPECT_TRUE(absl::StrContains(testing::ReadFileOrEmpty(log), tokens_ + ":2: ")) << Logs();
  RunResult kept = Trainctl({"ls"}, bob);
  EXPECT_EQ(kept.exit_code, 0) << kept.err;
  RunResult alice = Trainctl({"ls"});
  EXPECT_EQ(alice.exit_code, 0) << alice.err;

  // bob revoked.
  ASSERT_TRUE(ReloadTokens(original)) << Logs();
  RunResult revoked = Trainctl({"ls"}, bob);
  EXPECT_EQ(revoked.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(revoked.err, "not one the coordinator's tokens file lists"))
      << revoked.err;
  EXPECT_TRUE(admin_->List(v1::ListJobsRequest()).ok());
}

// Rotating a worker's token with neither daemon restarted for it: the coordinator takes the new
// token on SIGHUP and then drops the old one; the worker reads its --token_file before each
// session. A coordinator restart (every session reconnects) shows the node back on the new token.
TEST_F(SecureClusterTest, AWorkerTokenRotatesWithoutRestartingTheWorker) {
  StartDaemons();
  constexpr char kRotated[] = "worker-a-rotated-77f0";
  const std::string admin_and_alice = absl::StrCat("admin admin ", Sha256Hex(kAdminToken), "\n",
                                                   "alice user ", Sha256Hex(kAliceToken), "\n");
  ASSERT_TRUE(ReloadTokens(absl::StrCat(admin_and_alice, "node-a worker ", Sha256Hex(kWorkerToken),
                                        "\nnode-a worker ", Sha256Hex(kRotated), "\n")))
      << Logs();
  dir_.Write("worker-token", std::string(kRotated) + "\n");
  ASSERT_TRUE(
      ReloadTokens(absl::StrCat(admin_and_alice, "node-a worker ", Sha256Hex(kRotated), "\n")))
      << Logs();
  // The live session was authorized before: it runs on.
  auto nodes = admin_->ListNodes();
  ASSERT_TRUE(nodes.ok() && nodes->nodes_size() == 1) << Logs();
  EXPECT_EQ(nodes->nodes(0).state(), "ready");

  coordinator_.reset();
  StartCoordinator(address_);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_TRUE(NodeReady()) << Logs();
  EXPECT_TRUE(absl::StrContains(testing::ReadFileOrEmpty(dir_.path() + "/worker.log"),
                                "holds a new token: this session uses it"))
      << Logs();
}

// Active/standby coordinators (docs/deploy.md): the worker and trainctl, given both addresses,
// follow the coordinator to its other address with the same CA, certificates and tokens; each
// checks the server certificate against the address it dialled.
TEST_F(SecureClusterTest, WorkerAndCliFollowTheCoordinatorToItsOtherAddressOverMutualTls) {
  ASSERT_NO_FATAL_FAILURE(StartCoordinator());
  const std::string first = address_;
  const std::string second = absl::StrCat("127.0.0.1:", testing::FreeLoopbackPort());
  std::vector<std::string> args = WorkerArgs("node-a");
  args.insert(args.end(), {"--coordinator", first + "," + second});
  worker_ = std::make_unique<Subprocess>(args, dir_.path() + "/worker.log");
  ASSERT_TRUE(NodeReady()) << Logs();
  RunResult before = Trainctl({"ls"}, {{"TRAINCTL_COORDINATOR", second + "," + first}});
  EXPECT_EQ(before.exit_code, 0) << before.err;

  coordinator_.reset();
  StartCoordinator(second);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_TRUE(NodeReady()) << Logs();
  EXPECT_TRUE(WaitFor(
      [&] {
        return absl::StrContains(testing::ReadFileOrEmpty(dir_.path() + "/worker.log"),
                                 "connected to " + second);
      },
      absl::Seconds(5)))
      << Logs();
  RunResult after = Trainctl({"ls"}, {{"TRAINCTL_COORDINATOR", first + "," + second}});
  EXPECT_EQ(after.exit_code, 0) << after.err;
}

TEST_F(SecureClusterTest, DaemonsRefuseCredentialMistakesAtStartUp) {
  // A worker whose certificate is another node's would be refused by the coordinator: it does
  // not start.
  address_ = "127.0.0.1:1";
  RunResult worker = testing::Run(WorkerArgs("node-b"), {}, absl::Seconds(20));
  EXPECT_EQ(worker.exit_code, 2) << worker.out << worker.err;
  EXPECT_TRUE(
      absl::StrContains(worker.out + worker.err, "holds node-a, not the node name 'node-b'"))
      << worker.out << worker.err;
  // A coordinator whose key file is missing names it.
  std::vector<std::string> args = CoordinatorArgs();
  const std::string missing = dir_.path() + "/no-such.key";
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "--tls_key") args[i + 1] = missing;
  }
  RunResult coordinator = testing::Run(args, {}, absl::Seconds(20));
  EXPECT_EQ(coordinator.exit_code, 2);
  EXPECT_TRUE(
      absl::StrContains(coordinator.out + coordinator.err, "--tls_key: cannot read " + missing))
      << coordinator.out << coordinator.err;
}

}  // namespace
}  // namespace trainctl
