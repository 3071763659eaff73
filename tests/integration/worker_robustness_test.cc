// Hostile and unlucky workers against the real binaries (issue 10): the real trainctl-coordinator
// and trainctl-worker on loopback, ranks replaced through --trainer by small shell scripts, and
// raw WorkerService clients (or a stand-in coordinator) built from proto/ where a real daemon
// cannot send the bad input.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/stat.h>

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cli/job_client.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/daemons.h"
#include "tests/integration/robustness_fixture.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "trainctl/v1/worker.grpc.pb.h"

namespace trainctl {
namespace {

namespace fs = std::filesystem;
namespace v1 = trainctl::v1;
using testing::RawSession;
using testing::Register;
using testing::RobustnessTest;
using testing::RunResult;
using testing::Subprocess;
using testing::WaitFor;
using std::string_literals::operator""s;

// Defect 1: a rank printing Latin-1, and a UTF-8 line longer than the worker's 64 KiB line limit
// whose cut falls inside a character, used to wedge the worker's session forever.
TEST_F(RobustnessTest, RankOutputThatIsNotUtf8ReachesTheCoordinatorAndTheJobEnds) {
  StartCoordinator();
  // 'a' then 40000 two-byte characters: byte 65536 is the second byte of one of them.
  std::string long_line = "a";
  for (int i = 0; i < 40000; ++i) long_line += "\xC3\xA9";
  const std::string long_file = dir_.Write("long.txt", long_line + "\n");
  const std::string rank =
      Script("latin1-rank.sh",
             absl::StrCat("[ \"$TRAINCTL_TEST_MODE\" = ok ] && exit 0\n",
                          "printf 'caf\\351 au lait\\n'\n", "cat ", long_file, "\n",
                          "printf 'after\\n'\n", "printf 'fatal: caf\\351\\n' >&2\n", "exit 3\n"));
  StartWorker("node-a", 1, rank);
  ASSERT_TRUE(WaitFor([&] { return NodeReady("node-a"); }, absl::Seconds(20))) << Logs();
  const std::string id = Submit("latin1");
  ASSERT_FALSE(id.empty());
  const v1::Job job = WaitState(id, v1::JOB_STATE_FAILED, absl::Seconds(20));
  EXPECT_TRUE(absl::StrContains(job.message(), "rank 0 on node-a exited with code 3"))
      << job.message();
  EXPECT_TRUE(absl::StrContains(job.message(), "fatal: caf\xEF\xBF\xBD")) << job.message();

  std::map<std::string, std::vector<std::string>> texts;  // by stream, in order
  for (const v1::LogLine& l : StoredLogs(id)) texts[l.stream()].push_back(l.text());
  ASSERT_EQ(texts["stdout"].size(), 4u) << absl::StrJoin(texts["stdout"], "\n").substr(0, 2000);
  EXPECT_EQ(texts["stdout"][0], "caf\xEF\xBF\xBD au lait");
  // The long line arrives in pieces cut between characters, nothing lost or replaced.
  EXPECT_LE(texts["stdout"][1].size(), 64u * 1024);
  EXPECT_EQ(texts["stdout"][1] + texts["stdout"][2], long_line);
  EXPECT_EQ(texts["stdout"][3], "after");
  EXPECT_EQ(texts["stderr"], std::vector<std::string>{"fatal: caf\xEF\xBF\xBD"});
  EXPECT_EQ(NodeState("node-a"), "ready");

  // The worker keeps working: the next job runs on it.
  const std::string next = Submit("next", {{"env", {{"TRAINCTL_TEST_MODE", "ok"}}}});
  WaitState(next, v1::JOB_STATE_SUCCEEDED, absl::Seconds(20));
}

// A stand-in coordinator for the worker's side of the protocol: accepts every register, launches
// `launch` once (on the first session), and answers each sequenced message as `judge` says.
class StandInCoordinator final : public v1::WorkerService::Service {
 public:
  enum class Verdict { kAck, kReject, kEndSession };

  StandInCoordinator(v1::LaunchTask launch, std::function<Verdict(const v1::WorkerMessage&)> judge)
      : launch_(std::move(launch)), judge_(std::move(judge)) {}

