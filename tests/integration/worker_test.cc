// Worker daemons and scheduling as users run them: the real trainctl-coordinator (SQLite file),
// real trainctl-worker daemons, and ranks that are the real trainctl-trainer on the tiny model or,
// for some fault cases, tests/integration/fake_rank.cc. Multi-node cases run each worker in its own
// network namespace (ip netns, veth pairs on a bridge) as a separate host.
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cli/job_client.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/daemons.h"
#include "tests/testing/subprocess.h"
#include "tests/trainer/shapes_fixture.h"

namespace trainctl {
namespace {

namespace fs = std::filesystem;
namespace v1 = trainctl::v1;
using testing::RunResult;
using testing::Subprocess;
using testing::WaitFor;
using std::string_literals::operator""s;

// Live (non-zombie) processes whose environment says they are ranks of `job_id`, started by a
// worker whose work dir is under `root` (tests run concurrently, each with its own job-1).
std::vector<pid_t> RankProcesses(const std::string& root, const std::string& job_id) {
  std::vector<pid_t> pids;
  const std::string needle = absl::StrCat("TRAINCTL_JOB_ID=", job_id);
  for (const auto& entry : fs::directory_iterator("/proc")) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &pid)) continue;
    const std::string stat = testing::ReadFileOrEmpty(entry.path().string() + "/stat");
    const auto close = stat.rfind(')');
    if (close == std::string::npos || close + 2 >= stat.size() || stat[close + 2] == 'Z') continue;
    if (!absl::StrContains(testing::ReadFileOrEmpty(entry.path().string() + "/cmdline"), root)) {
      continue;
    }
    const std::string env = testing::ReadFileOrEmpty(entry.path().string() + "/environ");
    for (absl::string_view var : absl::StrSplit(env, '\0')) {
      if (var == needle) {
        pids.push_back(pid);
        break;
      }
    }
  }
  return pids;
}

// The pid of rank `rank` of `job_id` (0 if none).
pid_t RankPid(const std::string& root, const std::string& job_id, int rank) {
  for (pid_t pid : RankProcesses(root, job_id)) {
    const std::string env = testing::ReadFileOrEmpty(absl::StrCat("/proc/", pid, "/environ"));
    for (absl::string_view var : absl::StrSplit(env, '\0')) {
      if (var == absl::StrCat("RANK=", rank)) return pid;
    }
  }
  return 0;
}

class WorkerTest : public testing::ShapesTrainingTest, protected testing::Daemons {
 protected:
  std::string daemon_dir() const override { return dir_.path(); }

  std::vector<pid_t> RankProcesses(const std::string& job_id) {
    return trainctl::RankProcesses(dir_.path(), job_id);
  }
  pid_t RankPid(const std::string& job_id, int rank) {
    return trainctl::RankPid(dir_.path(), job_id, rank);
  }

  ~WorkerTest() override { StopDaemons(); }

  // A worker daemon (Daemons::WorkerArgv) with `slots`; `trainer` "" = the real trainer; `netns`
  // runs it in that network namespace, `advertise` is its --advertise_addr.
  void StartWorker(const std::string& name, int slots, const std::string& trainer = "",
                   const std::string& netns = "", const std::string& advertise = "") {
    std::vector<std::string> extra = {"--slots", absl::StrCat(slots), "--kill_grace", "2s",
                                      // the jobs' output dirs are in the test's directory
                                      "--output_roots", dir_.path()};
    if (!advertise.empty()) extra.insert(extra.end(), {"--advertise_addr", advertise});
    const std::string bin = trainer.empty() ? std::string(TRAINCTL_TRAINER_BIN) : trainer;
    std::vector<std::string> argv = WorkerArgv(name, bin, extra);
    if (!netns.empty()) argv.insert(argv.begin(), {"/usr/sbin/ip", "netns", "exec", netns});
    workers_[name] = std::make_unique<Subprocess>(argv, dir_.path() + "/worker-" + name + ".log");
  }

  bool NodeReady(const std::string& name) {
    auto nodes = client_->ListNodes();
    if (!nodes.ok()) return false;
    for (const auto& n : nodes->nodes()) {
      if (n.name() == name && n.state() == "ready") return true;
    }
    return false;
  }

  std::string Submit(const std::string& spec_path) {
    RunResult r = testing::Run({TRAINCTL_CLI_BIN, "submit", spec_path, "-o", "json"},
                               {{"TRAINCTL_COORDINATOR", address_}});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    return j.is_object() && j.contains("id") ? j["id"].get<std::string>() : "";
  }

