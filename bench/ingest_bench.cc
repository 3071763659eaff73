// ingest_bench: what the coordinator stores of what workers report, against SQLite itself, in one
// run on loopback. The real trainctl-coordinator (a subprocess, fresh database) and simulated
// workers speaking the worker protocol (tests/integration/ingest_load.h):
//   (a) one worker, one rank printing as fast as the coordinator takes it: log lines/s stored; then
//       metric events as fast as it takes them: events/s stored. Each against a bare SQLite insert
//       loop on its own file with the same schema (the store's migrations) and synchronous setting,
//       1,000 rows per transaction, and the ratio.
//   (b) the scale: --workers x --ranks ranks each printing --lines_per_second, with a
//       metric event per job and a --topology_bytes JSON event per rank every --step: ingest rate,
//       ListJobs/ListNodes p50/p99 and lease misses.
#include <stdlib.h>  // mkdtemp

#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "coordinator/internal/sqlite.h"
#include "coordinator/sqlite_job_store.h"
#include "tests/integration/ingest_load.h"
#include "tests/testing/subprocess.h"

ABSL_FLAG(std::string, sync, "full", "SQLite synchronous mode of the coordinator and the floors");
ABSL_FLAG(int, seconds, 10, "length of each load");
ABSL_FLAG(int, workers, 8, "(b) simulated workers");
ABSL_FLAG(int, ranks, 8, "(b) ranks per worker");
ABSL_FLAG(int, lines_per_second, 5000, "(b) lines each rank prints per second");
ABSL_FLAG(int, step_ms, 100, "(b) one training step: a metric event per job, a topology per rank");
ABSL_FLAG(int, topology_bytes, 4096, "(b) size of each rank's topology event (0: none)");