  grpc::Status Session(
      grpc::ServerContext* /*context*/,
      grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>* stream) override {
    v1::WorkerMessage in;
    if (!stream->Read(&in) || !in.has_register_()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "register first");
    }
    v1::CoordinatorMessage out;
    out.mutable_registered();
    stream->Write(out);
    {
      absl::MutexLock lock(&mu_);
      ++sessions_;
      if (!launched_) {
        launched_ = true;
        out.Clear();
        *out.mutable_launch() = launch_;
        stream->Write(out);
      }
    }
    while (stream->Read(&in)) {
      if (in.has_heartbeat()) continue;
      {
        absl::MutexLock lock(&mu_);
        received_.push_back(in);
      }
      const Verdict verdict = judge_(in);
      if (verdict == Verdict::kEndSession) {
        return grpc::Status(grpc::StatusCode::INTERNAL, "stand-in: cannot take this message");
      }
      if (verdict == Verdict::kReject) {
        out.Clear();
        out.mutable_reject()->set_seq(in.seq());
        out.mutable_reject()->set_reason("stand-in: refused");
        stream->Write(out);
      }
      out.Clear();
      out.mutable_ack()->set_through_seq(in.seq());
      stream->Write(out);
    }
    return grpc::Status::OK;
  }

  std::vector<v1::WorkerMessage> received() {
    absl::MutexLock lock(&mu_);
    return received_;
  }
  int sessions() {
    absl::MutexLock lock(&mu_);
    return sessions_;
  }
  // The first received message of its kind for which `match` holds, if any.
  bool Got(const std::function<bool(const v1::WorkerMessage&)>& match,
           v1::WorkerMessage* found = nullptr) {
    for (const v1::WorkerMessage& m : received()) {
      if (match(m)) {
        if (found != nullptr) *found = m;
        return true;
      }
    }
    return false;
  }

 private:
  const v1::LaunchTask launch_;
  const std::function<Verdict(const v1::WorkerMessage&)> judge_;
  absl::Mutex mu_;
  bool launched_ ABSL_GUARDED_BY(mu_) = false;
  int sessions_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<v1::WorkerMessage> received_ ABSL_GUARDED_BY(mu_);
};

bool HasLine(const v1::WorkerMessage& m, const std::string& text) {
  for (const v1::LogLine& l : m.logs().lines()) {
    if (l.text() == text) return true;
  }
  return false;
}

bool Ended(const v1::WorkerMessage& m, v1::TaskState state) {
  return m.has_task_status() && m.task_status().state() == state;
}

class StandInTest : public RobustnessTest {
 protected:
  // Serves `coordinator` on a free loopback port and points address_ at it.
  void Serve(StandInCoordinator* coordinator) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(coordinator);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    address_ = absl::StrCat("127.0.0.1:", port);
  }
  ~StandInTest() override {
    workers_.clear();
    if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  }

  v1::LaunchTask Launch() {
    v1::LaunchTask launch;
    launch.set_task_id("job-1.0.0");
    launch.set_job_id("job-1");
    launch.set_world_size(1);
    launch.set_master_addr("127.0.0.1");
    launch.set_nodes(1);
    launch.set_slots(1);
    launch.mutable_spec()->set_output_dir(WorkDir("node-a") + "/out");
    return launch;
  }

  std::unique_ptr<grpc::Server> server_;
};