  // A spec for fake ranks: N nodes x M slots, the behaviour in `env`.
  std::string FakeSpec(const std::string& name, int nodes, int slots, const nlohmann::json& env,
                       int max_restarts = 0) {
    return WriteSpec(name, dir_.path() + "/out-" + name, {},
                     {{"resources", {{"nodes", nodes}, {"slots_per_node", slots}}},
                      {"env", env},
                      {"max_restarts", max_restarts}});
  }
};

TEST_F(WorkerTest, TwoRankSftRunsToTheEndOnOneWorker) {
  StartCoordinator();
  StartWorker("node-a", 2);
  ASSERT_TRUE(WaitFor([&] { return NodeReady("node-a"); }, absl::Seconds(20))) << Logs();
  RunResult nodes = testing::Run({TRAINCTL_CLI_BIN, "nodes"}, {{"TRAINCTL_COORDINATOR", address_}});
  EXPECT_EQ(nodes.exit_code, 0) << nodes.err;
  EXPECT_TRUE(absl::StrContains(nodes.out, "node-a")) << nodes.out;
  EXPECT_TRUE(absl::StrContains(nodes.out, "ready")) << nodes.out;
  EXPECT_TRUE(absl::StrContains(nodes.out, "2 cpu")) << nodes.out;

  const std::string out = dir_.path() + "/out-sft";
  const std::string id = Submit(WriteSpec("sft", out, {{"max_steps", 8}},
                                          {{"resources", {{"nodes", 1}, {"slots_per_node", 2}}}}));
  ASSERT_FALSE(id.empty());
  const v1::Job job = WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(240));
  EXPECT_EQ(job.progress().step(), 8);
  EXPECT_EQ(job.last_checkpoint().step(), 8);
  EXPECT_TRUE(fs::exists(job.last_checkpoint().path())) << job.last_checkpoint().path();

  // Every state in order, once.
  std::vector<v1::JobState> states;
  int metrics = 0;
  for (const v1::JobEvent& e : Events(id)) {
    if (e.has_state_change()) states.push_back(e.state_change().to());
    if (e.has_metric()) ++metrics;
  }
  EXPECT_EQ(states, (std::vector<v1::JobState>{v1::JOB_STATE_PENDING, v1::JOB_STATE_SCHEDULED,
                                               v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED}));
  EXPECT_EQ(metrics, 8);

  // Both ranks' log lines reached the coordinator, and match the worker's per-rank log files.
  std::map<int, std::vector<std::string>> stored;
  for (const v1::LogLine& l : StoredLogs(id)) stored[l.rank()].push_back(l.text());
  ASSERT_EQ(stored.size(), 2u);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string file = testing::ReadFileOrEmpty(
        absl::StrCat(dir_.path(), "/work-node-a/tasks/", id, ".0.0/rank-", rank, ".log"));
    std::vector<std::string> lines = absl::StrSplit(file, '\n', absl::SkipEmpty());
    EXPECT_EQ(stored[rank], lines) << "rank " << rank;
  }
  EXPECT_TRUE(RankProcesses(id).empty());
}

