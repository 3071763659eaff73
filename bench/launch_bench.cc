// launch_bench: submit -> all ranks running, against forking/exec'ing the same ranks directly.
//
// Starts the real trainctl-coordinator (SQLite file, full fsync) and one trainctl-worker with 2 CPU
// slots, then --jobs times: submits a 2-rank job whose ranks are trainctl-trainer, and times from
// the SubmitJob call to the `running` state change on a WatchJob stream (every rank exec'd and
// reported). The peer, measured in the same run and interleaved: fork+exec of the same 2 trainer
// processes from this process, timed until both have exec'd (a CLOEXEC pipe closes). The ranks'
// spec points at data that does not exist, so each job ends quickly (failed) and frees its slots.
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "cli/job_client.h"
#include "common/job_spec.h"

ABSL_FLAG(int, jobs, 20, "measured submissions (and as many direct launches)");

namespace {

namespace fs = std::filesystem;
namespace v1 = trainctl::v1;
using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

pid_t Spawn(const std::vector<std::string>& argv, const std::string& log) {
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

// Fork+exec `n` copies of `bin`; returns the time until all have exec'd.
Clock::duration DirectLaunch(const std::string& bin, int n) {
  std::vector<pid_t> pids;
  std::vector<int> fds;
  const auto start = Clock::now();
  for (int i = 0; i < n; ++i) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return {};
    const pid_t pid = fork();
    if (pid == 0) {
      const int null = open("/dev/null", O_WRONLY);
      dup2(null, 1);
      dup2(null, 2);
      execl(bin.c_str(), bin.c_str(), "--version-probe", static_cast<char*>(nullptr));
      _exit(127);
    }
    close(p[1]);
    pids.push_back(pid);
    fds.push_back(p[0]);
  }
  for (int fd : fds) {
    char c;
    while (read(fd, &c, 1) > 0) {
    }
    close(fd);
  }
  const auto took = Clock::now() - start;
  for (pid_t pid : pids) waitpid(pid, nullptr, 0);
  return took;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The real daemons in `dir`: a coordinator (SQLite file, full fsync) and one worker with 2 CPU
// slots whose trainer is trainctl-trainer.
struct Daemons {
  std::string dir;
  std::string address;  // the coordinator's
  pid_t coordinator = 0;
  pid_t worker = 0;
};

// Starts the coordinator, waits (up to ~6 s) for its ready file, then starts the worker.
Daemons StartDaemons() {
  Daemons d;
  char tmpl[] = "/tmp/launch_bench.XXXXXX";
  d.dir = mkdtemp(tmpl);
  const std::string& dir = d.dir;
  const std::string ready = dir + "/ready";
  d.coordinator = Spawn({TRAINCTL_COORDINATOR_BIN, "--listen", "127.0.0.1:0", "--db",
                         dir + "/trainctl.db", "--ready_file", ready, "--log_level", "warning"},
                        dir + "/coordinator.log");
  for (int i = 0; i < 300 && !fs::exists(ready); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::getline(std::ifstream(ready), d.address);
  d.worker = Spawn({TRAINCTL_WORKER_BIN, "--coordinator", d.address, "--node_name", "bench",
                    "--slots", "2", "--work_dir", dir + "/work", "--output_roots", dir, "--trainer",
                    TRAINCTL_TRAINER_BIN, "--nvidia_smi", "/nonexistent", "--log_level", "warning"},
                   dir + "/worker.log");
  return d;
}

// Waits (up to ~10 s) for the worker's node to be ready.
void WaitNodeReady(trainctl::cli::JobClient& client) {
  for (int i = 0; i < 500; ++i) {
    auto nodes = client.ListNodes();
    if (nodes.ok() && nodes->nodes_size() == 1 && nodes->nodes(0).state() == "ready") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// A 2-rank SFT job on one node whose data does not exist, so that it fails quickly.
v1::JobSpec BenchSpec(const std::string& dir) {
  v1::JobSpec spec;
  spec.set_name("launch-bench");
  spec.set_kind(v1::JOB_KIND_SFT);
  spec.set_model_name_or_path("tiny");
  spec.set_data_path(dir + "/no-such-shards");
  spec.set_output_dir(dir + "/out");
  spec.mutable_resources()->set_nodes(1);
  spec.mutable_resources()->set_slots_per_node(2);
  return spec;
}

// Milliseconds from the SubmitJob call to the `running` state change on a WatchJob stream (the
// stream is read to the job's end); -1, with the reason on stderr, when the submit fails or the
// job never ran.
double SubmitToRunningMs(trainctl::cli::JobClient& client, const v1::JobSpec& spec,
                         const std::string& dir) {
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  const auto start = Clock::now();
  auto submitted = client.Submit(request);
  if (!submitted.ok()) {
    absl::FPrintF(stderr, "submit: %s\n", submitted.status().ToString());
    return -1;
  }
  double running = -1;
  bool ended = false;
  v1::WatchJobRequest watch;
  watch.set_id(submitted->job().id());
  auto s = client.Watch(watch, [&](const v1::JobEvent& e) {
    if (!e.has_state_change()) return;
    if (e.state_change().to() == v1::JOB_STATE_RUNNING && running < 0) {
      running = Ms(Clock::now() - start);
    }
    ended = ended || e.state_change().to() == v1::JOB_STATE_FAILED ||
            e.state_change().to() == v1::JOB_STATE_SUCCEEDED;
  });
  if (running < 0) {
    absl::FPrintF(stderr, "job %s never ran (%s); see %s\n", submitted->job().id(), s.ToString(),
                  dir);
  }
  return running;
}

// SIGTERM to `pid`, then waits for it.
void Stop(pid_t pid) {
  kill(pid, SIGTERM);
  waitpid(pid, nullptr, 0);
}

// The medians of both, the spread of the submissions, and their ratio.
void PrintResults(int jobs, const std::vector<double>& submit_ms,
                  const std::vector<double>& direct_ms) {
  const double submit = Median(submit_ms), direct = Median(direct_ms);
  absl::PrintF("launch_bench: %d jobs of 2 ranks (trainctl-trainer) on one worker, 2 CPU slots\n",
               jobs);
  absl::PrintF("  submit -> all ranks running (median)   %8.2f ms   (min %.2f, max %.2f)\n", submit,
               *std::min_element(submit_ms.begin(), submit_ms.end()),
               *std::max_element(submit_ms.begin(), submit_ms.end()));
  absl::PrintF("  fork+exec of the same 2 ranks (median) %8.2f ms\n", direct);
  absl::PrintF(
      "  ratio submit/direct                    %8.1fx   (+%.2f ms of scheduling, RPCs, fsyncs)\n",
      submit / std::max(1e-6, direct), submit - direct);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const Daemons daemons = StartDaemons();
  trainctl::cli::JobClient client(daemons.address);
  WaitNodeReady(client);
  const v1::JobSpec spec = BenchSpec(daemons.dir);

  // Interleaved: a direct launch, then a submission, --jobs times.
  std::vector<double> submit_ms, direct_ms;
  const int jobs = absl::GetFlag(FLAGS_jobs);
  for (int i = 0; i < jobs + 1; ++i) {  // the first of each is a warm-up
    const double direct = Ms(DirectLaunch(TRAINCTL_TRAINER_BIN, 2));
    const double running = SubmitToRunningMs(client, spec, daemons.dir);
    if (running < 0) return 1;
    if (i == 0) continue;
    submit_ms.push_back(running);
    direct_ms.push_back(direct);
  }
  Stop(daemons.worker);
  Stop(daemons.coordinator);

  PrintResults(jobs, submit_ms, direct_ms);
  fs::remove_all(daemons.dir);
  return 0;
}
