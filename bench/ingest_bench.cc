// ingest_bench: what the coordinator stores of what workers report, against the store's engine
// itself, in one run on loopback. The real trainctl-coordinator (a subprocess, fresh database:
// --store sqlite, a file; --store postgres, a database on a PostgreSQL test server started for the
// run, fsync=off) and simulated workers speaking the worker protocol
// (tests/integration/ingest_load.h):
//   (a) one worker, one rank printing as fast as the coordinator takes it: log lines/s stored; then
//       metric events as fast as it takes them: events/s stored. Each against a bare insert loop
//       on its own database with the same schema (the store's migrations) and durability, 1,000
//       rows per transaction (PostgreSQL: log lines in PostgresJobStore's multi-row INSERTs), and
//       the ratio.
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
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "coordinator/internal/pg.h"
#include "coordinator/internal/sqlite.h"
#include "coordinator/postgres_job_store.h"
#include "coordinator/sqlite_job_store.h"
#include "tests/integration/ingest_load.h"
#include "tests/testing/postgres_server.h"
#include "tests/testing/subprocess.h"

ABSL_FLAG(std::string, store, "sqlite",
          "sqlite (a fresh file) | postgres (a fresh database per load on a PostgreSQL test "
          "server started for the run, fsync=off)");
ABSL_FLAG(std::string, sync, "full",
          "SQLite synchronous mode of the coordinator and the floors (sqlite only)");
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

[[noreturn]] void Fail(const std::string& what, const absl::Status& status) {
  std::cerr << "ingest_bench: " << what << ": " << status << "\n";
  std::exit(1);
}

// Where the coordinator's database and the floors' are: files in a load's directory, or fresh
// databases on one PostgreSQL test server.
class Target {
 public:
  explicit Target(bool postgres) {
    if (!postgres) return;
    absl::StatusOr<std::unique_ptr<testing::PostgresServer>> server =
        testing::PostgresServer::Start();
    if (!server.ok()) Fail("starting PostgreSQL", server.status());
    pg_ = std::move(*server);
  }
  bool postgres() const { return pg_ != nullptr; }
  const char* engine() const { return postgres() ? "Postgres" : "SQLite"; }

  // A fresh database for a load or a floor in `dir`: a file path or a postgresql:// URI.
  std::string NewDb(const std::string& dir, const std::string& file) const {
    fs::create_directories(dir);
    if (!postgres()) return dir + "/" + file;
    absl::StatusOr<std::string> uri = pg_->CreateDatabase();
    if (!uri.ok()) Fail("CREATE DATABASE", uri.status());
    return *uri;
  }

 private:
  std::unique_ptr<testing::PostgresServer> pg_;
};

struct Coordinator {
  std::unique_ptr<testing::Subprocess> process;
  std::string address;
};

// The coordinator's --max_job_log_bytes: high enough that (a), which offers far more than the
// default 64 MiB per job, measures lines stored rather than lines dropped at the cap.
constexpr char kNoLogCap[] = "1099511627776";  // 1 TiB

Coordinator StartCoordinator(const std::string& dir, const std::string& db) {
  const std::string ready = dir + "/ready";
  Coordinator c;
  c.process = std::make_unique<testing::Subprocess>(
      std::vector<std::string>{TRAINCTL_COORDINATOR_BIN, "--listen", "127.0.0.1:0", "--db", db,
                               "--ready_file", ready, "--db_sync", absl::GetFlag(FLAGS_sync),
                               "--max_job_log_bytes", kNoLogCap, "--log_level", "warning"},
      dir + "/coordinator.log");
  if (!testing::WaitFor([&] { return fs::exists(ready); }, absl::Seconds(30))) {
    std::cerr << "coordinator did not start:\n"
              << testing::ReadFileOrEmpty(dir + "/coordinator.log");
    std::exit(1);
  }
  c.address = std::string(absl::StripAsciiWhitespace(testing::ReadFileOrEmpty(ready)));
  return c;
}

IngestReport Load(const Target& target, const std::string& dir, const IngestLoad& load) {
  Coordinator c = StartCoordinator(dir, target.NewDb(dir, "trainctl.db"));
  IngestReport r = testing::RunIngestLoad(c.address, load);
  if (!r.problems.empty()) std::cerr << "problems: " << r.problems << "\n";
  return r;
}

// The floors' rows: job 1's, a 60-byte stdout line or a serialized metric event.
const std::string& FloorText() {
  static const std::string* const text = new std::string(60, 'x');
  return *text;
}