// GRPO through the whole product: submitted with the CLI, two real trainer ranks at ZeRO-3 with a
// frozen reference (beta > 0), rewards on the shapes records' solutions; `trainctl describe`
// shows the reward metrics the coordinator stored.
TEST_F(WorkerTest, GrpoJobRunsToTheEndAndDescribeShowsItsRewards) {
  StartCoordinator();
  StartWorker("node-a", 2);
  ASSERT_TRUE(WaitFor([&] { return NodeReady("node-a"); }, absl::Seconds(20))) << Logs();
  const nlohmann::json ds = {{"zero_optimization", {{"stage", 3}, {"reduce_bucket_size", "auto"}}},
                             {"train_micro_batch_size_per_gpu", "auto"},
                             {"gradient_accumulation_steps", "auto"}};
  const std::string id = Submit(WriteSpec("grpo", dir_.path() + "/out-grpo",
                                          {{"max_steps", 3},
                                           {"per_device_train_batch_size", 2},
                                           {"gradient_accumulation_steps", 1},
                                           {"num_generations", 4},
                                           {"max_completion_length", 6},
                                           {"beta", 0.04},
                                           {"save_steps", 3}},
                                          {{"kind", "grpo"},
                                           {"reward_funcs", {"accuracy", "format"}},
                                           {"deepspeed_config_json", ds.dump()},
                                           {"resources", {{"nodes", 1}, {"slots_per_node", 2}}}}));
  ASSERT_FALSE(id.empty());
  const v1::Job job = WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(240));
  EXPECT_EQ(job.progress().step(), 3);
  EXPECT_EQ(job.last_checkpoint().step(), 3);
  RunResult described =
      testing::Run({TRAINCTL_CLI_BIN, "describe", id}, {{"TRAINCTL_COORDINATOR", address_}});
  ASSERT_EQ(described.exit_code, 0) << described.err;
  for (const char* name :
       {"reward=", "reward_std=", "rewards/accuracy/mean=", "rewards/format/mean=", "kl=",
        "completions/mean_length=", "clip_ratio/region_mean="}) {
    EXPECT_TRUE(absl::StrContains(described.out, name)) << name << "\n" << described.out;
  }
  // The coordinator could not know the registry model's hidden size: the lead rank filled
  // reduce_bucket_size from it, and said so (the `setup` event, kept as a job event).
  const v1::RankSetup* setup = nullptr;
  const std::vector<v1::JobEvent> events = Events(id);
  for (const v1::JobEvent& e : events) {
    if (e.has_setup()) setup = &e.setup();
  }
  ASSERT_NE(setup, nullptr);
  EXPECT_EQ(setup->backend(), "gloo");
  ASSERT_GT(setup->hidden_size(), 0);
  const auto bucket = setup->deepspeed_filled().find("zero_optimization.reduce_bucket_size");
  ASSERT_NE(bucket, setup->deepspeed_filled().end()) << setup->DebugString();
  EXPECT_EQ(bucket->second, setup->hidden_size() * setup->hidden_size());
  EXPECT_TRUE(absl::StrContains(described.out, "DeepSpeed from hidden_size ")) << described.out;
}

// A pipeline through the whole product: sft, then eval of what sft trained, on the tiny model with
// one rank. The coordinator places and launches each stage as a job of its kind; the eval stage's
// model is the sft stage's output dir (the trainer loads its newest checkpoint).
TEST_F(WorkerTest, PipelineRunsItsStagesInOrderAndDescribeShowsThem) {
  StartCoordinator();
  StartWorker("node-a", 1);
  ASSERT_TRUE(WaitFor([&] { return NodeReady("node-a"); }, absl::Seconds(20))) << Logs();
  const std::string out = dir_.path() + "/out-pipeline";
  const nlohmann::json stages = nlohmann::json::array(
      {{{"name", "sft"}, {"kind", "sft"}},
       {{"name", "eval"},
        {"kind", "eval"},
        {"training", {{"max_completion_length", 6}, {"per_device_eval_batch_size", 8}}}}});
  const std::string id = Submit(WriteSpec("pipeline", out, {{"max_steps", 2}, {"save_steps", 2}},
                                          {{"kind", "pipeline"}, {"stages", stages}}));
  ASSERT_FALSE(id.empty());
  const v1::Job job = WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(120));
  ASSERT_EQ(job.stages_size(), 2);
  EXPECT_EQ(job.current_stage(), 1);
  for (const v1::StageStatus& stage : job.stages()) {
    EXPECT_EQ(stage.state(), v1::STAGE_STATE_SUCCEEDED) << stage.name();
  }
  EXPECT_EQ(job.stages(0).model_name_or_path(), "tiny");
  EXPECT_EQ(job.stages(1).model_name_or_path(), out + "/sft");
  EXPECT_EQ(job.stages(1).model_from(), "sft");
  EXPECT_TRUE(fs::exists(out + "/sft/checkpoint-2/manifest.json"));
  EXPECT_TRUE(fs::exists(out + "/eval/eval.json")) << Logs();
  EXPECT_TRUE(job.stages(0).figures().count("loss"));
  EXPECT_TRUE(job.stages(1).figures().count("accuracy"));

  // Every state in order: the job waits again for the eval stage's placement.
  std::vector<v1::JobState> states;
  for (const v1::JobEvent& e : Events(id)) {
    if (e.has_state_change()) states.push_back(e.state_change().to());
  }
  EXPECT_EQ(states, (std::vector<v1::JobState>{v1::JOB_STATE_PENDING, v1::JOB_STATE_SCHEDULED,
                                               v1::JOB_STATE_RUNNING, v1::JOB_STATE_PENDING,
                                               v1::JOB_STATE_SCHEDULED, v1::JOB_STATE_RUNNING,
                                               v1::JOB_STATE_SUCCEEDED}));

  const std::map<std::string, std::string> env = {{"TRAINCTL_COORDINATOR", address_}};
  RunResult described = testing::Run({TRAINCTL_CLI_BIN, "describe", id}, env);
  ASSERT_EQ(described.exit_code, 0) << described.err;
  for (const std::string& text :
       {"Stages:"s, "pipeline 2/2 eval"s, out + "/sft ← sft"s, "loss="s, "accuracy="s}) {
    EXPECT_TRUE(absl::StrContains(described.out, text)) << text << "\n" << described.out;
  }
  RunResult listed = testing::Run({TRAINCTL_CLI_BIN, "ls"}, env);
  EXPECT_TRUE(absl::StrContains(listed.out, "pipeline 2/2 eval")) << listed.out;
  RunResult watched = testing::Run({TRAINCTL_CLI_BIN, "watch", id}, env);
  EXPECT_EQ(watched.exit_code, 0) << watched.err;
  EXPECT_TRUE(absl::StrContains(watched.out, "stage      1 sft succeeded")) << watched.out;
  EXPECT_TRUE(absl::StrContains(watched.out, "stage      2 eval running")) << watched.out;
}