// Defect 1, the worker's side: a message the coordinator rejects is set aside, kept on disk and
// reported; what follows it flows.
TEST_F(StandInTest, RejectedMessageIsSetAsideReportedAndTheRestFlows) {
  StandInCoordinator coordinator(Launch(), [](const v1::WorkerMessage& m) {
    return HasLine(m, "poison") ? StandInCoordinator::Verdict::kReject
                                : StandInCoordinator::Verdict::kAck;
  });
  Serve(&coordinator);
  StartWorker("node-a", 1, Script("rank.sh", "echo poison\n"));
  ASSERT_TRUE(WaitFor(
      [&] { return coordinator.Got([](auto& m) { return Ended(m, v1::TASK_STATE_SUCCEEDED); }); },
      absl::Seconds(20)))
      << Logs();
  v1::WorkerMessage rejected, warning;
  ASSERT_TRUE(coordinator.Got([](auto& m) { return HasLine(m, "poison"); }, &rejected));
  ASSERT_TRUE(
      WaitFor([&] { return coordinator.Got([](auto& m) { return m.has_warning(); }, &warning); },
              absl::Seconds(10)))
      << Logs();
  EXPECT_EQ(warning.warning().job_id(), "job-1");
  EXPECT_TRUE(absl::StrContains(warning.warning().message(),
                                absl::StrCat("(seq ", rejected.seq(),
                                             "): the coordinator "
                                             "rejected it: stand-in: refused")))
      << warning.warning().message();
  // Its bytes are kept, not lost.
  std::vector<fs::path> kept;
  for (const auto& e : fs::directory_iterator(WorkDir("node-a") + "/set-aside")) {
    kept.push_back(e.path());
  }
  ASSERT_EQ(kept.size(), 1u);
  v1::WorkerMessage on_disk;
  ASSERT_TRUE(on_disk.ParseFromString(testing::ReadFileOrEmpty(kept[0].string())));
  EXPECT_TRUE(HasLine(on_disk, "poison"));
  EXPECT_TRUE(absl::StrContains(warning.warning().message(), kept[0].string()));
}

// Defect 1: a message the coordinator cannot read ends its session (as invalid UTF-8 did); the
// worker sends it again after reconnecting, but not forever.
TEST_F(StandInTest, MessageThatEndsEverySessionIsSetAsideAfterThreeAndTheRestFlows) {
  StandInCoordinator coordinator(Launch(), [](const v1::WorkerMessage& m) {
    return HasLine(m, "poison") ? StandInCoordinator::Verdict::kEndSession
                                : StandInCoordinator::Verdict::kAck;
  });
  Serve(&coordinator);
  StartWorker("node-a", 1, Script("rank.sh", "echo poison\n"));
  ASSERT_TRUE(WaitFor(
      [&] { return coordinator.Got([](auto& m) { return Ended(m, v1::TASK_STATE_SUCCEEDED); }); },
      absl::Seconds(20)))
      << Logs();
  int poison_sent = 0;
  for (const v1::WorkerMessage& m : coordinator.received()) poison_sent += HasLine(m, "poison");
  EXPECT_EQ(poison_sent, 3);
  EXPECT_EQ(coordinator.sessions(), 4);
  v1::WorkerMessage warning;
  ASSERT_TRUE(
      WaitFor([&] { return coordinator.Got([](auto& m) { return m.has_warning(); }, &warning); },
              absl::Seconds(10)))
      << Logs();
  EXPECT_TRUE(absl::StrContains(warning.warning().message(),
                                "the coordinator ended 3 sessions in a row without acknowledging "
                                "it (last: stand-in: cannot take this message)"))
      << warning.warning().message();
}

// Defect 1, the coordinator's side: a message that fails its checks is rejected by seq, naming
// the field, and the session goes on; a worker's warning about a job placed on it lands in the
// job's events.
TEST_F(RobustnessTest, CoordinatorRejectsABadMessageBySeqAndTheSessionGoesOn) {
  StartCoordinator();
  const std::string id = Submit("placed-on-raw");
  RawSession raw(address_);
  ASSERT_TRUE(raw.Send(Register("raw-node", 1, "raw-boot")));
  v1::CoordinatorMessage in;
  ASSERT_TRUE(raw.Next(&in));
  EXPECT_TRUE(in.has_registered()) << in.DebugString();
  ASSERT_TRUE(raw.NextNonAck(&in));
  ASSERT_TRUE(in.has_launch()) << in.DebugString();
  EXPECT_EQ(in.launch().job_id(), id);

  v1::WorkerMessage bad;
  bad.set_seq(1);
  v1::LogLine* line = bad.mutable_logs()->add_lines();
  line->set_job_id(id);
  line->set_rank(-5);
  line->set_stream("stdout");
  line->set_text("from a rank that does not exist");
  ASSERT_TRUE(raw.Send(bad));
  ASSERT_TRUE(raw.Next(&in));
  ASSERT_TRUE(in.has_reject()) << in.DebugString();
  EXPECT_EQ(in.reject().seq(), 1);
  EXPECT_TRUE(absl::StrContains(in.reject().reason(), "logs.lines[0].rank: must be in [0, "))
      << in.reject().reason();
  ASSERT_TRUE(raw.Next(&in));
  EXPECT_EQ(in.ack().through_seq(), 1) << in.DebugString();

  v1::WorkerMessage warning;
  warning.set_seq(2);
  warning.mutable_warning()->set_job_id(id);
  warning.mutable_warning()->set_message("set aside a batch of 1 log lines (seq 1)");
  ASSERT_TRUE(raw.Send(warning));
  ASSERT_TRUE(raw.Next(&in));
  EXPECT_EQ(in.ack().through_seq(), 2) << in.DebugString();
  EXPECT_EQ(NodeState("raw-node"), "ready");
  bool seen = false;
  for (const v1::JobEvent& e : Events(id)) {
    seen = seen || (e.has_warning() && e.warning().source() == "worker raw-node" &&
                    e.warning().message() == "set aside a batch of 1 log lines (seq 1)");
  }
  EXPECT_TRUE(seen);
  RunResult describe =
      testing::Run({TRAINCTL_CLI_BIN, "describe", id}, {{"TRAINCTL_COORDINATOR", address_}});
  EXPECT_TRUE(absl::StrContains(describe.out,
                                "warning    worker raw-node: set aside a batch of 1 log lines"))
      << describe.out;
  EXPECT_TRUE(StoredLogs(id).empty());
}

