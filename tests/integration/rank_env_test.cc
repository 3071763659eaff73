// Issue 24, item 2, with the real binaries: a job's `env` cannot run code in its ranks, and ranks
// cannot read the worker's credentials. The real trainctl-coordinator refuses an LD_PRELOAD spec
// at submit (a `user` token's), naming the variable; a real trainctl-worker refuses it again when a
// coordinator lets it through; with --rank_user the ranks run as that user and cannot read the
// worker's 0600 token file, but can write their output directory.
#include <grpcpp/security/credentials.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cli/connection.h"
#include "cli/job_client.h"
#include "common/access_tokens.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/daemons.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace trainctl {
namespace {

namespace v1 = trainctl::v1;
using testing::RunResult;
using testing::WaitFor;

constexpr char kAliceToken[] = "alice-7f3c10";
constexpr char kWorkerToken[] = "worker-a-92d4e1";

class RankEnvTest : public ::testing::Test, protected testing::Daemons {
 protected:
  RankEnvTest() {
    // Ranks that run as another user must reach their program and output directory.
    chmod(dir_.path().c_str(), 0755);
    tokens_ = dir_.Write("tokens", absl::StrCat("alice user ", Sha256Hex(kAliceToken), "\n",
                                                "node-a worker ", Sha256Hex(kWorkerToken), "\n"));
    worker_token_ = dir_.Write("worker-token", std::string(kWorkerToken) + "\n");
    chmod(worker_token_.c_str(), 0600);
  }
  ~RankEnvTest() override { StopDaemons(); }

  std::string daemon_dir() const override { return dir_.path(); }

  void StartCoordinatorWithTokens(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> flags = {"--tokens_file", tokens_};
    flags.insert(flags.end(), extra.begin(), extra.end());
    StartCoordinator(flags);
    if (HasFatalFailure()) return;
    // The daemons' own client, as alice: the coordinator wants a token.
    cli::Connection connection;
    connection.addresses = {address_};
    connection.token = kAliceToken;
    connection.credentials = grpc::InsecureChannelCredentials();
    client_ = std::make_unique<cli::JobClient>(connection);
  }

  // node-a (Daemons::StartWorker), with its token file; its ranks run `trainer`.
  void StartWorker(const std::string& trainer, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> flags = {"--output_roots", dir_.path(), "--token_file", worker_token_};
    flags.insert(flags.end(), extra.begin(), extra.end());
    Daemons::StartWorker("node-a", trainer, flags);
  }

  std::string Script(const std::string& name, const std::string& body) {
    const std::string path = dir_.Write(name, "#!/bin/sh\n" + body);
    chmod(path.c_str(), 0755);
    return path;
  }

  std::string SpecFile(const std::string& name, const nlohmann::json& env) {
    const nlohmann::json spec = {{"kind", "sft"},
                                 {"name", name},
                                 {"model_name_or_path", "tiny"},
                                 {"data_path", dir_.path() + "/data"},
                                 {"output_dir", OutputDir(name)},
                                 {"resources", {{"nodes", 1}, {"slots_per_node", 1}}},
                                 {"env", env}};
    return dir_.Write(name + ".json", spec.dump());
  }
  std::string OutputDir(const std::string& name) { return dir_.path() + "/out-" + name; }

  // trainctl as alice (a `user` token).
  RunResult Trainctl(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {TRAINCTL_CLI_BIN};
    argv.insert(argv.end(), args.begin(), args.end());
    return testing::Run(argv, {{"TRAINCTL_COORDINATOR", address_},
                               {"TRAINCTL_TOKEN", kAliceToken},
                               {"HOME", dir_.path()}});
  }