TEST_F(WorkerTest, CancelMidRunStopsEveryRankOfTheRealTrainer) {
  StartCoordinator();
  StartWorker("node-a", 2);
  ASSERT_TRUE(WaitFor([&] { return NodeReady("node-a"); }, absl::Seconds(20))) << Logs();
  const std::string id =
      Submit(WriteSpec("long", dir_.path() + "/out-long", {{"max_steps", 100000}},
                       {{"resources", {{"nodes", 1}, {"slots_per_node", 2}}}}));
  WaitState(id, v1::JOB_STATE_RUNNING, absl::Seconds(60));
  ASSERT_TRUE(WaitFor([&] { return Get(id).progress().step() >= 1; }, absl::Seconds(120)))
      << Logs();
  EXPECT_EQ(RankProcesses(id).size(), 2u);
  RunResult cancel = testing::Run({TRAINCTL_CLI_BIN, "cancel", id, "--reason", "enough"},
                                  {{"TRAINCTL_COORDINATOR", address_}});
  EXPECT_EQ(cancel.exit_code, 0) << cancel.err;
  const v1::Job job = WaitState(id, v1::JOB_STATE_CANCELLED, absl::Seconds(20));
  EXPECT_TRUE(absl::StrContains(job.message(), "enough")) << job.message();
  EXPECT_TRUE(RankProcesses(id).empty());
  // The slots are free again.
  ASSERT_TRUE(WaitFor(
      [&] {
        auto nodes = client_->ListNodes();
        return nodes.ok() && nodes->nodes_size() == 1 && nodes->nodes(0).free_slots() == 2;
      },
      absl::Seconds(10)));
}

TEST_F(WorkerTest, FailingRankFailsTheWholeJobWithItsReason) {
  StartCoordinator();
  StartWorker("node-a", 2, FAKE_RANK_BIN);
  ASSERT_TRUE(WaitFor([&] { return NodeReady("node-a"); }, absl::Seconds(20))) << Logs();
  // Rank 1 exits 3 after its lines; rank 0 would hang forever and ignores SIGTERM.
  const std::string id = Submit(FakeSpec("fail", 1, 2,
                                         {{"TRAINCTL_FAKE_LINES", "3"},
                                          {"TRAINCTL_FAKE_FAIL_RANK", "1"},
                                          {"TRAINCTL_FAKE_EXIT_CODE", "3"},
                                          {"TRAINCTL_FAKE_HANG", "1"},
                                          {"TRAINCTL_FAKE_IGNORE_TERM", "1"}}));
  const v1::Job job = WaitState(id, v1::JOB_STATE_FAILED, absl::Seconds(30));
  EXPECT_TRUE(absl::StrContains(job.message(), "rank 1 on node-a exited with code 3"))
      << job.message();
  EXPECT_TRUE(absl::StrContains(job.message(), "fatal: injected failure")) << job.message();
  EXPECT_TRUE(RankProcesses(id).empty());

  // The real trainer failing (its data path does not exist) fails the job with its own words.
  const std::string bad = WriteSpec("bad", dir_.path() + "/out-bad", {},
                                    {{"data_path", dir_.path() + "/no-such-shards"}});
  workers_.clear();
  StartWorker("node-b", 1);
  ASSERT_TRUE(WaitFor([&] { return NodeReady("node-b"); }, absl::Seconds(20))) << Logs();
  const std::string bad_id = Submit(bad);
  const v1::Job bad_job = WaitState(bad_id, v1::JOB_STATE_FAILED, absl::Seconds(60));
  EXPECT_TRUE(absl::StrContains(bad_job.message(), "rank 0 on node-b exited with code 1"))
      << bad_job.message();
  EXPECT_TRUE(absl::StrContains(bad_job.message(), "no-such-shards")) << bad_job.message();
}