// Defect 2: registers with fields out of range or of the wrong shape are refused with
// INVALID_ARGUMENT naming the field, at once, and the coordinator keeps serving.
TEST_F(RobustnessTest, RegisterOutOfRangeIsRefusedNamingTheFieldAndTheCoordinatorLives) {
  StartCoordinator();
  // A job waiting for a node: every register runs a scheduling pass.
  const std::string id = Submit("waiting", {{"node_selector", {{"pool", "none"}}}});
  struct Case {
    std::function<void(v1::RegisterWorker*)> edit;
    std::string error;
  };
  const std::vector<Case> cases = {
      {[](auto* r) { r->mutable_resources()->set_cpu_slots(2147483647); },
       "register.resources.cpu_slots: must be in [1, 1024] on a node without GPUs, got 2147483647"},
      {[](auto* r) { r->mutable_resources()->set_cpu_slots(1000000000); },
       "register.resources.cpu_slots: must be in [1, 1024] on a node without GPUs, got 1000000000"},
      {[](auto* r) { r->mutable_resources()->set_cpu_slots(-1); },
       "register.resources.cpu_slots: must be in [1, 1024] on a node without GPUs, got -1"},
      {[](auto* r) { r->set_node_name(""); }, "register.node_name: required"},
      {[](auto* r) { r->set_node_name("../etc"); }, "register.node_name: '../etc' may hold only"},
      {[](auto* r) { r->set_node_name(std::string(300, 'n')); },
       "register.node_name: at most 253 bytes, got 300"},
      {[](auto* r) { r->set_advertise_addr("10.0.0.1; rm -rf /"); },
       "register.advertise_addr: '10.0.0.1; rm -rf /' may hold only"},
      {[](auto* r) {
         for (int i = 0; i < 65; ++i) (*r->mutable_labels())[absl::StrCat("k", i)] = "v";
       },
       "register.labels: at most 64 labels, got 65"},
      {[](auto* r) { (*r->mutable_labels())["zone"] = std::string(100, 'z'); },
       "register.labels['zone']: at most 63 bytes, got 100"},
      {[](auto* r) {
         for (int i = 0; i < 2; ++i) r->mutable_resources()->add_gpus()->set_index(3);
       },
       "register.resources.gpus[1].index: GPU 3 listed twice"},
      {[](auto* r) { r->mutable_resources()->add_gpus()->set_index(-1); },
       "register.resources.gpus[0].index: must be in [0, 1023], got -1"},
      {[](auto* r) {
         v1::RunningTask* t = r->add_running_tasks();
         t->set_task_id("job-9.0.0");
         t->set_job_id("job-9");
         t->set_slots(5);
         t->set_state(v1::TASK_STATE_RUNNING);
       },
       "register.running_tasks: tasks still running hold 5 slots, the node has 1"},
      {[](auto* r) {
         v1::RunningTask* t = r->add_running_tasks();
         t->set_task_id("job-9.0.0");
         t->set_job_id("job-9");
         t->set_slots(1);
         t->set_state(static_cast<v1::TaskState>(99));
       },
       "register.running_tasks[0].state: unknown task state 99"},
      {[](auto* r) { r->set_boot_id(""); }, "register.boot_id: required"},
  };
  for (const Case& c : cases) {
    v1::WorkerMessage reg = Register("bad-node", 1, "boot-1");
    c.edit(reg.mutable_register_());
    RawSession raw(address_);
    const absl::Time start = absl::Now();
    ASSERT_TRUE(raw.Send(reg));
    v1::CoordinatorMessage in;
    EXPECT_FALSE(raw.Next(&in)) << in.DebugString();
    const grpc::Status status = raw.Finish();
    EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << c.error;
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
    EXPECT_TRUE(absl::StrContains(status.error_message(), c.error))
        << status.error_message() << "\nwanted: " << c.error << "\n"
        << Logs();
  }
  auto nodes = client_->ListNodes();
  ASSERT_TRUE(nodes.ok()) << nodes.status() << "\n" << Logs();
  EXPECT_EQ(nodes->nodes_size(), 0);
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_PENDING);
  // The largest node allowed registers and is placed on at once.
  RawSession big(address_);
  ASSERT_TRUE(big.Send(Register("big-node", 1024, "boot-big")));
  v1::CoordinatorMessage in;
  ASSERT_TRUE(big.Next(&in));
  EXPECT_TRUE(in.has_registered()) << in.DebugString();
  EXPECT_EQ(NodeState("big-node"), "ready");
}

