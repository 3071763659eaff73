// Trust boundaries between nodes (issue 24), against the real binaries: the real coordinator and a
// real worker running a job, and a second node — a raw WorkerService session that registered
// properly, as any node of the cluster can — that tries to speak for the first node's task.
#include <signal.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "tests/integration/robustness_fixture.h"
#include "tests/testing/promtool.h"
#include "trainctl/v1/worker.grpc.pb.h"

namespace trainctl {
namespace {

namespace v1 = trainctl::v1;
using testing::RawSession;
using testing::Register;
using testing::RobustnessTest;
using testing::WaitFor;

class TrustTest : public RobustnessTest {
 protected:
  // The coordinator with /metrics on a free loopback port.
  void StartWithMetrics(std::vector<std::string> extra = {}) {
    const std::string ready = dir_.path() + "/metrics-ready";
    for (const char* flag : {"--metrics_listen", "127.0.0.1:0", "--metrics_ready_file"}) {
      extra.push_back(flag);
    }
    extra.push_back(ready);
    StartCoordinator(extra);
    const std::string bound =
        std::string(absl::StripAsciiWhitespace(testing::ReadFileOrEmpty(ready)));
    const size_t colon = bound.rfind(':');
    ASSERT_NE(colon, std::string::npos) << bound;
    metrics_host_ = bound.substr(0, colon);
    ASSERT_TRUE(absl::SimpleAtoi(bound.substr(colon + 1), &metrics_port_)) << bound;
  }
  std::string Metrics() { return testing::HttpGet(metrics_host_, metrics_port_, "/metrics"); }

  // Sends `m` and returns the reject that answers it ("" when the coordinator accepted it).
  std::string SendExpectingReject(RawSession& raw, const v1::WorkerMessage& m) {
    EXPECT_TRUE(raw.Send(m));
    v1::CoordinatorMessage in;
    std::string reason;
    while (raw.Next(&in)) {
      if (in.has_reject() && in.reject().seq() == m.seq()) reason = in.reject().reason();
      if (in.has_ack() && in.ack().through_seq() >= m.seq()) return reason;
    }
    ADD_FAILURE() << "the session ended before seq " << m.seq() << " was acknowledged";
    return reason;
  }