TEST_F(WorkerTest, RestartContinuesFromTheLastCheckpoint) {
  StartCoordinator();
  StartWorker("node-a", 2);
  ASSERT_TRUE(WaitFor([&] { return NodeReady("node-a"); }, absl::Seconds(20))) << Logs();
  const std::string id = Submit(
      WriteSpec("restart", dir_.path() + "/out-restart", {{"max_steps", 12}, {"save_steps", 4}},
                {{"resources", {{"nodes", 1}, {"slots_per_node", 2}}}, {"max_restarts", 1}}));
  // After the first checkpoint, kill rank 1 with SIGKILL: the job restarts from step 4 (or later).
  ASSERT_TRUE(WaitFor([&] { return Get(id).last_checkpoint().step() >= 4; }, absl::Seconds(180)))
      << Logs();
  const int64_t saved = Get(id).last_checkpoint().step();
  const pid_t victim = RankPid(id, 1);
  ASSERT_GT(victim, 0);
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  const v1::Job job = WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(240));
  EXPECT_EQ(job.attempt(), 1);
  EXPECT_EQ(job.progress().step(), 12);

  // The second attempt's first metric continues after a checkpoint, not at step 1.
  int attempt = 0;
  int64_t first_step_of_attempt_1 = -1;
  bool restarting_seen = false;
  for (const v1::JobEvent& e : Events(id)) {
    if (e.has_state_change()) {
      attempt = e.state_change().attempt();
      if (e.state_change().to() == v1::JOB_STATE_RESTARTING) {
        restarting_seen = true;
        EXPECT_TRUE(
            absl::StrContains(e.state_change().reason(), "rank 1 on node-a was killed by signal 9"))
            << e.state_change().reason();
      }
    }
    if (e.has_metric() && attempt == 1 && first_step_of_attempt_1 < 0) {
      first_step_of_attempt_1 = e.metric().step();
    }
  }
  EXPECT_TRUE(restarting_seen);
  EXPECT_GT(first_step_of_attempt_1, saved) << "the step counter started again";
  EXPECT_LE(first_step_of_attempt_1, saved + 4 + 1);
  EXPECT_TRUE(RankProcesses(id).empty());
}

TEST_F(WorkerTest, CoordinatorKill9LosesNoLogLineOrEvent) {
  StartCoordinator();
  StartWorker("node-a", 2);
  ASSERT_TRUE(WaitFor([&] { return NodeReady("node-a"); }, absl::Seconds(20))) << Logs();
  const std::string id = Submit(WriteSpec("survive", dir_.path() + "/out-survive",
                                          {{"max_steps", 16}, {"save_steps", 8}},
                                          {{"resources", {{"nodes", 1}, {"slots_per_node", 2}}}}));
  ASSERT_TRUE(WaitFor([&] { return Get(id).progress().step() >= 2; }, absl::Seconds(120)))
      << Logs();
  coordinator_->Kill(SIGKILL);
  ASSERT_TRUE(coordinator_->Wait(absl::Seconds(10)).ok());
  // The ranks keep training while no coordinator exists.
  const pid_t rank0 = RankPid(id, 0);
  EXPECT_GT(rank0, 0);
  absl::SleepFor(absl::Seconds(3));
  EXPECT_EQ(RankPid(id, 0), rank0) << "the ranks must survive a coordinator crash";
  StartCoordinator();  // same address and database
  const v1::Job job = WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(240));
  EXPECT_EQ(job.attempt(), 0) << "reconciled, not restarted";
  EXPECT_EQ(job.progress().step(), 16);

  // Every metric step once or more, none missing; every log line of the rank files is stored.
  std::set<int64_t> steps;
  for (const v1::JobEvent& e : Events(id)) {
    if (e.has_metric()) steps.insert(e.metric().step());
  }
  EXPECT_EQ(steps.size(), 16u);
  std::map<int, std::multiset<std::string>> stored;
  for (const v1::LogLine& l : StoredLogs(id)) stored[l.rank()].insert(l.text());
  for (int rank = 0; rank < 2; ++rank) {
    const std::string file = testing::ReadFileOrEmpty(
        absl::StrCat(dir_.path(), "/work-node-a/tasks/", id, ".0.0/rank-", rank, ".log"));
    int missing = 0;
    for (absl::string_view line : absl::StrSplit(file, '\n', absl::SkipEmpty())) {
      if (!stored[rank].count(std::string(line))) ++missing;
    }
    EXPECT_EQ(missing, 0) << "rank " << rank;
  }
}