std::string FloorEventBlob() {
  trainctl::v1::JobEvent event;
  event.mutable_metric()->set_step(1);
  (*event.mutable_metric()->mutable_values())["loss"] = 0.5;
  return event.SerializeAsString();
}

Job FloorJob() {
  Job job;
  job.mutable_spec()->set_name("floor");
  job.set_state(trainctl::v1::JOB_STATE_PENDING);
  return job;
}

// Rows/s of a bare insert loop into `table` of a store-made database (same schema and sync).
double SqliteFloor(const std::string& path, bool logs, double seconds) {
  SqliteJobStore::Options options;
  options.path = path;
  options.synchronous_full = absl::GetFlag(FLAGS_sync) == "full";
  {
    auto store = SqliteJobStore::Open(options);
    if (!store.ok() || !(*store)->CreateJob(FloorJob(), "", {}).ok()) std::exit(1);
  }
  auto db = sqlite::Db::Open(options.path).value();
  (void)db->Exec("PRAGMA journal_mode = WAL");
  (void)db->Exec(options.synchronous_full ? "PRAGMA synchronous = FULL"
                                          : "PRAGMA synchronous = NORMAL");
  const std::string blob = FloorEventBlob();
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
        (void)insert->Bind(1, FloorText()).Run();
      } else {
        (void)insert->BindBlob(1, blob).Run();
      }
    }
    (void)db->ExecCached("COMMIT");
  }
  return static_cast<double>(rows) / absl::ToDoubleSeconds(absl::Now() - start);
}

// `count` log lines of job 1 in one multi-row INSERT ... RETURNING seq, as PostgresJobStore's
// InsertLogChunk writes them.
absl::Status PgInsertLogChunk(pg::Conn& conn, int count) {
  std::string sql = "INSERT INTO log_lines(job_id, rank, stream, time_us, text) VALUES ";
  pg::Params params;
  for (int i = 0; i < count; ++i) {
    const int p = 5 * i;
    absl::StrAppend(&sql, i == 0 ? "" : ", ", "($", p + 1, ", $", p + 2, ", $", p + 3, ", $", p + 4,
                    ", $", p + 5, ")");
    params.Int(1).Int(0).Text("stdout").Int(1).Text(FloorText());
  }
  absl::StrAppend(&sql, " RETURNING seq");
  return conn.Query(sql, params).status();
}

// 1,000 rows in one transaction: log lines in chunks of 64, 32, ... 1 rows (InsertLogRows's
// split of 1,000: 15 x 64 + 32 + 8), or metric events one INSERT ... RETURNING seq each
// (InsertEventRows).
absl::Status PgInsertThousand(pg::Conn& conn, bool logs, const std::string& blob) {
  RETURN_IF_ERROR(conn.Exec("BEGIN"));
  int left = 1000;
  for (int chunk = 64; logs && chunk > 0; chunk /= 2) {
    for (; left >= chunk; left -= chunk) RETURN_IF_ERROR(PgInsertLogChunk(conn, chunk));
  }
  for (; !logs && left > 0; --left) {
    RETURN_IF_ERROR(conn.Query("INSERT INTO job_events(job_id, kind, event) VALUES($1, $2, $3) "
                               "RETURNING seq",
                               pg::Params().Int(1).Text("metric").Bytes(blob))
                        .status());
  }
  return conn.Exec("COMMIT");
}

// Rows/s of a bare insert loop over libpq into a store-made database (its schema, job 1), on a
// connection of its own with synchronous_commit = on as the store's.
double PgFloor(const std::string& uri, bool logs, double seconds) {
  {
    PostgresJobStore::Options options;
    options.uri = uri;
    auto store = PostgresJobStore::Open(options);
    if (!store.ok()) Fail("opening the floor's store", store.status());
    // Its writes need the lead, as trainctl-coordinator takes it (a lease longer than the floor).
    if (absl::Status s = (*store)->TryLead("ingest_bench", absl::Hours(1)); !s.ok()) {
      Fail("taking the floor's lead", s);
    }
    auto created = (*store)->CreateJob(FloorJob(), "", {});
    if (!created.ok()) Fail("creating the floor's job", created.status());
  }
  auto conn = pg::Conn::Open(uri, {{"SET synchronous_commit = on", ""}});
  if (!conn.ok()) Fail("connecting for the floor", conn.status());
  const std::string blob = FloorEventBlob();
  int64_t rows = 0;
  const absl::Time start = absl::Now();
  while (absl::Now() - start < absl::Seconds(seconds)) {
    if (absl::Status s = PgInsertThousand(**conn, logs, blob); !s.ok()) Fail("floor insert", s);
    rows += 1000;
  }
  return static_cast<double>(rows) / absl::ToDoubleSeconds(absl::Now() - start);
}

