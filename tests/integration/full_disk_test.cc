// The coordinator's database on a filesystem that fills up while a job runs (a small tmpfs, which
// the test mounts: it needs root, as the network-namespace tests do). The real coordinator, a real
// worker and fake ranks (tests/integration/fake_rank.cc): nothing the coordinator acknowledged may
// be lost, a submit says the storage is full, and once space returns everything the worker still
// held is stored and the job ends as its ranks did.
#include <errno.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cli/job_client.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/daemons.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace trainctl {
namespace {

namespace fs = std::filesystem;
namespace v1 = trainctl::v1;
using testing::RunResult;
using testing::Subprocess;
using testing::WaitFor;

constexpr int kLines = 300;

// The time stamp ("1130 23:31:27.493568") of the first log line after `after` that holds `needle`;
// "" if none.
std::string LineTime(const std::string& log, const std::string& needle,
                     const std::string& after = "") {
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    if (line.size() < 21 || !absl::StrContains(line, needle)) continue;
    const std::string time(line.substr(1, 20));
    if (time > after) return time;
  }
  return "";
}

class FullDiskTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(db_dir_);
    ASSERT_EQ(mount("tmpfs", db_dir_.c_str(), "tmpfs", 0, "size=16m"), 0)
        << "mounting a 16 MiB tmpfs at " << db_dir_
        << " (this test needs root): " << std::strerror(errno);
    mounted_ = true;
  }
  void TearDown() override {
    worker_.reset();
    coordinator_.reset();
    if (mounted_) umount2(db_dir_.c_str(), MNT_DETACH);
  }

  void StartDaemons() {
    const std::string ready = dir_.path() + "/ready";
    coordinator_ = std::make_unique<Subprocess>(
        std::vector<std::string>{TRAINCTL_COORDINATOR_BIN, "--listen", "127.0.0.1:0", "--db",
                                 db_dir_ + "/trainctl.db", "--ready_file", ready, "--lease_timeout",
                                 "5s", "--db_sync", "normal"},
        dir_.path() + "/coordinator.log");
    ASSERT_TRUE(WaitFor([&] { return fs::exists(ready); }, absl::Seconds(30))) << Logs();
    address_ = std::string(absl::StripAsciiWhitespace(testing::ReadFileOrEmpty(ready)));
    client_ = std::make_unique<cli::JobClient>(address_);
    worker_ = std::make_unique<Subprocess>(
        std::vector<std::string>{TRAINCTL_WORKER_BIN, "--coordinator", address_, "--node_name",
                                 "node-a", "--work_dir", dir_.path() + "/work", "--slots", "1",
                                 "--heartbeat_interval", "300ms", "--reconnect_max", "500ms",
                                 "--trainer", FAKE_RANK_BIN, "--nvidia_smi",
                                 "/nonexistent/nvidia-smi", "--output_roots", dir_.path()},
        dir_.path() + "/worker.log");
    ASSERT_TRUE(WaitFor([&] { return testing::OneNodeReady(*client_); }, absl::Seconds(20)))
        << Logs();
  }

  // Writes a file until the filesystem refuses another byte.
  void FillDisk() {
    const int fd = open(filler_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    const std::string block(4096, 'f');
    while (write(fd, block.data(), block.size()) > 0) {
    }
    const int err = errno;
    while (write(fd, block.data(), 1) > 0) {
    }
    close(fd);
    ASSERT_EQ(err, ENOSPC) << std::strerror(err);
  }
  void FreeDisk() { fs::remove(filler_); }

  RunResult Trainctl(std::vector<std::string> args) {
    args.insert(args.begin(), TRAINCTL_CLI_BIN);
    return testing::Run(args, {{"TRAINCTL_COORDINATOR", address_}});
  }

  std::string SpecFile(const std::string& name, int lines) {
    nlohmann::json spec = {
        {"kind", "sft"},
        {"name", name},
        {"model_name_or_path", "tiny"},
        {"data_path", dir_.path() + "/data"},
        {"output_dir", dir_.path() + "/out-" + name},
        {"env", {{"TRAINCTL_FAKE_LINES", absl::StrCat(lines)}, {"TRAINCTL_FAKE_PERIOD_MS", "10"}}}};
    return dir_.Write(name + ".json", spec.dump());
  }

  std::string Logs() {
    std::string files = "--- " + db_dir_ + "\n";
    for (const auto& entry : fs::directory_iterator(db_dir_)) {
      absl::StrAppend(&files, entry.path().filename().string(), " ", entry.file_size(), "\n");
    }
    return files + "--- coordinator\n" +
           testing::ReadFileOrEmpty(dir_.path() + "/coordinator.log") + "--- worker\n" +
           testing::ReadFileOrEmpty(dir_.path() + "/worker.log");
  }

  v1::Job Get(const std::string& id) {
    auto job = client_->Get(id);
    return job.ok() ? *job : v1::Job();
  }

  testing::TempDir dir_;
  const std::string db_dir_ = dir_.path() + "/db";
  const std::string filler_ = db_dir_ + "/filler";
  bool mounted_ = false;
  std::unique_ptr<Subprocess> coordinator_;
  std::unique_ptr<Subprocess> worker_;
  std::string address_;
  std::unique_ptr<cli::JobClient> client_;
};

