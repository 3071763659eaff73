#include "coordinator/postgres_job_store.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/status_macros.h"
#include "coordinator/internal/postgres_schema.h"
#include "coordinator/internal/sql_store.h"
#include "google/protobuf/util/message_differencer.h"
#include "google/protobuf/util/time_util.h"

namespace trainctl {
namespace {
namespace postgres_rows {

using internal::ToMicros;
using pg::Conn;
using pg::Params;
using pg::Result;

// The columns every job query selects, in this order (JobFromRow).
constexpr char kJobSelect[] = "SELECT id, job, current_stage FROM jobs";

absl::Status Corrupt(const Conn& conn, absl::string_view what, int64_t key) {
  return absl::DataLossError(
      absl::StrCat(conn.name(), ": stored ", what, " ", key, " does not parse"));
}

// Row `row` of kJobSelect's columns, with the job's stages read on `conn`.
absl::StatusOr<Job> JobFromRow(Conn& conn, const Result& rows, int row) {
  Job job;
  const int64_t n = rows.Int(row, 0);
  if (!job.ParseFromString(rows.Bytes(row, 1))) return Corrupt(conn, "job", n);
  job.set_id(FormatJobId(n));
  job.set_current_stage(static_cast<int32_t>(rows.Int(row, 2)));
  if (job.spec().kind() != trainctl::v1::JOB_KIND_PIPELINE) return job;
  ASSIGN_OR_RETURN(Result stages,
                   conn.Query("SELECT idx, stage FROM job_stages WHERE job_id = $1 ORDER BY idx",
                              Params().Int(n)));
  for (int i = 0; i < stages.rows(); ++i) {
    if (stages.Int(i, 0) != job.stages_size() ||
        !job.add_stages()->ParseFromString(stages.Bytes(i, 1))) {
      return Corrupt(conn, "stages of job", n);
    }
  }
  return job;
}

absl::StatusOr<Job> ReadJobNumbered(Conn& conn, int64_t n) {
  ASSIGN_OR_RETURN(Result rows,
                   conn.Query(absl::StrCat(kJobSelect, " WHERE id = $1"), Params().Int(n)));
  if (rows.rows() == 0)
    return absl::NotFoundError(absl::StrCat("job ", FormatJobId(n), " not found"));
  return JobFromRow(conn, rows, 0);
}

// Writes the job's stages that differ from `before` (nullptr: none stored yet).
absl::Status WriteStageRows(Conn& conn, int64_t n, const Job& job, const Job* before) {
  using google::protobuf::util::MessageDifferencer;
  for (int i = 0; i < job.stages_size(); ++i) {
    const trainctl::v1::StageStatus& stage = job.stages(i);
    if (before != nullptr && i < before->stages_size() &&
        MessageDifferencer::Equals(stage, before->stages(i))) {
      continue;
    }
    RETURN_IF_ERROR(
        conn.Query("INSERT INTO job_stages(job_id, idx, name, kind, state, stage) "
                   "VALUES($1, $2, $3, $4, $5, $6) ON CONFLICT (job_id, idx) DO UPDATE SET "
                   "name = excluded.name, kind = excluded.kind, state = excluded.state, "
                   "stage = excluded.stage",
                   Params()
                       .Int(n)
                       .Int(i)
                       .Text(stage.name())
                       .Int(stage.kind())
                       .Int(stage.state())
                       .Bytes(stage.SerializeAsString()))
            .status());
  }
  if (before != nullptr && before->stages_size() > job.stages_size()) {
    RETURN_IF_ERROR(conn.Query("DELETE FROM job_stages WHERE job_id = $1 AND idx >= $2",
                               Params().Int(n).Int(job.stages_size()))
                        .status());
  }
  return absl::OkStatus();
}

absl::Status InsertEventRows(Conn& conn, int64_t job_n, std::vector<JobEvent>* events) {
  for (JobEvent& event : *events) {
    event.clear_seq();
    event.clear_job_id();
    ASSIGN_OR_RETURN(
        Result row,
        conn.Query(
            "INSERT INTO job_events(job_id, kind, event) "
            "VALUES($1, $2, $3) RETURNING seq",
            Params().Int(job_n).Text(internal::EventKind(event)).Bytes(event.SerializeAsString())));
    event.set_seq(row.Int(0, 0));
    event.set_job_id(FormatJobId(job_n));
  }
  return absl::OkStatus();
}

// PostgreSQL text holds no NUL byte.
std::string StorableText(const std::string& text) {
  if (text.find('\0') == std::string::npos) return text;
  return absl::StrReplaceAll(text, {{absl::string_view("\0", 1), "\xEF\xBF\xBD"}});
}

// Inserts lines[begin, begin + count) in one statement, numbering them in order.
absl::Status InsertLogChunk(Conn& conn, std::vector<LogLine>* lines,
                            const std::vector<int64_t>& numbers, size_t begin, size_t count) {
  std::string sql = "INSERT INTO log_lines(job_id, rank, stream, time_us, text) VALUES ";
  Params params;
  for (size_t i = 0; i < count; ++i) {
    const size_t p = 5 * i;
    absl::StrAppend(&sql, i == 0 ? "" : ", ", "($", p + 1, ", $", p + 2, ", $", p + 3, ", $", p + 4,
                    ", $", p + 5, ")");
    const LogLine& line = (*lines)[begin + i];
    params.Int(numbers[begin + i])
        .Int(line.rank())
        .Text(StorableText(line.stream()))
        .Int(ToMicros(line.time()))
        .Text(StorableText(line.text()));
  }
  absl::StrAppend(&sql, " RETURNING seq");
  ASSIGN_OR_RETURN(Result rows, conn.Query(sql, params));
  // Identity values are drawn in VALUES order; RETURNING's order is not promised.
  std::vector<int64_t> seqs(rows.rows());
  for (int r = 0; r < rows.rows(); ++r) seqs[r] = rows.Int(r, 0);
  std::sort(seqs.begin(), seqs.end());
  for (size_t i = 0; i < count; ++i) {
    (*lines)[begin + i].set_seq(seqs[i]);
    (*lines)[begin + i].set_job_id(FormatJobId(numbers[begin + i]));
  }
  return absl::OkStatus();
}

// Inserts the lines, assigning their seqs; NOT_FOUND (nothing inserted) when a job does not exist.
// In chunks of 64, 32, ... 1 rows: few round trips, few prepared statements.
absl::Status InsertLogRows(Conn& conn, std::vector<LogLine>* lines) {
  std::vector<int64_t> numbers;
  numbers.reserve(lines->size());
  for (const LogLine& line : *lines) {
    ASSIGN_OR_RETURN(int64_t n, ParseJobId(line.job_id()));
    if (numbers.empty() || numbers.back() != n) {
      ASSIGN_OR_RETURN(Result found,
                       conn.Query("SELECT 1 FROM jobs WHERE id = $1", Params().Int(n)));
      if (found.rows() == 0) {
        return absl::NotFoundError(absl::StrCat("job ", line.job_id(), " not found"));
      }
    }
    numbers.push_back(n);
  }
  size_t done = 0;
  for (size_t chunk = 64; chunk > 0; chunk /= 2) {
    for (; lines->size() - done >= chunk; done += chunk) {
      RETURN_IF_ERROR(InsertLogChunk(conn, lines, numbers, done, chunk));
    }
  }
  return absl::OkStatus();
}

}  // namespace postgres_rows
}  // namespace

using pg::Params;
using pg::Result;
using postgres_rows::JobFromRow;

// The writer's statements inside a transaction, for every write (WriteBatch's rules among them).
class PostgresJobStore::Transaction final : public internal::BatchTransaction {
 public:
  Transaction(PostgresJobStore* store, pg::Conn& conn) : store_(store), conn_(conn) {}

