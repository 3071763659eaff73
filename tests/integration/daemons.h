// What the integration tests that run the real coordinator and workers ask of them: a job's state
// (waiting for one, with the daemons' logs when it never comes), its stored log lines and events.
#ifndef TRAINCTL_TESTS_INTEGRATION_DAEMONS_H_
#define TRAINCTL_TESTS_INTEGRATION_DAEMONS_H_

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/time/time.h"
#include "cli/job_client.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace trainctl::testing {

// `dir`/coordinator.log and `dir`/worker-NAME.log of every worker, the last `max_bytes` of them.
inline std::string DaemonLogs(const std::string& dir,
                              const std::map<std::string, std::unique_ptr<Subprocess>>& workers,
                              size_t max_bytes = 20000) {
  std::string out = "--- coordinator\n" + ReadFileOrEmpty(dir + "/coordinator.log");
  for (const auto& [name, w] : workers) {
    out += "--- worker " + name + "\n" + ReadFileOrEmpty(dir + "/worker-" + name + ".log");
  }
  return out.size() > max_bytes ? out.substr(out.size() - max_bytes) : out;
}

// The job, or an empty one when the coordinator does not answer.
inline trainctl::v1::Job GetJob(cli::JobClient& client, const std::string& id) {
  auto job = client.Get(id);
  return job.ok() ? *job : trainctl::v1::Job();
}

// Waits for the job to reach `state`; on timeout the test fails with `logs`.
inline trainctl::v1::Job WaitJobState(cli::JobClient& client, const std::string& id,
                                      trainctl::v1::JobState state, absl::Duration timeout,
                                      const std::function<std::string()>& logs) {
  trainctl::v1::Job job;
  const bool ok = WaitFor(
      [&] {
        job = GetJob(client, id);
        return job.state() == state;
      },
      timeout);
  EXPECT_TRUE(ok) << id << " is " << trainctl::v1::JobState_Name(job.state()) << " ("
                  << job.message() << "), wanted " << trainctl::v1::JobState_Name(state) << "\n"
                  << logs();
  return job;
}

// Whether exactly one node is registered with the coordinator behind `client`, and it is ready.
inline bool OneNodeReady(cli::JobClient& client) {
  auto nodes = client.ListNodes();
  return nodes.ok() && nodes->nodes_size() == 1 && nodes->nodes(0).state() == "ready";
}

inline std::vector<trainctl::v1::LogLine> StoredLogs(cli::JobClient& client,
                                                     const std::string& id) {
  std::vector<trainctl::v1::LogLine> lines;
  trainctl::v1::StreamLogsRequest request;
  request.set_id(id);
  EXPECT_TRUE(
      client.Logs(request, [&](const trainctl::v1::LogLine& l) { lines.push_back(l); }).ok());
  return lines;
}

// Every event of the job so far (a replay, not a watch).
inline std::vector<trainctl::v1::JobEvent> JobEvents(cli::JobClient& client,
                                                     const std::string& id) {
  std::vector<trainctl::v1::JobEvent> events;
  trainctl::v1::WatchJobRequest request;
  request.set_id(id);
  request.set_replay_only(true);
  EXPECT_TRUE(
      client.Watch(request, [&](const trainctl::v1::JobEvent& e) { events.push_back(e); }).ok());
  return events;
}

// The real coordinator and workers of one test, the client that talks to them, and what tests ask
// of them. A fixture derives from it, starts the daemons (StartCoordinator and StartWorker, or its
// own way), says where their logs are (daemon_dir()/coordinator.log, daemon_dir()/worker-NAME.log)
// and calls StopDaemons() in its destructor, before its temporary directory goes. Its test defines
// TRAINCTL_COORDINATOR_BIN and TRAINCTL_WORKER_BIN.
class Daemons {
 public:
  virtual ~Daemons() = default;

 protected:
  virtual std::string daemon_dir() const = 0;

  // Starts (or restarts, on the same address) the coordinator over daemon_dir()/var/trainctl.db,
  // leases of 3 s, `extra` flags last; once it serves, address_ and client_ talk to it. Fails the
  // test (a fatal failure) when it does not come up within 30 s.
  void StartCoordinator(const std::vector<std::string>& extra = {}) {
    const std::string ready = daemon_dir() + "/ready";
    std::filesystem::remove(ready);
    std::vector<std::string> argv = {TRAINCTL_COORDINATOR_BIN,
                                     "--listen",
                                     address_.empty() ? "127.0.0.1:0" : address_,
                                     "--db",
                                     daemon_dir() + "/var/trainctl.db",
                                     "--ready_file",
                                     ready,
                                     "--lease_timeout",
                                     "3s",
                                     "--db_sync",
                                     "normal"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    coordinator_ = std::make_unique<Subprocess>(argv, daemon_dir() + "/coordinator.log");
    ASSERT_TRUE(WaitFor([&] { return std::filesystem::exists(ready); }, absl::Seconds(30)))
        << ReadFileOrEmpty(daemon_dir() + "/coordinator.log");
    address_ = std::string(absl::StripAsciiWhitespace(ReadFileOrEmpty(ready)));
    client_ = std::make_unique<cli::JobClient>(address_);
  }

  // The command line of worker NAME of the coordinator at address_: its work dir
  // daemon_dir()/work-NAME, heartbeats every 300 ms, reconnects within 1 s, ranks that run
  // `trainer`, no nvidia-smi (a CPU node); `extra` flags last.
  std::vector<std::string> WorkerArgv(const std::string& name, const std::string& trainer,
                                      const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> argv = {TRAINCTL_WORKER_BIN,
                                     "--coordinator",
                                     address_,
                                     "--node_name",
                                     name,
                                     "--work_dir",
                                     daemon_dir() + "/work-" + name,
                                     "--heartbeat_interval",
                                     "300ms",
                                     "--reconnect_max",
                                     "1s",
                                     "--trainer",
                                     trainer,
                                     "--nvidia_smi",
                                     "/nonexistent/nvidia-smi"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  }
  // Starts that worker (WorkerArgv) as workers_[name], logging to daemon_dir()/worker-NAME.log;
  // a worker of that name already there is stopped once the new one has started.
  Subprocess& StartWorker(const std::string& name, const std::string& trainer,
                          const std::vector<std::string>& extra = {}) {
    workers_[name] = std::make_unique<Subprocess>(WorkerArgv(name, trainer, extra),
                                                  daemon_dir() + "/worker-" + name + ".log");
    return *workers_[name];
  }

  // Workers first, then the coordinator.
  void StopDaemons() {
    workers_.clear();
    coordinator_.reset();
  }

  trainctl::v1::Job Get(const std::string& id) { return GetJob(*client_, id); }
  // Waits for the job to reach `state`; on timeout the test fails with the daemons' logs.
  trainctl::v1::Job WaitState(const std::string& id, trainctl::v1::JobState state,
                              absl::Duration timeout) {
    return WaitJobState(*client_, id, state, timeout, [this] { return Logs(); });
  }
  std::string Logs() { return DaemonLogs(daemon_dir(), workers_); }
  std::vector<trainctl::v1::LogLine> StoredLogs(const std::string& id) {
    return testing::StoredLogs(*client_, id);
  }
  std::vector<trainctl::v1::JobEvent> Events(const std::string& id) {
    return JobEvents(*client_, id);
  }

  std::unique_ptr<Subprocess> coordinator_;
  std::map<std::string, std::unique_ptr<Subprocess>> workers_;
  std::string address_;
  std::unique_ptr<cli::JobClient> client_;
};

}  // namespace trainctl::testing

#endif  // TRAINCTL_TESTS_INTEGRATION_DAEMONS_H_