// Defect 3: a register under the name of a node whose session is live is refused; after the
// lease, the newcomer takes over and the old worker is told why it cannot come back.
TEST_F(RobustnessTest, SecondSessionCannotTakeOverALiveNodesName) {
  StartCoordinator();
  StartWorker("real-node", 1, Script("hang.sh", "exec sleep 1000\n"));
  ASSERT_TRUE(WaitFor([&] { return NodeReady("real-node"); }, absl::Seconds(20))) << Logs();
  const std::string id = Submit("hang", {{"max_restarts", 1}});
  WaitState(id, v1::JOB_STATE_RUNNING, absl::Seconds(20));

  {
    RawSession impostor(address_);
    ASSERT_TRUE(impostor.Send(Register("real-node", 1, "impostor-boot", "127.0.0.2")));
    v1::CoordinatorMessage in;
    EXPECT_FALSE(impostor.Next(&in)) << in.DebugString();
    const grpc::Status status = impostor.Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::ALREADY_EXISTS) << status.error_message();
    EXPECT_TRUE(absl::StrContains(status.error_message(), "node real-node has a live session"))
        << status.error_message();
  }
  // Nothing changed for the real worker and its job.
  const v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.message();
  EXPECT_EQ(job.attempt(), 0);
  auto nodes = client_->ListNodes();
  ASSERT_TRUE(nodes.ok());
  ASSERT_EQ(nodes->nodes_size(), 1);
  EXPECT_EQ(nodes->nodes(0).address(), "127.0.0.1");
  EXPECT_EQ(nodes->nodes(0).state(), "ready");
  EXPECT_EQ(nodes->nodes(0).tasks_size(), 1);

  // The real worker freezes: once its lease (3 s) has run out, the newcomer may take the name.
  workers_["real-node"]->Kill(SIGSTOP);
  ASSERT_TRUE(WaitFor([&] { return NodeState("real-node") == "lost"; }, absl::Seconds(10)))
      << Logs();
  RawSession newcomer(address_);
  ASSERT_TRUE(newcomer.Send(Register("real-node", 1, "new-boot", "127.0.0.2")));
  v1::CoordinatorMessage in;
  ASSERT_TRUE(newcomer.Next(&in));
  EXPECT_TRUE(in.has_registered()) << in.DebugString();
  EXPECT_EQ(NodeState("real-node"), "ready");
  // The old worker wakes up and is told that the name is taken, each time it tries.
  workers_["real-node"]->Kill(SIGCONT);
  ASSERT_TRUE(WaitFor(
      [&] {
        return absl::StrContains(testing::ReadFileOrEmpty(dir_.path() + "/worker-real-node.log"),
                                 "node real-node has a live session");
      },
      absl::Seconds(10)))
      << Logs();
  nodes = client_->ListNodes();
  ASSERT_TRUE(nodes.ok());
  ASSERT_EQ(nodes->nodes_size(), 1);
  EXPECT_EQ(nodes->nodes(0).address(), "127.0.0.2");
}