  absl::StatusOr<Job> ReadJob(int64_t n) override {
    return postgres_rows::ReadJobNumbered(conn_, n);
  }
  absl::Status InsertLogLines(std::vector<LogLine>* lines) override {
    return postgres_rows::InsertLogRows(conn_, lines);
  }
  absl::Status WriteJob(int64_t n, const Job& after, const Job& before) override {
    RETURN_IF_ERROR(conn_
                        .Query("UPDATE jobs SET state = $1, priority = $2, update_time_us = $3, "
                               "job = $4, current_stage = $5 WHERE id = $6",
                               Params()
                                   .Int(after.state())
                                   .Int(after.spec().priority())
                                   .Int(internal::ToMicros(after.update_time()))
                                   .Bytes(internal::JobBlob(after))
                                   .Int(after.current_stage())
                                   .Int(n))
                        .status());
    return postgres_rows::WriteStageRows(conn_, n, after, &before);
  }
  absl::Status InsertEvents(int64_t n, std::vector<JobEvent>* events) override {
    return postgres_rows::InsertEventRows(conn_, n, events);
  }
  absl::Status ThinMetricEvents(int64_t n, const std::vector<JobEvent>& added) override;
  absl::StatusOr<CreateJobResult> Create(const Job& job, const std::string& request_id,
                                         std::vector<JobEvent> events);