namespace trainctl::bench {
namespace {

namespace fs = std::filesystem;
using testing::IngestLoad;
using testing::IngestReport;

struct Coordinator {
  std::unique_ptr<testing::Subprocess> process;
  std::string address;
};

Coordinator StartCoordinator(const std::string& dir) {
  fs::create_directories(dir);
  const std::string ready = dir + "/ready";
  Coordinator c;
  c.process = std::make_unique<testing::Subprocess>(
      std::vector<std::string>{TRAINCTL_COORDINATOR_BIN, "--listen", "127.0.0.1:0", "--db",
                               dir + "/trainctl.db", "--ready_file", ready, "--db_sync",
                               absl::GetFlag(FLAGS_sync), "--log_level", "warning"},
      dir + "/coordinator.log");
  if (!testing::WaitFor([&] { return fs::exists(ready); }, absl::Seconds(30))) {
    std::cerr << "coordinator did not start:\n"
              << testing::ReadFileOrEmpty(dir + "/coordinator.log");
    std::exit(1);
  }
  c.address = std::string(absl::StripAsciiWhitespace(testing::ReadFileOrEmpty(ready)));
  return c;
}

IngestReport Load(const std::string& dir, const IngestLoad& load) {
  Coordinator c = StartCoordinator(dir);
  IngestReport r = testing::RunIngestLoad(c.address, load);
  if (!r.problems.empty()) std::cerr << "problems: " << r.problems << "\n";
  return r;
}

// Rows/s of a bare insert loop into `table` of a store-made database (same schema and sync).
double Floor(const std::string& dir, bool logs, double seconds) {
  fs::create_directories(dir);
  SqliteJobStore::Options options;
  options.path = dir + "/floor.db";
  options.synchronous_full = absl::GetFlag(FLAGS_sync) == "full";
  {
    auto store = SqliteJobStore::Open(options);
    Job job;
    job.mutable_spec()->set_name("floor");
    job.set_state(trainctl::v1::JOB_STATE_PENDING);
    if (!store.ok() || !(*store)->CreateJob(job, "", {}).ok()) std::exit(1);
  }
  auto db = sqlite::Db::Open(options.path).value();
  (void)db->Exec("PRAGMA journal_mode = WAL");
  (void)db->Exec(options.synchronous_full ? "PRAGMA synchronous = FULL"
                                          : "PRAGMA synchronous = NORMAL");
  const std::string text(60, 'x');
  trainctl::v1::JobEvent event;
  event.mutable_metric()->set_step(1);
  (*event.mutable_metric()->mutable_values())["loss"] = 0.5;
  const std::string blob = event.SerializeAsString();
  auto insert =
      db->PrepareCached(logs ? "INSERT INTO log_lines(job_id, rank, stream, time_us, text) "
                               "VALUES(1, 0, 'stdout', 1, ?)"
                             : "INSERT INTO job_events(job_id, kind, event) VALUES(1, 'metric', ?)")
          .value();
  int64_t rows = 0;
  const absl::Time start = absl::Now();
  while (absl::Now() - start < absl::Seconds(seconds)) {
    (void)db->ExecCached("BEGIN IMMEDIATE");
    for (int i = 0; i < 1000; ++i, ++rows) {
      insert->Reset();
      if (logs) {
        (void)insert->Bind(1, text).Run();
      } else {
        (void)insert->BindBlob(1, blob).Run();
      }
    }
    (void)db->ExecCached("COMMIT");
  }
  return static_cast<double>(rows) / absl::ToDoubleSeconds(absl::Now() - start);
}

int Main() {
  char tmpl[] = "/tmp/ingest_bench.XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const int seconds = absl::GetFlag(FLAGS_seconds);
  std::cout << absl::StrFormat("ingest_bench: synchronous=%s, %d s per load, dir %s\n",
                               absl::GetFlag(FLAGS_sync), seconds, dir);

  IngestLoad lines;  // (a) lines: one worker, one rank, far more than it can take
  lines.workers = 1;
  lines.ranks = 1;
  lines.lines_per_second = 2'000'000;
  lines.step = absl::Milliseconds(10);
  lines.line_bytes = 100;
  lines.topology_bytes = 0;
  lines.duration = absl::Seconds(seconds);
  const IngestReport a_lines = Load(dir + "/a-lines", lines);
  const double lines_rate = static_cast<double>(a_lines.lines_stored) / a_lines.seconds;
  const double lines_floor = Floor(dir + "/floor-lines", true, 3);

  IngestLoad events = lines;  // (a) events: metric events back to back
  events.lines_per_second = 0;
  events.step = absl::ZeroDuration();
  const IngestReport a_events = Load(dir + "/a-events", events);
  const double events_rate = static_cast<double>(a_events.steps_stored) / a_events.seconds;
  const double events_floor = Floor(dir + "/floor-events", false, 3);

  std::cout << absl::StrFormat(
      "(a) one worker\n"
      "  log lines stored      %10.0f /s  (%lld of %lld sent)\n"
      "  bare SQLite inserts   %10.0f /s  (log_lines, 1000 per transaction)\n"
      "  ratio                 %10.2f\n"
      "  metric events stored  %10.0f /s  (%lld of %lld sent)\n"
      "  bare SQLite inserts   %10.0f /s  (job_events, 1000 per transaction)\n"
      "  ratio                 %10.2f\n",
      lines_rate, a_lines.lines_stored, a_lines.lines_sent, lines_floor, lines_rate / lines_floor,
      events_rate, a_events.steps_stored, a_events.metric_events_sent, events_floor,
      events_rate / events_floor);

  IngestLoad scale;  // (b)
  scale.workers = absl::GetFlag(FLAGS_workers);
  scale.ranks = absl::GetFlag(FLAGS_ranks);
  scale.lines_per_second = absl::GetFlag(FLAGS_lines_per_second);
  scale.step = absl::Milliseconds(absl::GetFlag(FLAGS_step_ms));
  scale.topology_bytes = absl::GetFlag(FLAGS_topology_bytes);
  scale.duration = absl::Seconds(seconds);
  const IngestReport b = Load(dir + "/b", scale);
  const double planned =
      static_cast<double>(scale.workers) * scale.ranks * scale.lines_per_second * seconds;
  std::cout << absl::StrFormat(
      "(b) %d workers x %d ranks x %d lines/s, metric + %d-byte topology events every %d ms\n"
      "  lines sent            %10lld  (%.0f%% of the %.0f planned)\n"
      "  lines stored          %10lld  (%.0f /s over %.1f s, until the last was acknowledged)\n"
      "  events sent           %10lld  (%lld metric, %lld topology); steps stored %lld of %lld\n"
      "  ListJobs  p50/p99/max %.1f / %.1f / %.1f ms (%lld calls)\n"
      "  ListNodes p50/p99/max %.1f / %.1f / %.1f ms\n"
      "  lease misses          %10zu  %s\n",
      scale.workers, scale.ranks, scale.lines_per_second, scale.topology_bytes,
      absl::GetFlag(FLAGS_step_ms), b.lines_sent, 100.0 * b.lines_sent / planned, planned,
      b.lines_stored, b.lines_stored / b.seconds, b.seconds,
      b.metric_events_sent + b.topology_events_sent, b.metric_events_sent, b.topology_events_sent,
      b.steps_stored, b.steps_sent, b.list_jobs.p50_ms, b.list_jobs.p99_ms, b.list_jobs.max_ms,
      b.list_jobs.count, b.list_nodes.p50_ms, b.list_nodes.p99_ms, b.list_nodes.max_ms,
      b.lost_nodes.size(), absl::StrJoin(b.lost_nodes, ", "));
  fs::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace trainctl::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return trainctl::bench::Main();
}
