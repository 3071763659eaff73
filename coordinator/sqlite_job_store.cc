#include "coordinator/sqlite_job_store.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "coordinator/internal/sql_store.h"
#include "coordinator/internal/sqlite_schema.h"
#include "google/protobuf/util/message_differencer.h"
#include "google/protobuf/util/time_util.h"

namespace trainctl {
namespace {

using sqlite::Db;
using sqlite::Statement;

using internal::EventKind;
using internal::JobBlob;
using internal::kJobKindColumnVersion;
using internal::kLatestVersion;
using internal::kMigrations;
using internal::ToMicros;

absl::Status Corrupt(const Db& db, absl::string_view what, int64_t key) {
  return absl::DataLossError(
      absl::StrCat(db.path(), ": stored ", what, " ", key, " does not parse"));
}

// The columns every job query selects, in this order (ReadJobRow).
constexpr char kJobColumns[] = "id, job, current_stage";

// A row of kJobColumns, with the job's stages from job_stages (`db` runs that query while `st`
// stays on its row).
absl::StatusOr<Job> ReadJobRow(Db& db, const Statement& st) {
  Job job;
  const int64_t n = st.ColumnInt(0);
  if (!job.ParseFromString(st.ColumnBlob(1))) return Corrupt(db, "job", n);
  job.set_id(FormatJobId(n));
  job.set_current_stage(static_cast<int32_t>(st.ColumnInt(2)));
  if (job.spec().kind() != trainctl::v1::JOB_KIND_PIPELINE) return job;
  ASSIGN_OR_RETURN(
      sqlite::CachedStatement stages,
      db.PrepareCached("SELECT idx, stage FROM job_stages WHERE job_id = ? ORDER BY idx"));
  stages->Bind(1, n);
  while (true) {
    ASSIGN_OR_RETURN(bool row, stages->Step());
    if (!row) break;
    if (stages->ColumnInt(0) != job.stages_size() ||
        !job.add_stages()->ParseFromString(stages->ColumnBlob(1))) {
      return Corrupt(db, "stages of job", n);
    }
  }
  return job;
}

// Writes the job's stages that differ from `before` (nullptr: none stored yet).
absl::Status WriteStages(Db& db, int64_t n, const Job& job, const Job* before) {
  using google::protobuf::util::MessageDifferencer;
  ASSIGN_OR_RETURN(
      sqlite::CachedStatement upsert,
      db.PrepareCached("INSERT OR REPLACE INTO job_stages(job_id, idx, name, kind, state, stage) "
                       "VALUES(?, ?, ?, ?, ?, ?)"));
  for (int i = 0; i < job.stages_size(); ++i) {
    const trainctl::v1::StageStatus& stage = job.stages(i);
    if (before != nullptr && i < before->stages_size() &&
        MessageDifferencer::Equals(stage, before->stages(i))) {
      continue;
    }
    upsert->Reset();
    RETURN_IF_ERROR(upsert->Bind(1, n)
                        .Bind(2, int64_t{i})
                        .Bind(3, stage.name())
                        .Bind(4, int64_t{stage.kind()})
                        .Bind(5, int64_t{stage.state()})
                        .BindBlob(6, stage.SerializeAsString())
                        .Run());
  }
  if (before != nullptr && before->stages_size() > job.stages_size()) {
    ASSIGN_OR_RETURN(sqlite::CachedStatement trim,
                     db.PrepareCached("DELETE FROM job_stages WHERE job_id = ? AND idx >= ?"));
    RETURN_IF_ERROR(trim->Bind(1, n).Bind(2, int64_t{job.stages_size()}).Run());
  }
  return absl::OkStatus();
}

absl::Status InsertEvents(Db& db, int64_t job_n, std::vector<JobEvent>* events) {
  if (events->empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(sqlite::CachedStatement st,
                   db.PrepareCached("INSERT INTO job_events(job_id, kind, event) VALUES(?, ?, ?)"));
  for (JobEvent& event : *events) {
    event.clear_seq();
    event.clear_job_id();
    st->Reset();
    RETURN_IF_ERROR(
        st->Bind(1, job_n).Bind(2, EventKind(event)).BindBlob(3, event.SerializeAsString()).Run());
    event.set_seq(db.LastInsertRowId());
    event.set_job_id(FormatJobId(job_n));
  }
  return absl::OkStatus();
}

absl::Status WriteJobRow(Db& db, int64_t n, const Job& job, const Job& before) {
  ASSIGN_OR_RETURN(sqlite::CachedStatement st,
                   db.PrepareCached("UPDATE jobs SET state = ?, priority = ?, update_time_us = ?, "
                                    "job = ?, current_stage = ? WHERE id = ?"));
  RETURN_IF_ERROR(st->Bind(1, int64_t{job.state()})
                      .Bind(2, int64_t{job.spec().priority()})
                      .Bind(3, ToMicros(job.update_time()))
                      .BindBlob(4, JobBlob(job))
                      .Bind(5, int64_t{job.current_stage()})
                      .Bind(6, n)
                      .Run());
  return WriteStages(db, n, job, &before);
}

absl::StatusOr<int> ReadUserVersion(Db& db) {
  ASSIGN_OR_RETURN(sqlite::CachedStatement st, db.PrepareCached("PRAGMA user_version"));
  ASSIGN_OR_RETURN(bool row, st->Step());
  return row ? static_cast<int>(st->ColumnInt(0)) : 0;
}

// Migration kJobKindColumnVersion's data: every job's kind column from its blob.
absl::Status BackfillJobKinds(Db& db) {
  ASSIGN_OR_RETURN(sqlite::Statement read, db.Prepare("SELECT id, job FROM jobs"));
  ASSIGN_OR_RETURN(sqlite::Statement write, db.Prepare("UPDATE jobs SET kind = ? WHERE id = ?"));
  while (true) {
    ASSIGN_OR_RETURN(bool row, read.Step());
    if (!row) return absl::OkStatus();
    Job job;
    const int64_t n = read.ColumnInt(0);
    if (!job.ParseFromString(read.ColumnBlob(1))) return Corrupt(db, "job", n);
    write.Reset();
    RETURN_IF_ERROR(write.Bind(1, int64_t{job.spec().kind()}).Bind(2, n).Run());
  }
}

absl::Status Migrate(Db& db, int target) {
  ASSIGN_OR_RETURN(int current, ReadUserVersion(db));
  if (current > kLatestVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        db.path(), ": schema version ", current, " is newer than this coordinator supports (",
        kLatestVersion, "); run a newer trainctl-coordinator"));
  }
  for (int v = current + 1; v <= target; ++v) {
    RETURN_IF_ERROR(db.Exec("BEGIN IMMEDIATE"));
    absl::Status s = db.Exec(kMigrations[v - 1]);
    if (s.ok() && v == kJobKindColumnVersion) s = BackfillJobKinds(db);
    if (s.ok()) s = db.Exec(absl::StrCat("PRAGMA user_version = ", v));
    if (s.ok()) s = db.Exec("COMMIT");
    if (!s.ok()) {
      (void)db.Exec("ROLLBACK");
      return absl::Status(s.code(), absl::StrCat("schema migration ", v, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status Configure(Db& db, bool synchronous_full) {
  RETURN_IF_ERROR(db.Exec("PRAGMA busy_timeout = 10000"));
  ASSIGN_OR_RETURN(sqlite::CachedStatement wal, db.PrepareCached("PRAGMA journal_mode = WAL"));
  ASSIGN_OR_RETURN(bool row, wal->Step());
  if (!row || wal->ColumnText(0) != "wal") {
    return absl::FailedPreconditionError(absl::StrCat(
        db.path(), ": cannot enable WAL mode (journal_mode is ", wal->ColumnText(0), ")"));
  }
  RETURN_IF_ERROR(
      db.Exec(synchronous_full ? "PRAGMA synchronous = FULL" : "PRAGMA synchronous = NORMAL"));
  return db.Exec("PRAGMA foreign_keys = ON");
}

// The job numbered `n` as stored; NOT_FOUND when there is none.
absl::StatusOr<Job> ReadJob(Db& db, int64_t n) {
  ASSIGN_OR_RETURN(
      sqlite::CachedStatement st,
      db.PrepareCached(absl::StrCat("SELECT ", kJobColumns, " FROM jobs WHERE id = ?")));
  st->Bind(1, n);
  ASSIGN_OR_RETURN(bool found, st->Step());
  if (!found) return absl::NotFoundError(absl::StrCat("job ", FormatJobId(n), " not found"));
  return ReadJobRow(db, *st);
}

// Inserts the lines, assigning their seqs; NOT_FOUND (nothing inserted) when a job does not exist.
absl::Status InsertLogLines(Db& db, std::vector<LogLine>* lines) {
  ASSIGN_OR_RETURN(sqlite::CachedStatement exists,
                   db.PrepareCached("SELECT 1 FROM jobs WHERE id = ?"));
  std::vector<int64_t> numbers;
  numbers.reserve(lines->size());
  for (const LogLine& line : *lines) {
    ASSIGN_OR_RETURN(int64_t n, ParseJobId(line.job_id()));
    if (numbers.empty() || numbers.back() != n) {
      exists->Reset();
      exists->Bind(1, n);
      ASSIGN_OR_RETURN(bool found, exists->Step());
      if (!found) return absl::NotFoundError(absl::StrCat("job ", line.job_id(), " not found"));
    }
    numbers.push_back(n);
  }
  ASSIGN_OR_RETURN(
      sqlite::CachedStatement insert,
      db.PrepareCached(
          "INSERT INTO log_lines(job_id, rank, stream, time_us, text) VALUES(?, ?, ?, ?, ?)"));
  for (size_t i = 0; i < lines->size(); ++i) {
    LogLine& line = (*lines)[i];
    insert->Reset();
    RETURN_IF_ERROR(insert->Bind(1, numbers[i])
                        .Bind(2, int64_t{line.rank()})
                        .Bind(3, line.stream())
                        .Bind(4, ToMicros(line.time()))
                        .Bind(5, line.text())
                        .Run());
    line.set_seq(db.LastInsertRowId());
    line.set_job_id(FormatJobId(numbers[i]));
  }
  return absl::OkStatus();
}

}  // namespace

int SqliteJobStore::LatestSchemaVersion() { return kLatestVersion; }

absl::StatusOr<std::unique_ptr<SqliteJobStore>> SqliteJobStore::Open(const Options& options) {
  const int target = options.schema_version > 0 ? options.schema_version : kLatestVersion;
  if (target > kLatestVersion) {
    return absl::InvalidArgumentError(absl::StrCat("unknown schema version ", target));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Db> writer, Db::Open(options.path));
  RETURN_IF_ERROR(Configure(*writer, options.synchronous_full));
  RETURN_IF_ERROR(Migrate(*writer, target));
  ASSIGN_OR_RETURN(std::unique_ptr<Db> reader, Db::Open(options.path));
  RETURN_IF_ERROR(Configure(*reader, options.synchronous_full));
  std::unique_ptr<SqliteJobStore> store(new SqliteJobStore(std::move(writer), std::move(reader)));
  store->max_metric_events_ = options.max_metric_events;
  return store;
}

absl::StatusOr<int> SqliteJobStore::SchemaVersion() {
  absl::MutexLock lock(&read_mu_);
  return ReadUserVersion(*reader_db_);
}

absl::Status SqliteJobStore::Write(const Work& work) {
  return queue_.Write(work,
                      [this](const std::vector<Queue::Writer*>& group) { CommitGroup(group); });
}

void SqliteJobStore::CommitGroup(const std::vector<Queue::Writer*>& group) {
  internal::CommitInSavepoints(*writer_db_, "BEGIN IMMEDIATE", group);
  std::vector<Queue::Writer*> full;
  for (Queue::Writer* w : group) {
    if (w->status.code() == absl::StatusCode::kResourceExhausted) full.push_back(w);
  }
  if (full.empty()) return;
  // The disk is full, and much of it may be our own WAL (it grows to ~4 MB between checkpoints):
  // move its pages into the database, truncate it, and try once more.
  (void)writer_db_->Exec("PRAGMA wal_checkpoint(TRUNCATE)");
  for (Queue::Writer* w : full) w->status = absl::OkStatus();
  internal::CommitInSavepoints(*writer_db_, "BEGIN IMMEDIATE", full);
}

absl::StatusOr<CreateJobResult> SqliteJobStore::CreateJob(const Job& job,
                                                          const std::string& request_id,
                                                          std::vector<JobEvent> initial_events) {
  CreateJobResult result;
  RETURN_IF_ERROR(Write([&](Db& db) -> absl::Status {
    if (!request_id.empty()) {
      ASSIGN_OR_RETURN(sqlite::CachedStatement find,
                       db.PrepareCached(absl::StrCat("SELECT ", kJobColumns,
                                                     " FROM jobs WHERE request_id = ?")));
      find->Bind(1, request_id);
      ASSIGN_OR_RETURN(bool found, find->Step());
      if (found) {
        ASSIGN_OR_RETURN(result.job, ReadJobRow(db, *find));
        result.created = false;
        return absl::OkStatus();
      }
    }
    ASSIGN_OR_RETURN(
        sqlite::CachedStatement insert,
        db.PrepareCached("INSERT INTO jobs(request_id, state, priority, create_time_us, "
                         "update_time_us, job, current_stage, kind) "
                         "VALUES(?, ?, ?, ?, ?, ?, ?, ?)"));
    if (request_id.empty()) {
      insert->BindNull(1);
    } else {
      insert->Bind(1, request_id);
    }
    RETURN_IF_ERROR(insert->Bind(2, int64_t{job.state()})
                        .Bind(3, int64_t{job.spec().priority()})
                        .Bind(4, ToMicros(job.create_time()))
                        .Bind(5, ToMicros(job.update_time()))
                        .BindBlob(6, JobBlob(job))
                        .Bind(7, int64_t{job.current_stage()})
                        .Bind(8, int64_t{job.spec().kind()})
                        .Run());
    const int64_t n = db.LastInsertRowId();
    RETURN_IF_ERROR(WriteStages(db, n, job, nullptr));
    std::vector<JobEvent> events = initial_events;
    RETURN_IF_ERROR(InsertEvents(db, n, &events));
    result.job = job;
    result.job.set_id(FormatJobId(n));
    result.created = true;
    return absl::OkStatus();
  }));
  return result;
}

absl::StatusOr<Job> SqliteJobStore::GetJob(absl::string_view id) {
  ASSIGN_OR_RETURN(int64_t n, ParseJobId(id));
  absl::MutexLock lock(&read_mu_);
  ASSIGN_OR_RETURN(
      sqlite::CachedStatement st,
      reader_db_->PrepareCached(absl::StrCat("SELECT ", kJobColumns, " FROM jobs WHERE id = ?")));
  st->Bind(1, n);
  ASSIGN_OR_RETURN(bool found, st->Step());
  if (!found) return absl::NotFoundError(absl::StrCat("job ", id, " not found"));
  return ReadJobRow(*reader_db_, *st);
}

absl::StatusOr<JobPage> SqliteJobStore::ListJobs(const JobFilter& filter) {
  std::string sql = absl::StrCat("SELECT ", kJobColumns, " FROM jobs WHERE id < ?");
  if (!filter.states.empty()) {
    std::vector<int> states(filter.states.begin(), filter.states.end());
    absl::StrAppend(&sql, " AND state IN (", absl::StrJoin(states, ","), ")");
  }
  absl::StrAppend(&sql, " ORDER BY id DESC LIMIT ?");
  absl::MutexLock lock(&read_mu_);
  ASSIGN_OR_RETURN(sqlite::CachedStatement st, reader_db_->PrepareCached(sql));
  st->Bind(1, filter.before_id > 0 ? filter.before_id : INT64_MAX)
      .Bind(2, int64_t{filter.page_size} + 1);
  JobPage page;
  while (true) {
    ASSIGN_OR_RETURN(bool row, st->Step());
    if (!row) break;
    if (static_cast<int>(page.jobs.size()) == filter.page_size) {
      page.next_before_id = ParseJobId(page.jobs.back().id()).value();
      break;
    }
    ASSIGN_OR_RETURN(Job job, ReadJobRow(*reader_db_, *st));
    page.jobs.push_back(std::move(job));
  }
  return page;
}

absl::StatusOr<std::vector<JobCount>> SqliteJobStore::CountJobs() {
  absl::MutexLock lock(&read_mu_);
  ASSIGN_OR_RETURN(sqlite::CachedStatement st,
                   reader_db_->PrepareCached("SELECT state, kind, COUNT(*) FROM jobs "
                                             "GROUP BY state, kind ORDER BY state, kind"));
  std::vector<JobCount> counts;
  while (true) {
    ASSIGN_OR_RETURN(bool row, st->Step());
    if (!row) return counts;
    counts.push_back({static_cast<trainctl::v1::JobState>(st->ColumnInt(0)),
                      static_cast<trainctl::v1::JobKind>(st->ColumnInt(1)), st->ColumnInt(2)});
  }
}

// UpdateJob's and WriteBatch's statements on the writer's connection, inside its transaction.
class SqliteJobStore::BatchTx final : public internal::BatchTransaction {
 public:
  BatchTx(SqliteJobStore* store, Db& db) : store_(store), db_(db) {}
  absl::StatusOr<Job> ReadJob(int64_t n) override { return trainctl::ReadJob(db_, n); }
  absl::Status InsertLogLines(std::vector<LogLine>* lines) override {
    return trainctl::InsertLogLines(db_, lines);
  }
  absl::Status WriteJob(int64_t n, const Job& after, const Job& before) override {
    return WriteJobRow(db_, n, after, before);
  }
  absl::Status InsertEvents(int64_t n, std::vector<JobEvent>* events) override {
    return trainctl::InsertEvents(db_, n, events);
  }
  absl::Status ThinMetricEvents(int64_t n, const std::vector<JobEvent>& added) override {
    return store_->ThinMetricEvents(db_, n, added);
  }

 private:
  SqliteJobStore* const store_;
  Db& db_;
};

absl::StatusOr<Job> SqliteJobStore::UpdateJob(absl::string_view id, const JobMutation& mutate,
                                              std::vector<JobEvent>* events) {
  ASSIGN_OR_RETURN(int64_t n, ParseJobId(id));
  Job updated;
  std::vector<JobEvent> new_events;
  const absl::Status written = Write([&](Db& db) -> absl::Status {
    BatchTx tx(this, db);
    return internal::ApplyUpdate(tx, n, mutate, &updated, &new_events);
  });
  if (!written.ok()) {
    ForgetMetricCount(n);
    return written;
  }
  if (events != nullptr) *events = std::move(new_events);
  return updated;
}

absl::Status SqliteJobStore::ThinMetricEvents(Db& db, int64_t job_n,
                                              const std::vector<JobEvent>& added) {
  const int64_t metrics =
      std::count_if(added.begin(), added.end(), [](const JobEvent& e) { return e.has_metric(); });
  if (metrics == 0) return absl::OkStatus();
  std::optional<int64_t> count;
  {
    absl::MutexLock lock(&counts_mu_);
    if (auto it = metric_counts_.find(job_n); it != metric_counts_.end()) {
      count = it->second + metrics;
    }
  }
  if (!count) {
    ASSIGN_OR_RETURN(sqlite::CachedStatement st,
                     db.PrepareCached("SELECT COUNT(*) FROM job_events WHERE job_id = ? AND "
                                      "kind = 'metric'"));
    st->Bind(1, job_n);
    ASSIGN_OR_RETURN(bool row, st->Step());
    count = row ? st->ColumnInt(0) : 0;
  }
  if (*count > std::max(max_metric_events_, kMinMaxMetricEventsPerJob)) {
    ASSIGN_OR_RETURN(sqlite::CachedStatement read,
                     db.PrepareCached("SELECT seq, event FROM job_events WHERE job_id = ? AND "
                                      "kind = 'metric' ORDER BY seq"));
    read->Bind(1, job_n);
    std::vector<int64_t> seqs, times;
    while (true) {
      ASSIGN_OR_RETURN(bool row, read->Step());
      if (!row) break;
      JobEvent event;
      if (!event.ParseFromString(read->ColumnBlob(1))) {
        return Corrupt(db, "event", read->ColumnInt(0));
      }
      seqs.push_back(read->ColumnInt(0));
      times.push_back(ToMicros(event.time()));
    }
    read->Reset();
    ASSIGN_OR_RETURN(sqlite::CachedStatement del,
                     db.PrepareCached("DELETE FROM job_events WHERE seq = ?"));
    const std::vector<size_t> drop = MetricEventsToThin(times, max_metric_events_);
    for (size_t i : drop) {
      del->Reset();
      RETURN_IF_ERROR(del->Bind(1, seqs[i]).Run());
    }
    count = static_cast<int64_t>(seqs.size() - drop.size());
  }
  absl::MutexLock lock(&counts_mu_);
  metric_counts_[job_n] = *count;
  return absl::OkStatus();
}

void SqliteJobStore::ForgetMetricCount(int64_t job_n) {
  absl::MutexLock lock(&counts_mu_);
  metric_counts_.erase(job_n);
}

absl::StatusOr<std::vector<JobEvent>> SqliteJobStore::ListEvents(absl::string_view job_id,
                                                                 int64_t after_seq, int limit) {
  ASSIGN_OR_RETURN(Job job, GetJob(job_id));  // NOT_FOUND for unknown jobs
  const int64_t n = ParseJobId(job.id()).value();
  absl::MutexLock lock(&read_mu_);
  ASSIGN_OR_RETURN(
      sqlite::CachedStatement st,
      reader_db_->PrepareCached(
          "SELECT seq, event FROM job_events WHERE job_id = ? AND seq > ? ORDER BY seq LIMIT ?"));
  st->Bind(1, n).Bind(2, after_seq).Bind(3, int64_t{limit});
  std::vector<JobEvent> out;
  while (true) {
    ASSIGN_OR_RETURN(bool row, st->Step());
    if (!row) break;
    JobEvent event;
    if (!event.ParseFromString(st->ColumnBlob(1)))
      return Corrupt(*reader_db_, "event", st->ColumnInt(0));
    event.set_seq(st->ColumnInt(0));
    event.set_job_id(job.id());
    out.push_back(std::move(event));
  }
  return out;
}

absl::Status SqliteJobStore::AppendLogs(std::vector<LogLine>* lines) {
  if (lines->empty()) return absl::OkStatus();
  return Write([&](Db& db) -> absl::Status { return InsertLogLines(db, lines); });
}

absl::Status SqliteJobStore::WriteBatch(std::vector<BatchRecord>* records) {
  std::map<int64_t, internal::BatchJob> jobs;
  const absl::Status written = Write([&](Db& db) -> absl::Status {
    BatchTx tx(this, db);
    return internal::ApplyBatch(tx, records, &jobs);
  });
  if (written.ok()) return absl::OkStatus();
  for (const auto& entry : jobs) ForgetMetricCount(entry.first);
  for (BatchRecord& r : *records) r.status = written;  // nothing was written
  return written;
}

absl::StatusOr<int64_t> SqliteJobStore::LogBytes(absl::string_view job_id) {
  ASSIGN_OR_RETURN(Job job, GetJob(job_id));
  absl::MutexLock lock(&read_mu_);
  // LENGTH of a BLOB counts bytes (of TEXT, characters). One pass over the job's rows by index.
  ASSIGN_OR_RETURN(sqlite::CachedStatement st,
                   reader_db_->PrepareCached("SELECT COALESCE(SUM(LENGTH(CAST(text AS BLOB))), 0) "
                                             "FROM log_lines WHERE job_id = ?"));
  st->Bind(1, ParseJobId(job.id()).value());
  ASSIGN_OR_RETURN(bool row, st->Step());
  return row ? st->ColumnInt(0) : 0;
}

absl::StatusOr<std::vector<LogLine>> SqliteJobStore::ListLogs(absl::string_view job_id,
                                                              const LogQuery& query) {
  ASSIGN_OR_RETURN(Job job, GetJob(job_id));
  const int64_t n = ParseJobId(job.id()).value();
  // With a tail, read the newest lines backwards and flip them.
  const bool tail = query.tail > 0;
  const std::string sql = absl::StrCat(
      "SELECT seq, rank, stream, time_us, text FROM log_lines WHERE job_id = ? AND seq > ? ORDER "
      "BY seq ",
      tail ? "DESC" : "ASC", " LIMIT ?");
  absl::MutexLock lock(&read_mu_);
  ASSIGN_OR_RETURN(sqlite::CachedStatement st, reader_db_->PrepareCached(sql));
  st->Bind(1, n).Bind(2, query.after_seq).Bind(3, int64_t{tail ? query.tail : query.limit});
  std::vector<LogLine> out;
  while (true) {
    ASSIGN_OR_RETURN(bool row, st->Step());
    if (!row) break;
    LogLine line;
    line.set_seq(st->ColumnInt(0));
    line.set_job_id(job.id());
    line.set_rank(static_cast<int32_t>(st->ColumnInt(1)));
    line.set_stream(st->ColumnText(2));
    *line.mutable_time() =
        google::protobuf::util::TimeUtil::MicrosecondsToTimestamp(st->ColumnInt(3));
    line.set_text(st->ColumnText(4));
    out.push_back(std::move(line));
  }
  if (tail) {
    std::reverse(out.begin(), out.end());
    if (static_cast<int>(out.size()) > query.limit) out.resize(query.limit);
  }
  return out;
}

}  // namespace trainctl