double Floor(const Target& target, const std::string& dir, bool logs, double seconds) {
  const std::string db = target.NewDb(dir, "floor.db");
  return target.postgres() ? PgFloor(db, logs, seconds) : SqliteFloor(db, logs, seconds);
}

// (a): one worker, one rank offering far more than the coordinator takes.
void RunOneWorker(const Target& target, const std::string& dir, int seconds) {
  IngestLoad lines;  // (a) lines: one worker, one rank, far more than it can take
  lines.workers = 1;
  lines.ranks = 1;
  lines.lines_per_second = 2'000'000;
  lines.step = absl::Milliseconds(10);
  lines.line_bytes = 100;
  lines.topology_bytes = 0;
  lines.duration = absl::Seconds(seconds);
  const IngestReport a_lines = Load(target, dir + "/a-lines", lines);
  const double lines_rate = static_cast<double>(a_lines.lines_stored) / a_lines.seconds;
  const double lines_floor = Floor(target, dir + "/floor-lines", true, 3);

  IngestLoad events = lines;  // (a) events: metric events back to back
  events.lines_per_second = 0;
  events.step = absl::ZeroDuration();
  const IngestReport a_events = Load(target, dir + "/a-events", events);
  const double events_rate = static_cast<double>(a_events.steps_stored) / a_events.seconds;
  const double events_floor = Floor(target, dir + "/floor-events", false, 3);

  const std::string bare = absl::StrCat("bare ", target.engine(), " inserts");
  const char* lines_how = target.postgres() ? "log_lines, 1000 per transaction, 64-row INSERTs"
                                            : "log_lines, 1000 per transaction";
  std::cout << absl::StrFormat(
      "(a) one worker\n"
      "  log lines stored      %10.0f /s  (%lld of %lld sent)\n"
      "  %-21s %10.0f /s  (%s)\n"
      "  ratio                 %10.2f\n"
      "  metric events stored  %10.0f /s  (%lld of %lld sent)\n"
      "  %-21s %10.0f /s  (job_events, 1000 per transaction)\n"
      "  ratio                 %10.2f\n",
      lines_rate, a_lines.lines_stored, a_lines.lines_sent, bare, lines_floor, lines_how,
      lines_rate / lines_floor, events_rate, a_events.steps_stored, a_events.metric_events_sent,
      bare, events_floor, events_rate / events_floor);
}

// (b): the scale.
void RunScale(const Target& target, const std::string& dir, int seconds) {
  IngestLoad scale;
  scale.workers = absl::GetFlag(FLAGS_workers);
  scale.ranks = absl::GetFlag(FLAGS_ranks);
  scale.lines_per_second = absl::GetFlag(FLAGS_lines_per_second);
  scale.step = absl::Milliseconds(absl::GetFlag(FLAGS_step_ms));
  scale.topology_bytes = absl::GetFlag(FLAGS_topology_bytes);
  scale.duration = absl::Seconds(seconds);
  const IngestReport b = Load(target, dir + "/b", scale);
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
}

int Main() {
  const std::string store = absl::GetFlag(FLAGS_store);
  const std::string sync = absl::GetFlag(FLAGS_sync);
  if ((store != "sqlite" && store != "postgres") || (sync != "full" && sync != "normal") ||
      (store == "postgres" && sync != "full")) {
    std::cerr << "ingest_bench: --store sqlite|postgres, --sync full|normal (sqlite only)\n";
    return 2;
  }
  char tmpl[] = "/tmp/ingest_bench.XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const int seconds = absl::GetFlag(FLAGS_seconds);
  const std::string durability =
      store == "sqlite" ? absl::StrCat("store=sqlite synchronous=", sync)
                        : "store=postgres (test server with fsync=off: a commit waits for no "
                          "disk; compare with --store sqlite --sync normal) synchronous_commit=on";
  std::cout << absl::StrFormat("ingest_bench: %s, %d s per load, dir %s\n", durability, seconds,
                               dir);
  {
    const Target target(store == "postgres");
    RunOneWorker(target, dir, seconds);
    RunScale(target, dir, seconds);
  }
  fs::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace trainctl::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return trainctl::bench::Main();
}