// Two hosts: network namespaces joined by a bridge in this one, where the coordinator listens.
class NetnsTest : public WorkerTest {
 protected:
  void SetUp() override {
    WorkerTest::SetUp();
    const std::string tag = absl::StrCat(getpid() % 100000);
    bridge_ = "tcb" + tag;
    subnet_ = absl::StrCat("10.", 100 + getpid() % 100, ".", getpid() / 100 % 250, ".");
    std::vector<std::vector<std::string>> steps = {
        {"link", "add", bridge_, "type", "bridge"},
        {"addr", "add", subnet_ + "1/24", "dev", bridge_},
        {"link", "set", bridge_, "up"}};
    for (int i = 0; i < 2; ++i) {
      const std::string ns = absl::StrCat("tcns", tag, "-", i);
      const std::string veth = absl::StrCat("tcv", tag, i);
      namespaces_.push_back(ns);
      addrs_.push_back(absl::StrCat(subnet_, 2 + i));
      for (auto step : std::vector<std::vector<std::string>>{
               {"netns", "add", ns},
               {"link", "add", veth, "type", "veth", "peer", "name", veth + "p"},
               {"link", "set", veth + "p", "netns", ns},
               {"link", "set", veth, "master", bridge_},
               {"link", "set", veth, "up"},
               {"-n", ns, "addr", "add", addrs_.back() + "/24", "dev", veth + "p"},
               {"-n", ns, "link", "set", veth + "p", "up"},
               {"-n", ns, "link", "set", "lo", "up"}}) {
        steps.push_back(step);
      }
    }
    for (auto step : steps) {
      step.insert(step.begin(), "/usr/sbin/ip");
      RunResult r = testing::Run(step);
      ASSERT_EQ(r.exit_code, 0) << absl::StrJoin(step, " ") << ": " << r.err
                                << " (these tests need root to create network namespaces)";
    }
  }
  void TearDown() override {
    workers_.clear();
    for (const std::string& ns : namespaces_) testing::Run({"/usr/sbin/ip", "netns", "del", ns});
    testing::Run({"/usr/sbin/ip", "link", "del", bridge_});
  }

  // One worker with one slot on each host, running `trainer` ("" = the real trainer).
  void StartHosts(const std::string& trainer) {
    StartWorker("node-a", 1, trainer, namespaces_[0], addrs_[0]);
    StartWorker("node-b", 1, trainer, namespaces_[1], addrs_[1]);
  }
  bool HostsReady() {
    return WaitFor([&] { return NodeReady("node-a") && NodeReady("node-b"); }, absl::Seconds(30));
  }

  std::string bridge_, subnet_;
  std::vector<std::string> namespaces_, addrs_;
};