 private:
  // The job's metric events, oldest first: their seqs and times.
  absl::Status ReadMetricTimes(int64_t n, std::vector<int64_t>* seqs, std::vector<int64_t>* times);

  PostgresJobStore* const store_;
  pg::Conn& conn_;
};

absl::StatusOr<CreateJobResult> PostgresJobStore::Transaction::Create(
    const Job& job, const std::string& request_id, std::vector<JobEvent> events) {
  CreateJobResult result;
  if (!request_id.empty()) {
    ASSIGN_OR_RETURN(Result found,
                     conn_.Query(absl::StrCat(postgres_rows::kJobSelect, " WHERE request_id = $1"),
                                 Params().Text(request_id)));
    if (found.rows() > 0) {
      ASSIGN_OR_RETURN(result.job, JobFromRow(conn_, found, 0));
      result.created = false;
      return result;
    }
  }
  Params params;
  if (request_id.empty()) {
    params.NullText();
  } else {
    params.Text(request_id);
  }
  params.Int(job.state())
      .Int(job.spec().priority())
      .Int(internal::ToMicros(job.create_time()))
      .Int(internal::ToMicros(job.update_time()))
      .Bytes(internal::JobBlob(job))
      .Int(job.current_stage())
      .Int(job.spec().kind());
  ASSIGN_OR_RETURN(Result id,
                   conn_.Query("INSERT INTO jobs(request_id, state, priority, create_time_us, "
                               "update_time_us, job, current_stage, kind) "
                               "VALUES($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id",
                               params));
  const int64_t n = id.Int(0, 0);
  RETURN_IF_ERROR(postgres_rows::WriteStageRows(conn_, n, job, nullptr));
  RETURN_IF_ERROR(postgres_rows::InsertEventRows(conn_, n, &events));
  result.job = job;
  result.job.set_id(FormatJobId(n));
  result.created = true;
  return result;
}

absl::Status PostgresJobStore::Transaction::ReadMetricTimes(int64_t n, std::vector<int64_t>* seqs,
                                                            std::vector<int64_t>* times) {
  ASSIGN_OR_RETURN(Result rows, conn_.Query("SELECT seq, event FROM job_events WHERE job_id = $1 "
                                            "AND kind = 'metric' ORDER BY seq",
                                            Params().Int(n)));
  for (int r = 0; r < rows.rows(); ++r) {
    JobEvent event;
    if (!event.ParseFromString(rows.Bytes(r, 1))) {
      return postgres_rows::Corrupt(conn_, "event", rows.Int(r, 0));
    }
    seqs->push_back(rows.Int(r, 0));
    times->push_back(internal::ToMicros(event.time()));
  }
  return absl::OkStatus();
}

absl::Status PostgresJobStore::Transaction::ThinMetricEvents(int64_t n,
                                                             const std::vector<JobEvent>& added) {
  const int64_t metrics =
      std::count_if(added.begin(), added.end(), [](const JobEvent& e) { return e.has_metric(); });
  if (metrics == 0) return absl::OkStatus();
  std::optional<int64_t> count;
  {
    absl::MutexLock lock(&store_->counts_mu_);
    if (auto it = store_->metric_counts_.find(n); it != store_->metric_counts_.end()) {
      count = it->second + metrics;
    }
  }
  if (!count) {
    ASSIGN_OR_RETURN(Result rows, conn_.Query("SELECT COUNT(*) FROM job_events WHERE job_id = $1 "
                                              "AND kind = 'metric'",
                                              Params().Int(n)));
    count = rows.Int(0, 0);
  }
  if (*count > std::max(store_->max_metric_events_, kMinMaxMetricEventsPerJob)) {
    std::vector<int64_t> seqs, times;
    RETURN_IF_ERROR(ReadMetricTimes(n, &seqs, &times));
    const std::vector<size_t> drop = MetricEventsToThin(times, store_->max_metric_events_);
    std::vector<int64_t> doomed;
    for (size_t i : drop) doomed.push_back(seqs[i]);
    if (!doomed.empty()) {  // one statement for all of them
      RETURN_IF_ERROR(conn_
                          .Query("DELETE FROM job_events WHERE seq = ANY(string_to_array($1, "
                                 "',')::bigint[])",
                                 Params().Text(absl::StrJoin(doomed, ",")))
                          .status());
    }

    count = static_cast<int64_t>(seqs.size() - drop.size());
  }
  absl::MutexLock lock(&store_->counts_mu_);
  store_->metric_counts_[n] = *count;
  return absl::OkStatus();
}

int PostgresJobStore::LatestSchemaVersion() { return internal::kPostgresLatestVersion; }

absl::StatusOr<std::unique_ptr<PostgresJobStore>> PostgresJobStore::Open(const Options& options) {
  const int target =
      options.schema_version > 0 ? options.schema_version : internal::kPostgresLatestVersion;
  if (target > internal::kPostgresLatestVersion) {
    return absl::InvalidArgumentError(absl::StrCat("unknown schema version ", target, " (1 to ",
                                                   internal::kPostgresLatestVersion, ")"));
  }
  // Every acknowledged write durable, whatever the server's default; notices (CREATE ... IF NOT
  // EXISTS) not printed.
  const std::vector<pg::SetupStatement> session = {{"SET synchronous_commit = on", ""},
                                                   {"SET client_min_messages = warning", ""}};
  ASSIGN_OR_RETURN(std::unique_ptr<pg::Conn> writer, pg::Conn::Open(options.uri, session));
  RETURN_IF_ERROR(internal::CheckPostgresSchema(*writer));
  // A coordinator that leads now runs its own schema: a standby (perhaps a newer binary, in a
  // rolling upgrade) migrates only once it has taken the lead.
  ASSIGN_OR_RETURN(Result held,
                   writer->Query(absl::StrCat(
                       "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = "
                       "'advisory' AND classid = ",
                       internal::kPostgresLockSpace, " AND objid = ", internal::kPostgresWriterLock,
                       " AND objsubid = 2 AND granted)")));
  const bool led = held.Int(0, 0) != 0;
  if (!led) RETURN_IF_ERROR(internal::MigratePostgres(*writer, target));
  ASSIGN_OR_RETURN(std::unique_ptr<pg::Conn> reader, pg::Conn::Open(options.uri, session));
  std::unique_ptr<PostgresJobStore> store(
      new PostgresJobStore(std::move(writer), std::move(reader), options.max_metric_events));
  store->pending_migration_ = led ? target : 0;
  return store;
}

absl::StatusOr<int> PostgresJobStore::SchemaVersion() {
  return Read([](pg::Conn& conn) { return internal::PostgresSchemaVersion(conn); });
}

absl::Status PostgresJobStore::Write(const Work& work) {
  return queue_.Write(work, [this](const std::vector<Queue::Writer*>& group) {
    absl::MutexLock lock(&writer_mu_);
    // UNAVAILABLE also when the reconnection finds the lock taken: the callers' work is kept and
    // written by whichever coordinator leads, and the renewer stops this one.
    const absl::Status ready = writer_->EnsureConnected();
    if (!ready.ok()) {
      for (Queue::Writer* w : group) w->status = ready;
      return;
    }
    internal::CommitInSavepoints<pg::Conn>(*writer_, "BEGIN", group,
                                           [this](pg::Conn& conn) { return CheckLead(conn); });
  });
}

absl::Status PostgresJobStore::InLeadTransaction(const Work& work) {
  RETURN_IF_ERROR(writer_->EnsureConnected());
  RETURN_IF_ERROR(writer_->Exec("BEGIN"));
  absl::Status s = work(*writer_);
  if (s.ok()) s = writer_->Exec("COMMIT");
  if (!s.ok()) (void)writer_->Exec("ROLLBACK");
  return s;
}

void PostgresJobStore::ForgetMetricCount(int64_t job_n) {
  absl::MutexLock lock(&counts_mu_);
  metric_counts_.erase(job_n);
}

absl::StatusOr<CreateJobResult> PostgresJobStore::CreateJob(const Job& job,
                                                            const std::string& request_id,
                                                            std::vector<JobEvent> initial_events) {
  CreateJobResult result;
  RETURN_IF_ERROR(Write([&](pg::Conn& conn) -> absl::Status {
    Transaction tx(this, conn);
    ASSIGN_OR_RETURN(result, tx.Create(job, request_id, initial_events));
    return absl::OkStatus();
  }));
  return result;
}

absl::StatusOr<Job> PostgresJobStore::GetJob(absl::string_view id) {
  ASSIGN_OR_RETURN(int64_t n, ParseJobId(id));
  return Read([n](pg::Conn& conn) { return postgres_rows::ReadJobNumbered(conn, n); });
}

absl::StatusOr<JobPage> PostgresJobStore::ListJobs(const JobFilter& filter) {
  std::string sql = absl::StrCat(postgres_rows::kJobSelect, " WHERE id < $1");
  if (!filter.states.empty()) {
    std::vector<int> states(filter.states.begin(), filter.states.end());
    absl::StrAppend(&sql, " AND state IN (", absl::StrJoin(states, ","), ")");
  }
  absl::StrAppend(&sql, " ORDER BY id DESC LIMIT $2");
  return Read([&](pg::Conn& conn) -> absl::StatusOr<JobPage> {
    ASSIGN_OR_RETURN(Result rows,
                     conn.Query(sql, Params()
                                         .Int(filter.before_id > 0 ? filter.before_id : INT64_MAX)
                                         .Int(int64_t{filter.page_size} + 1)));
    JobPage page;
    for (int r = 0; r < rows.rows(); ++r) {
      if (static_cast<int>(page.jobs.size()) == filter.page_size) {
        page.next_before_id = ParseJobId(page.jobs.back().id()).value();
        break;
      }
      ASSIGN_OR_RETURN(Job job, JobFromRow(conn, rows, r));
      page.jobs.push_back(std::move(job));
    }
    return page;
  });
}

absl::StatusOr<std::vector<JobCount>> PostgresJobStore::CountJobs() {
  return Read([](pg::Conn& conn) -> absl::StatusOr<std::vector<JobCount>> {
    ASSIGN_OR_RETURN(Result rows, conn.Query("SELECT state, kind, COUNT(*) FROM jobs "
                                             "GROUP BY state, kind ORDER BY state, kind"));
    std::vector<JobCount> counts;
    for (int r = 0; r < rows.rows(); ++r) {
      counts.push_back({static_cast<trainctl::v1::JobState>(rows.Int(r, 0)),
                        static_cast<trainctl::v1::JobKind>(rows.Int(r, 1)), rows.Int(r, 2)});
    }
    return counts;
  });
}

absl::StatusOr<Job> PostgresJobStore::UpdateJob(absl::string_view id, const JobMutation& mutate,
                                                std::vector<JobEvent>* events) {
  ASSIGN_OR_RETURN(int64_t n, ParseJobId(id));
  Job updated;
  std::vector<JobEvent> new_events;
  const absl::Status written = Write([&](pg::Conn& conn) -> absl::Status {
    Transaction tx(this, conn);
    return internal::ApplyUpdate(tx, n, mutate, &updated, &new_events);
  });
  if (!written.ok()) {
    ForgetMetricCount(n);
    return written;
  }
  if (events != nullptr) *events = std::move(new_events);
  return updated;
}

absl::StatusOr<std::vector<JobEvent>> PostgresJobStore::ListEvents(absl::string_view job_id,
                                                                   int64_t after_seq, int limit) {
  ASSIGN_OR_RETURN(Job job, GetJob(job_id));  // NOT_FOUND for unknown jobs
  const int64_t n = ParseJobId(job.id()).value();
  return Read([&](pg::Conn& conn) -> absl::StatusOr<std::vector<JobEvent>> {
    ASSIGN_OR_RETURN(Result rows, conn.Query("SELECT seq, event FROM job_events WHERE job_id = $1 "
                                             "AND seq > $2 ORDER BY seq LIMIT $3",
                                             Params().Int(n).Int(after_seq).Int(limit)));
    std::vector<JobEvent> out;
    for (int r = 0; r < rows.rows(); ++r) {
      JobEvent event;
      if (!event.ParseFromString(rows.Bytes(r, 1))) {
        return postgres_rows::Corrupt(conn, "event", rows.Int(r, 0));
      }
      event.set_seq(rows.Int(r, 0));
      event.set_job_id(job.id());
      out.push_back(std::move(event));
    }
    return out;
  });
}

absl::Status PostgresJobStore::AppendLogs(std::vector<LogLine>* lines) {
  if (lines->empty()) return absl::OkStatus();
  return Write([&](pg::Conn& conn) { return postgres_rows::InsertLogRows(conn, lines); });
}

absl::Status PostgresJobStore::WriteBatch(std::vector<BatchRecord>* records) {
  std::map<int64_t, internal::BatchJob> jobs;
  const absl::Status written = Write([&](pg::Conn& conn) -> absl::Status {
    Transaction tx(this, conn);
    return internal::ApplyBatch(tx, records, &jobs);
  });
  if (written.ok()) return absl::OkStatus();
  for (const auto& entry : jobs) ForgetMetricCount(entry.first);
  for (BatchRecord& r : *records) r.status = written;  // nothing was written
  return written;
}

absl::StatusOr<int64_t> PostgresJobStore::LogBytes(absl::string_view job_id) {
  ASSIGN_OR_RETURN(Job job, GetJob(job_id));
  const int64_t n = ParseJobId(job.id()).value();
  return Read([n](pg::Conn& conn) -> absl::StatusOr<int64_t> {
    ASSIGN_OR_RETURN(Result rows, conn.Query("SELECT COALESCE(SUM(octet_length(text)), 0)::bigint "
                                             "FROM log_lines WHERE job_id = $1",
                                             Params().Int(n)));
    return rows.Int(0, 0);
  });
}

absl::StatusOr<std::vector<LogLine>> PostgresJobStore::ListLogs(absl::string_view job_id,
                                                                const LogQuery& query) {
  ASSIGN_OR_RETURN(Job job, GetJob(job_id));
  const int64_t n = ParseJobId(job.id()).value();
  // With a tail, read the newest lines backwards and flip them.
  const bool tail = query.tail > 0;
  const std::string sql = absl::StrCat(
      "SELECT seq, rank, stream, time_us, text FROM log_lines WHERE job_id = $1 AND seq > $2 "
      "ORDER BY seq ",
      tail ? "DESC" : "ASC", " LIMIT $3");
  ASSIGN_OR_RETURN(
      std::vector<LogLine> out, Read([&](pg::Conn& conn) -> absl::StatusOr<std::vector<LogLine>> {
        ASSIGN_OR_RETURN(
            Result rows,
            conn.Query(sql,
                       Params().Int(n).Int(query.after_seq).Int(tail ? query.tail : query.limit)));
        std::vector<LogLine> lines(rows.rows());
        for (int r = 0; r < rows.rows(); ++r) {
          LogLine& line = lines[r];
          line.set_seq(rows.Int(r, 0));
          line.set_job_id(job.id());
          line.set_rank(static_cast<int32_t>(rows.Int(r, 1)));
          line.set_stream(rows.Bytes(r, 2));
          *line.mutable_time() =
              google::protobuf::util::TimeUtil::MicrosecondsToTimestamp(rows.Int(r, 3));
          line.set_text(rows.Bytes(r, 4));
        }
        return lines;
      }));
  if (tail) {
    std::reverse(out.begin(), out.end());
    if (static_cast<int>(out.size()) > query.limit) out.resize(query.limit);
  }
  return out;
}

absl::Status PostgresJobStore::PutNodeTopology(const trainctl::v1::NodeTopology& topology) {
  if (topology.node().empty()) {
    return absl::InvalidArgumentError("a node topology names no node");
  }
  const std::string blob = topology.SerializeAsString();
  const int64_t probe_time_us = internal::ToMicros(topology.probe_time());
  return Write([&](pg::Conn& conn) -> absl::Status {
    return conn
        .Query(
            "INSERT INTO node_topology(node, probe_time_us, topology) VALUES($1, $2, $3) "
            "ON CONFLICT (node) DO UPDATE SET probe_time_us = excluded.probe_time_us, "
            "topology = excluded.topology",
            Params().Text(topology.node()).Int(probe_time_us).Bytes(blob))
        .status();
  });
}

absl::StatusOr<std::optional<trainctl::v1::NodeTopology>> PostgresJobStore::GetNodeTopology(
    absl::string_view node) {
  return Read([&](pg::Conn& conn) -> absl::StatusOr<std::optional<trainctl::v1::NodeTopology>> {
    ASSIGN_OR_RETURN(Result rows, conn.Query("SELECT topology FROM node_topology WHERE node = $1",
                                             Params().Text(node)));
    if (rows.rows() == 0) return std::nullopt;
    trainctl::v1::NodeTopology topology;
    if (!topology.ParseFromString(rows.Bytes(0, 0))) {
      return absl::DataLossError(
          absl::StrCat(conn.name(), ": stored topology of node ", node, " does not parse"));
    }
    return topology;
  });
}

}  // namespace trainctl