  std::string metrics_host_;
  int metrics_port_ = 0;
};

v1::WorkerMessage Status(int64_t seq, const std::string& task, const std::string& job,
                         v1::TaskState state) {
  v1::WorkerMessage m;
  m.set_seq(seq);
  v1::TaskStatus* s = m.mutable_task_status();
  s->set_task_id(task);
  s->set_job_id(job);
  s->set_state(state);
  s->set_failed_rank(0);
  s->set_exit_code(state == v1::TASK_STATE_FAILED ? 1 : 0);
  return m;
}

v1::WorkerMessage Event(int64_t seq, const std::string& job, const std::string& json) {
  v1::WorkerMessage m;
  m.set_seq(seq);
  m.mutable_event()->set_job_id(job);
  m.mutable_event()->set_attempt(0);
  m.mutable_event()->set_rank(0);
  m.mutable_event()->set_json(json);
  return m;
}

// Item 1: node-b registers as itself, then reports on job-1's task, which runs on node-a: a
// success, a failure, log lines, a loss, a checkpoint, an out-of-memory warning, and a register
// that claims the task. Every one is rejected by seq, naming the task or job, counted, and the job
// runs on untouched until node-a's rank ends it.
TEST_F(TrustTest, ANodeSpeaksOnlyForTheTasksPlacedOnIt) {
  ASSERT_NO_FATAL_FAILURE(StartWithMetrics());
  const std::string release = dir_.path() + "/release";
  StartWorker("node-a", 1,
              Script("wait.sh", absl::StrCat("while [ ! -e ", release,
                                             " ]; do sleep 0.05; done\necho loss=0.5\n")));
  ASSERT_TRUE(WaitFor([&] { return NodeReady("node-a"); }, absl::Seconds(20))) << Logs();
  const std::string id = Submit("victim");
  WaitState(id, v1::JOB_STATE_RUNNING, absl::Seconds(20));
  const std::string task = id + ".0.0";

  RawSession raw(address_);
  ASSERT_TRUE(raw.Send(Register("node-b", 1, "boot-b")));
  v1::CoordinatorMessage in;
  ASSERT_TRUE(raw.Next(&in));
  ASSERT_TRUE(in.has_registered()) << in.DebugString();

  std::vector<v1::WorkerMessage> forged = {Status(1, task, id, v1::TASK_STATE_SUCCEEDED),
                                           Status(2, task, id, v1::TASK_STATE_FAILED)};
  v1::WorkerMessage logs;
  logs.set_seq(3);
  v1::LogLine* line = logs.mutable_logs()->add_lines();
  line->set_job_id(id);
  line->set_rank(0);
  line->set_stream("stdout");
  line->set_text("loss=999");
  forged.push_back(logs);
  forged.push_back(Event(4, id, R"({"type":"metrics","step":1,"loss":999})"));
  forged.push_back(Event(5, id, R"({"type":"checkpoint","step":1,"path":"/tmp/evil-checkpoint"})"));
  v1::WorkerMessage warning;
  warning.set_seq(6);
  warning.mutable_warning()->set_job_id(id);
  warning.mutable_warning()->set_task_id(task);
  warning.mutable_warning()->set_message("oom: CUDA out of memory");
  forged.push_back(warning);
  for (const v1::WorkerMessage& m : forged) {
    const std::string reason = SendExpectingReject(raw, m);
    EXPECT_TRUE(absl::StrContains(reason, "which the coordinator did not place on node node-b"))
        << "seq " << m.seq() << ": " << reason << "\n"
        << m.DebugString();
  }
  // A register that claims the task: node-b is told to stop whatever it runs under that id.
  RawSession again(address_);
  v1::WorkerMessage reg = Register("node-c", 1, "boot-c");
  v1::RunningTask* claimed = reg.mutable_register_()->add_running_tasks();
  claimed->set_task_id(task);
  claimed->set_job_id(id);
  claimed->set_slots(1);
  claimed->set_state(v1::TASK_STATE_RUNNING);
  ASSERT_TRUE(again.Send(reg));
  ASSERT_TRUE(again.Next(&in));
  ASSERT_TRUE(in.has_registered()) << in.DebugString();
  ASSERT_TRUE(again.NextNonAck(&in));
  EXPECT_TRUE(in.has_cancel() && in.cancel().task_id() == task) << in.DebugString();

  // Nothing of it reached the job.
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.message();
  EXPECT_FALSE(job.has_last_checkpoint()) << job.last_checkpoint().DebugString();
  EXPECT_TRUE(StoredLogs(id).empty());
  for (const v1::JobEvent& e : Events(id)) {
    EXPECT_FALSE(e.has_warning()) << e.DebugString();
    EXPECT_FALSE(e.has_checkpoint()) << e.DebugString();
    EXPECT_FALSE(e.has_metric()) << e.DebugString();
  }
  const std::string scraped = Metrics();
  EXPECT_TRUE(absl::StrContains(
      scraped, "trainctl_worker_messages_rejected_total{reason=\"not_placed_here\"} 7"))
      << scraped;
  // node-a's own reports still count: its rank ends the job.
  dir_.Write("release", "");
  job = WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(20));
  bool logged = false;
  for (const v1::LogLine& l : StoredLogs(id)) logged = logged || l.text() == "loss=0.5";
  EXPECT_TRUE(logged);
}

// The next launch the coordinator sends on `raw`.
v1::LaunchTask NextLaunch(RawSession& raw) {
  v1::CoordinatorMessage in;
  while (raw.NextNonAck(&in)) {
    if (in.has_launch()) return in.launch();
  }
  ADD_FAILURE() << "the session ended before a launch";
  return v1::LaunchTask();
}

// Item 5: a task that ends before its worker reported it running (a rank that exits within
// milliseconds: the worker then never sends RUNNING) used to leave its job scheduled for good.
// The end comes first here by construction, for every end state, a pipeline's stages and a gang
// of two nodes.
TEST_F(TrustTest, ATaskThatEndsBeforeItWasSeenRunningEndsItsJob) {
  StartCoordinator();
  RawSession raw(address_);
  ASSERT_TRUE(raw.Send(Register("node-a", 2, "boot-a")));
  int64_t seq = 0;
  auto end = [&](const v1::LaunchTask& launch, v1::TaskState state) {
    EXPECT_EQ(SendExpectingReject(raw, Status(++seq, launch.task_id(), launch.job_id(), state)),
              "");
  };

  const std::string ok = Submit("quick");
  end(NextLaunch(raw), v1::TASK_STATE_SUCCEEDED);
  v1::Job job = WaitState(ok, v1::JOB_STATE_SUCCEEDED, absl::Seconds(10));
  EXPECT_EQ(job.message(), "every rank exited 0");

  const std::string failed = Submit("quick-failure");
  end(NextLaunch(raw), v1::TASK_STATE_FAILED);
  job = WaitState(failed, v1::JOB_STATE_FAILED, absl::Seconds(10));
  EXPECT_TRUE(absl::StrContains(job.message(), "rank 0 on node-a exited with code 1"))
      << job.message();

  const std::string stopped = Submit("quick-cancel");
  end(NextLaunch(raw), v1::TASK_STATE_CANCELLED);
  job = WaitState(stopped, v1::JOB_STATE_FAILED, absl::Seconds(10));
  EXPECT_TRUE(absl::StrContains(job.message(), "was stopped")) << job.message();

  const std::string pipeline = Submit(
      "quick-pipeline",
      {{"kind", "pipeline"},
       {"stages", {{{"name", "sft"}, {"kind", "sft"}}, {{"name", "eval"}, {"kind", "eval"}}}}});
  const v1::LaunchTask sft = NextLaunch(raw);
  EXPECT_EQ(sft.task_id(), pipeline + ".s0.0.0");
  end(sft, v1::TASK_STATE_SUCCEEDED);
  const v1::LaunchTask eval = NextLaunch(raw);
  EXPECT_EQ(eval.task_id(), pipeline + ".s1.0.0");
  end(eval, v1::TASK_STATE_SUCCEEDED);
  WaitState(pipeline, v1::JOB_STATE_SUCCEEDED, absl::Seconds(10));

  // Two nodes: node rank 0 ends before reporting its rendezvous port, so node rank 1 is never
  // launched; the job fails saying so instead of waiting for ever.
  RawSession other(address_);
  ASSERT_TRUE(other.Send(Register("node-b", 2, "boot-b")));
  v1::CoordinatorMessage in;
  ASSERT_TRUE(other.Next(&in));
  ASSERT_TRUE(in.has_registered()) << in.DebugString();
  const std::string gang =
      Submit("quick-gang", {{"resources", {{"nodes", 2}, {"slots_per_node", 1}}}});
  const v1::LaunchTask first = NextLaunch(raw);
  ASSERT_EQ(first.node_rank(), 0) << first.DebugString();
  end(first, v1::TASK_STATE_SUCCEEDED);
  job = WaitState(gang, v1::JOB_STATE_FAILED, absl::Seconds(10));
  EXPECT_TRUE(absl::StrContains(job.message(), "ended before it reported its rendezvous port"))
      << job.message();
}

// Item 4: a rank that floods its output cannot fill the coordinator's disk. The coordinator stores
// a job's log text up to --max_job_log_bytes, says so once in the job's events, and counts what it
// dropped; the worker's rank log keeps every line.
TEST_F(TrustTest, AJobsStoredLogsStopAtItsCapAndTheWorkerKeepsThemAll) {
  ASSERT_NO_FATAL_FAILURE(StartWithMetrics({"--max_job_log_bytes", "4096"}));
  // 2000 lines of 100 bytes: 200 kB, of which 4 kB are stored.
  StartWorker("node-a", 1,
              Script("flood.sh",
                     "i=0\nwhile [ $i -lt 2000 ]; do\n  printf '%099d\\n' $i\n"
                     "  i=$((i+1))\ndone\n"));
  ASSERT_TRUE(WaitFor([&] { return NodeReady("node-a"); }, absl::Seconds(20))) << Logs();
  const std::string id = Submit("flood");
  WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(30));