TEST_F(NetnsTest, TwoNodeJobRendezvousesAcrossHostsAndSurvivesAWorkerKill) {
  address_ = subnet_ + "1:0";  // the coordinator listens on the bridge
  StartCoordinator();
  StartHosts("");
  ASSERT_TRUE(HostsReady()) << Logs();
  // The real trainer, one rank on each host: Gloo across the bridge.
  const std::string id = Submit(WriteSpec("two-node", dir_.path() + "/out-two", {{"max_steps", 4}},
                                          {{"resources", {{"nodes", 2}, {"slots_per_node", 1}}}}));
  const v1::Job job = WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(240));
  EXPECT_EQ(job.progress().step(), 4);
  bool rank1_seen = false;
  for (const v1::LogLine& l : StoredLogs(id)) rank1_seen = rank1_seen || l.rank() == 1;
  EXPECT_TRUE(rank1_seen);

  // kill -9 one worker (its ranks die with it); the job with one restart allowed goes to
  // restarting within the lease (3 s) plus a little, then waits for two nodes again.
  workers_.clear();
  StartHosts(FAKE_RANK_BIN);
  ASSERT_TRUE(HostsReady()) << Logs();
  const std::string hang =
      Submit(FakeSpec("hang", 2, 1, {{"TRAINCTL_FAKE_HANG", "1"}}, /*max_restarts=*/1));
  WaitState(hang, v1::JOB_STATE_RUNNING, absl::Seconds(30));
  ASSERT_EQ(RankProcesses(hang).size(), 2u);
  const absl::Time killed = absl::Now();
  workers_["node-b"]->Kill(SIGKILL);
  const v1::Job restarting = WaitState(hang, v1::JOB_STATE_RESTARTING, absl::Seconds(15));
  const absl::Duration took = absl::Now() - killed;
  EXPECT_LT(took, absl::Seconds(3 + 5)) << "lease 3 s";
  EXPECT_TRUE(absl::StrContains(restarting.message(), "node node-b lost")) << restarting.message();
  // node-b's rank died with its worker; node-a's rank was stopped.
  EXPECT_TRUE(WaitFor([&] { return RankProcesses(hang).empty(); }, absl::Seconds(10)));
  // A new worker on host b: the job runs again (attempt 1), on both hosts.
  StartWorker("node-b", 1, FAKE_RANK_BIN, namespaces_[1], addrs_[1]);
  WaitState(hang, v1::JOB_STATE_RUNNING, absl::Seconds(30));
  EXPECT_EQ(Get(hang).attempt(), 1);
  // With no restarts left, the next loss fails it.
  workers_["node-a"]->Kill(SIGKILL);
  const v1::Job failed = WaitState(hang, v1::JOB_STATE_FAILED, absl::Seconds(15));
  EXPECT_TRUE(absl::StrContains(failed.message(), "node node-a lost")) << failed.message();
  EXPECT_TRUE(WaitFor([&] { return RankProcesses(hang).empty(); }, absl::Seconds(10)));
}

TEST_F(NetnsTest, RealTrainerRestartsFromItsCheckpointAfterAWorkerKill) {
  address_ = subnet_ + "1:0";  // the coordinator listens on the bridge
  StartCoordinator();
  StartHosts("");
  ASSERT_TRUE(HostsReady()) << Logs();
  const std::string id = Submit(
      WriteSpec("kill-b", dir_.path() + "/out-kill-b", {{"max_steps", 24}, {"save_steps", 4}},
                {{"resources", {{"nodes", 2}, {"slots_per_node", 1}}}, {"max_restarts", 1}}));
  ASSERT_TRUE(WaitFor([&] { return Get(id).last_checkpoint().step() >= 4; }, absl::Seconds(180)))
      << Logs();
  const absl::Time killed = absl::Now();
  workers_["node-b"]->Kill(SIGKILL);
  // Rank 0 fails on its dead peer, or node-b's lease expires: whichever comes first restarts it.
  const v1::Job restarting = WaitState(id, v1::JOB_STATE_RESTARTING, absl::Seconds(15));
  EXPECT_LT(absl::Now() - killed, absl::Seconds(3 + 5)) << "lease 3 s";
  EXPECT_TRUE(absl::StrContains(restarting.message(), "node node-b lost") ||
              absl::StrContains(restarting.message(), "peer rank 1"))
      << restarting.message();
  EXPECT_TRUE(WaitFor([&] { return RankProcesses(id).empty(); }, absl::Seconds(10)));
  const int64_t saved = Get(id).last_checkpoint().step();
  StartWorker("node-b", 1, "", namespaces_[1], addrs_[1]);
  const v1::Job job = WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(240));
  EXPECT_EQ(job.attempt(), 1);
  EXPECT_EQ(job.progress().step(), 24);
  int attempt = 0;
  int64_t first_step_of_attempt_1 = -1;
  for (const v1::JobEvent& e : Events(id)) {
    if (e.has_state_change()) attempt = e.state_change().attempt();
    if (e.has_metric() && attempt == 1 && first_step_of_attempt_1 < 0) {
      first_step_of_attempt_1 = e.metric().step();
    }
  }
  EXPECT_GT(first_step_of_attempt_1, saved) << "the step counter started again";
}

}  // namespace
}  // namespace trainctl