// Also expected: a worker that restarted while the coordinator was down re-registers with no
// tasks; the tasks it ran are failed at once, not after the whole recovery grace.
TEST_F(RobustnessTest, WorkerThatRestartedWhileTheCoordinatorWasDownFailsItsTasksAtOnce) {
  StartCoordinator({"--recovery_grace", "60s"});
  const std::string hang = Script("hang.sh", "exec sleep 1000\n");
  StartWorker("node-a", 1, hang);
  ASSERT_TRUE(WaitFor([&] { return NodeReady("node-a"); }, absl::Seconds(20))) << Logs();
  const std::string id = Submit("hang");
  WaitState(id, v1::JOB_STATE_RUNNING, absl::Seconds(20));
  coordinator_->Kill(SIGKILL);
  ASSERT_TRUE(coordinator_->Wait(absl::Seconds(10)).ok());
  workers_["node-a"]->Kill(SIGKILL);  // its rank dies with it
  ASSERT_TRUE(workers_["node-a"]->Wait(absl::Seconds(10)).ok());
  StartCoordinator({"--recovery_grace", "60s"});  // same address and database
  const absl::Time back = absl::Now();
  StartWorker("node-a", 1, hang);  // a new worker process: it holds no task
  const v1::Job job = WaitState(id, v1::JOB_STATE_FAILED, absl::Seconds(15));
  EXPECT_LT(absl::Now() - back, absl::Seconds(15)) << "the recovery grace is 60 s";
  EXPECT_TRUE(absl::StrContains(job.message(), "worker on node-a restarted and no longer runs"))
      << job.message();
}

// Also expected: a job writes only under its worker's output roots (by default its --work_dir),
// so it cannot write to /etc/cron.d; the launch fails, naming the path, before any rank starts.
TEST_F(RobustnessTest, JobOutputOutsideTheWorkersRootsIsRefused) {
  StartCoordinator();
  output_roots_ = "";  // the default: the work dir
  StartWorker("node-a", 1, Script("mark.sh", "touch \"$TRAINCTL_TEST_MARK\"\n"));
  ASSERT_TRUE(WaitFor([&] { return NodeReady("node-a"); }, absl::Seconds(20))) << Logs();
  const std::string root = WorkDir("node-a");
  fs::create_directory_symlink("/etc", root + "/etc-link");
  const std::vector<std::pair<std::string, nlohmann::json>> refused = {
      {"/etc/cron.d", {{"output_dir", "/etc/cron.d"}}},
      {root + "/../escape", {{"output_dir", root + "/../escape"}}},
      {root + "/etc-link/cron.d", {{"output_dir", root + "/etc-link/cron.d"}}},
  };
  for (size_t i = 0; i < refused.size(); ++i) {
    const std::string mark = absl::StrCat(dir_.path(), "/ran-", i);
    nlohmann::json extra = refused[i].second;
    extra["env"] = {{"TRAINCTL_TEST_MARK", mark}};
    const std::string id = Submit(absl::StrCat("refused-", i), extra);
    const v1::Job job = WaitState(id, v1::JOB_STATE_FAILED, absl::Seconds(20));
    EXPECT_TRUE(absl::StrContains(
        job.message(), absl::StrCat("launch on node-a failed: spec.output_dir: ", refused[i].first,
                                    " is outside this worker's output roots (", root, ")")))
        << job.message();
    EXPECT_FALSE(fs::exists(mark)) << "a rank ran for " << refused[i].first;
  }
  // Under the root, the job runs.
  const std::string mark = dir_.path() + "/ran-inside";
  const std::string id = Submit(
      "inside", {{"output_dir", root + "/out/inside"}, {"env", {{"TRAINCTL_TEST_MARK", mark}}}});
  WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(20));
  EXPECT_TRUE(fs::exists(mark));
}

}  // namespace
}  // namespace trainctl