  std::string Submit(const std::string& spec) {
    RunResult r = Trainctl({"submit", spec, "-o", "json"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    return j.is_object() && j.contains("id") ? j["id"].get<std::string>() : "";
  }

  testing::TempDir dir_;
  std::string tokens_;
  std::string worker_token_;
};

TEST_F(RankEnvTest, SubmitAndValidateRefuseLdPreloadByName) {
  ASSERT_NO_FATAL_FAILURE(StartCoordinatorWithTokens());
  const std::string spec =
      SpecFile("evil", {{"LD_PRELOAD", dir_.path() + "/evil.so"}, {"NCCL_DEBUG", "INFO"}});

  RunResult submitted = Trainctl({"submit", spec});
  EXPECT_NE(submitted.exit_code, 0) << submitted.out;
  EXPECT_TRUE(absl::StrContains(submitted.err,
                                "spec.env.LD_PRELOAD: not in the ranks' environment allowlist"))
      << submitted.err;
  EXPECT_FALSE(absl::StrContains(submitted.err, "NCCL_DEBUG")) << submitted.err;
  RunResult listed = Trainctl({"ls", "-o", "json"});
  EXPECT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_FALSE(absl::StrContains(listed.out, "evil")) << listed.out;

  RunResult validated = Trainctl({"validate", spec});
  EXPECT_NE(validated.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(validated.err, "spec.env.LD_PRELOAD: not in the ranks'"))
      << validated.err;

  // Inside an allowed prefix, a variable that loads a library is refused too.
  RunResult injected = Trainctl({"submit", SpecFile("inject", {{"CUDA_INJECTION64_PATH", "/x"}})});
  EXPECT_NE(injected.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(injected.err,
                                "spec.env.CUDA_INJECTION64_PATH: may make the ranks load code"))
      << injected.err;
}

// A coordinator that lets LD_PRELOAD through (an older one, or one whose operator allowed it):
// the worker, which does not, fails the task naming the variable, and no rank runs.
TEST_F(RankEnvTest, TheWorkerRefusesWhatItsCoordinatorLetThrough) {
  ASSERT_NO_FATAL_FAILURE(StartCoordinatorWithTokens({"--rank_env_allow", "LD_PRELOAD"}));
  const std::string ran = dir_.path() + "/ran";
  StartWorker(Script("rank.sh", "touch " + ran + "\n"));
  const std::string id = Submit(SpecFile("evil", {{"LD_PRELOAD", dir_.path() + "/evil.so"}}));
  ASSERT_FALSE(id.empty());
  const v1::Job job = WaitState(id, v1::JOB_STATE_FAILED, absl::Seconds(60));
  EXPECT_TRUE(absl::StrContains(job.message(),
                                "refused by this worker: spec.env.LD_PRELOAD: not "
                                "in the ranks' environment allowlist"))
      << job.message();
  EXPECT_FALSE(std::filesystem::exists(ran));
}

// --rank_user nobody: the rank runs as nobody, cannot read the worker's 0600 token file, and
// writes its output directory, which the worker created for it.
TEST_F(RankEnvTest, RanksRunAsTheRankUserAndCannotReadTheWorkersToken) {
  if (geteuid() != 0) GTEST_SKIP() << "running ranks as another user needs root";
  ASSERT_NO_FATAL_FAILURE(StartCoordinatorWithTokens());
  StartWorker(Script("rank.sh", absl::StrCat("echo \"uid=$(id -u)\"\n", "if cat ", worker_token_,
                                             " >/dev/null 2>&1; then echo token-read; else echo "
                                             "token-unreadable; fi\n",
                                             "echo \"token-env=${TRAINCTL_TOKEN-unset}\"\n",
                                             "touch \"$TRAINCTL_TEST_OUT/written\"\n")),
              {"--rank_user", "nobody"});
  const std::string out = OutputDir("as-nobody");
  const std::string id = Submit(SpecFile("as-nobody", {{"TRAINCTL_TEST_OUT", out}}));
  ASSERT_FALSE(id.empty());
  WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60));
  const passwd* nobody = getpwnam("nobody");
  ASSERT_NE(nobody, nullptr);
  std::vector<std::string> lines;
  for (const v1::LogLine& line : StoredLogs(id)) lines.push_back(line.text());
  EXPECT_EQ(lines, (std::vector<std::string>{absl::StrCat("uid=", nobody->pw_uid),
                                             "token-unreadable", "token-env=unset"}))
      << Logs();
  struct stat st {};
  ASSERT_EQ(stat((out + "/written").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, nobody->pw_uid);
}

// A worker that cannot switch users says so at start-up, naming what it needs, and does not start.
TEST_F(RankEnvTest, AWorkerWithoutThePrivilegeRefusesToStartWithARankUser) {
  if (geteuid() != 0 || !std::filesystem::exists("/usr/bin/setpriv")) {
    GTEST_SKIP() << "needs root and setpriv to start the worker as an unprivileged user";
  }
  RunResult r =
      testing::Run({"/usr/bin/setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                    TRAINCTL_WORKER_BIN, "--rank_user", "root", "--coordinator", "127.0.0.1:1",
                    "--nvidia_smi", "/nonexistent/nvidia-smi", "--trainer", "/bin/true",
                    "--work_dir", dir_.path() + "/work-unprivileged"},
                   {});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err,
                                "--rank_user: cannot run ranks as user root (uid 0, gid 0): "
                                "Operation not permitted; the worker needs to run as root, or "
                                "with CAP_SETUID and CAP_SETGID"))
      << r.err;
}

}  // namespace
}  // namespace trainctl