TEST_F(FullDiskTest, NothingAcknowledgedIsLostAndTheJobEndsOnceSpaceReturns) {
  StartDaemons();
  // The rank prints for ~3 s; the disk fills as soon as the job runs, well before its end.
  RunResult submit = Trainctl({"submit", SpecFile("full", kLines), "-o", "json"});
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const std::string id = nlohmann::json::parse(submit.out)["id"];
  ASSERT_TRUE(WaitFor([&] { return Get(id).state() == v1::JOB_STATE_RUNNING; }, absl::Seconds(20)))
      << Logs();
  FillDisk();

  // A submit now is refused as what it is, not as a network failure.
  RunResult refused = Trainctl({"submit", SpecFile("refused", 1)});
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_TRUE(absl::StartsWith(refused.err, "trainctl: the coordinator's storage is full"))
      << refused.err;

  // The rank finishes while nothing can be stored: its logs, metrics and final status stay with the
  // worker, which keeps sending them; the job is ended by nothing but them.
  const std::string coordinator_log = dir_.path() + "/coordinator.log";
  std::string ended;  // when the worker saw its task end (the time stamp of its log line)
  ASSERT_TRUE(WaitFor(
      [&] {
        ended = LineTime(testing::ReadFileOrEmpty(dir_.path() + "/worker.log"),
                         "ended: TASK_STATE_SUCCEEDED");
        return !ended.empty();
      },
      absl::Seconds(30)))
      << Logs();
  // A store failure after that: the coordinator has had the task's status in its hands.
  ASSERT_TRUE(WaitFor(
      [&] {
        return LineTime(testing::ReadFileOrEmpty(coordinator_log), "disk is full", ended) > "";
      },
      absl::Seconds(30)))
      << Logs();
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  EXPECT_NE(testing::ReadFileOrEmpty(coordinator_log).find("not stored, so not acknowledged"),
            std::string::npos);

  FreeDisk();
  ASSERT_TRUE(
      WaitFor([&] { return Get(id).state() == v1::JOB_STATE_SUCCEEDED; }, absl::Seconds(30)))
      << v1::JobState_Name(Get(id).state()) << "\n"
      << Logs();
  const v1::Job job = Get(id);
  EXPECT_EQ(job.progress().step(), kLines);

  std::set<std::string> stored;
  v1::StreamLogsRequest request;
  request.set_id(id);
  ASSERT_TRUE(client_->Logs(request, [&](const v1::LogLine& l) { stored.insert(l.text()); }).ok());
  for (int i = 0; i < kLines; ++i) {
    EXPECT_TRUE(stored.count(absl::StrCat("rank 0 line ", i))) << "line " << i << " lost";
  }
  std::set<int64_t> steps;
  v1::WatchJobRequest watch;
  watch.set_id(id);
  watch.set_replay_only(true);
  ASSERT_TRUE(client_
                  ->Watch(watch,
                          [&](const v1::JobEvent& e) {
                            if (e.has_metric()) steps.insert(e.metric().step());
                          })
                  .ok());
  EXPECT_EQ(steps.size(), static_cast<size_t>(kLines));

  // And the coordinator takes new work again.
  RunResult again = Trainctl({"submit", SpecFile("again", 1)});
  EXPECT_EQ(again.exit_code, 0) << again.err;
}

}  // namespace
}  // namespace trainctl