  int64_t stored = 0;
  const std::vector<v1::LogLine> lines = StoredLogs(id);
  for (const v1::LogLine& l : lines) stored += static_cast<int64_t>(l.text().size());
  EXPECT_LE(stored, 4096);
  EXPECT_EQ(lines.size(), 4096u / 99);  // every line is 99 bytes without its newline
  int warnings = 0;
  for (const v1::JobEvent& e : Events(id)) {
    if (e.has_warning() &&
        absl::StrContains(e.warning().message(), "reached the coordinator's cap of 4096 bytes")) {
      ++warnings;
    }
  }
  EXPECT_EQ(warnings, 1);
  const std::string scraped = Metrics();
  EXPECT_TRUE(absl::StrContains(
      scraped, absl::StrCat("trainctl_log_lines_dropped_total ", 2000 - 4096 / 99)))
      << scraped;
  // The worker's own rank log has all 2000 lines.
  const std::string rank_log =
      testing::ReadFileOrEmpty(WorkDir("node-a") + "/tasks/" + id + ".0.0/rank-0.log");
  EXPECT_EQ(std::count(rank_log.begin(), rank_log.end(), '\n'), 2000) << rank_log.size();
}

// Item 4, the worker's side: a rank's output reaches the coordinator at --rank_log_rate after a
// burst; the rest stays in the rank's log file, which itself stops at --max_rank_log_bytes. The
// job's stream says how many lines were held back, and its events say it once.
TEST_F(TrustTest, ARanksForwardedOutputIsRateLimitedAndItsLogFileBounded) {
  StartCoordinator();
  // 2000 lines of 99 characters and a newline.
  StartWorker(
      "node-a", 1,
      Script("flood.sh",
             "i=0\nwhile [ $i -lt 2000 ]; do\n  printf '%099d\\n' $i\n"
             "  i=$((i+1))\ndone\n"),
      {"--rank_log_rate", "1", "--rank_log_burst", "65536", "--max_rank_log_bytes", "100000"});
  ASSERT_TRUE(WaitFor([&] { return NodeReady("node-a"); }, absl::Seconds(20))) << Logs();
  const std::string id = Submit("flood");
  WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(30));

  const std::vector<v1::LogLine> lines = StoredLogs(id);
  const size_t forwarded = 65536 / 99;  // the burst; 1 byte/s adds no line within the test
  ASSERT_EQ(lines.size(), forwarded + 1);
  EXPECT_EQ(lines.back().stream(), "stderr");
  EXPECT_TRUE(absl::StrContains(
      lines.back().text(),
      absl::StrCat(2000 - forwarded, " lines (", (2000 - forwarded) * 99,
                   " bytes) of rank 0's output were not sent to the coordinator")))
      << lines.back().text();
  int warnings = 0;
  for (const v1::JobEvent& e : Events(id)) {
    warnings += e.has_warning() &&
                absl::StrContains(e.warning().message(), "writes faster than the worker forwards");
  }
  EXPECT_EQ(warnings, 1);
  // The file keeps 1000 whole lines (100000 bytes), then says why it stops.
  const std::string rank_log =
      testing::ReadFileOrEmpty(WorkDir("node-a") + "/tasks/" + id + ".0.0/rank-0.log");
  EXPECT_EQ(std::count(rank_log.begin(), rank_log.end(), '\n'), 1001) << rank_log.size();
  EXPECT_TRUE(absl::StrContains(rank_log, "reached the worker's --max_rank_log_bytes (100000"))
      << rank_log.substr(rank_log.size() > 300 ? rank_log.size() - 300 : 0);
}

}  // namespace
}  // namespace trainctl
