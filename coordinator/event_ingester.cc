#include "coordinator/event_ingester.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/diagnostics_reports.h"
#include "common/logging.h"
#include "nlohmann/json.hpp"

namespace trainctl {

namespace v1 = trainctl::v1;

struct EventIngester::Metrics {
  explicit Metrics(metrics::Registry* r)
      : events(r->AddCounter("trainctl_events_ingested_total",
                             "Trainer events handled by the coordinator's ingester, by type.")),
        lines(r->AddCounter("trainctl_log_lines_ingested_total",
                            "Rank log lines stored by the coordinator.")
                  .Add({})),
        dropped(r->AddCounter("trainctl_log_lines_dropped_total",
                              "Rank log lines not stored because their job reached its cap of "
                              "stored log bytes (--max_job_log_bytes).")
                    .Add({})),
        stored_bytes(r->AddCounter("trainctl_log_bytes_stored_total",
                                   "Bytes of rank log text stored by the coordinator.")
                         .Add({})),
        depth(r->AddGauge("trainctl_ingest_queue_depth",
                          "Worker messages waiting for the coordinator's ingester.")
                  .Add({})),
        commits(r->AddHistogram("trainctl_store_commit_duration_seconds",
                                "Store commit latency by what was committed.")),
        logs_commit(commits.Add({{"op", "logs"}}, metrics::LatencyBuckets())),
        events_commit(commits.Add({{"op", "events"}}, metrics::LatencyBuckets())) {
    for (const char* type : {"metric", "checkpoint", "topology", "bandwidth", "warning", "status",
                             "setup", "memory", "generation", "other"}) {
      by_type.emplace(type, &events.Add({{"type", type}}));
    }
  }

  // The counter of a trainer event's type: one of a fixed set, so a peer cannot mint series (made
  // once: prometheus-cpp's Family::Add allocates a child on every call).
  prometheus::Counter& Events(const std::string& type) {
    auto it = by_type.find(type);
    return *(it != by_type.end() ? it->second : by_type.at("other"));
  }

  prometheus::Family<prometheus::Counter>& events;
  std::map<std::string, prometheus::Counter*> by_type;  // filled once, read without a lock
  prometheus::Counter& lines;
  prometheus::Counter& dropped;
  prometheus::Counter& stored_bytes;
  prometheus::Gauge& depth;
  prometheus::Family<prometheus::Histogram>& commits;
  prometheus::Histogram& logs_commit;
  prometheus::Histogram& events_commit;
};

EventIngester::EventIngester(JobManager* jobs, EventIngesterOptions options, OnStored on_stored)
    : jobs_(jobs), options_(std::move(options)), on_stored_(std::move(on_stored)) {
  if (options_.metrics != nullptr) metrics_ = std::make_unique<Metrics>(options_.metrics);
  thread_ = std::thread([this] { Run(); });
}

EventIngester::~EventIngester() { Stop(); }

void EventIngester::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void EventIngester::Submit(int64_t session, const std::string& node, v1::WorkerMessage message,
                           std::function<void()> release) {
  Item item;
  item.session = session;
  item.node = node;
  item.bytes = message.ByteSizeLong();
  item.message = std::move(message);
  bool store_here = false;
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) {
      store_here = true;  // the coordinator is shutting down
    } else {
      ++submitted_;
      queued_bytes_ += item.bytes;
      const bool hold = queued_bytes_ > options_.max_queue_bytes;
      if (hold) item.release = std::move(release);
      queue_.push_back(std::move(item));
      if (metrics_ != nullptr) metrics_->depth.Set(static_cast<double>(queue_.size()));
      if (hold) return;
    }
  }
  if (store_here) {
    absl::MutexLock store(&store_mu_);
    std::vector<Item> batch;
    batch.push_back(std::move(item));
    Store(batch);
  }
  if (release) release();
}

void EventIngester::Flush() {
  absl::MutexLock lock(&mu_);
  const int64_t target = submitted_;
  auto done = [this, target]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return finished_ >= target || stopped_; };
  mu_.Await(absl::Condition(&done));
}

size_t EventIngester::depth() {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

void EventIngester::ReleaseLocked(std::vector<std::function<void()>>* out) {
  if (queued_bytes_ > options_.max_queue_bytes) return;
  for (Item& item : queue_) {
    if (item.release) out->push_back(std::move(item.release));
    item.release = nullptr;
  }
}

void EventIngester::Run() {
  while (true) {
    std::vector<Item> batch;
    std::vector<std::function<void()>> releases;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) {  // stopping, and everything is stored
        stopped_ = true;
        break;
      }
      size_t bytes = 0;
      while (!queue_.empty() && static_cast<int>(batch.size()) < options_.max_batch_messages &&
             (batch.empty() || bytes + queue_.front().bytes <= options_.max_batch_bytes)) {
        bytes += queue_.front().bytes;
        if (queue_.front().release) releases.push_back(std::move(queue_.front().release));
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      queued_bytes_ -= bytes;
      ReleaseLocked(&releases);
      if (metrics_ != nullptr) metrics_->depth.Set(static_cast<double>(queue_.size()));
    }
    for (auto& release : releases) release();
    {
      absl::MutexLock store(&store_mu_);
      Store(batch);
    }
    absl::MutexLock lock(&mu_);
    finished_ += static_cast<int64_t>(batch.size());
  }
}

namespace {

// The `setup` event's fields that have the right type (others are left out, not an error: the
// event still says what it can); strings capped, as a rank's event is not trusted.
v1::RankSetup RankSetupFromEvent(const nlohmann::json& j) {
  v1::RankSetup setup;
  auto text = [&j](const char* key) {
    const auto v = j.find(key);
    return v != j.end() && v->is_string() ? v->get<std::string>().substr(0, 200) : std::string();
  };
  setup.set_device(text("device"));
  setup.set_backend(text("backend"));
  setup.set_attention(text("attention"));
  if (const auto h = j.find("hidden_size"); h != j.end() && h->is_number_integer()) {
    setup.set_hidden_size(h->get<int64_t>());
  }
  if (const auto filled = j.find("deepspeed_filled"); filled != j.end() && filled->is_object()) {
    for (const auto& [key, value] : filled->items()) {
      if (value.is_number_integer() && key.size() <= 200) {
        (*setup.mutable_deepspeed_filled())[key] = value.get<int64_t>();
      }
    }
  }
  return setup;
}

}  // namespace

bool EventIngester::EventRecord(const v1::TrainerEvent& event, BatchRecord* record,
                                std::string* type) {
  nlohmann::json j = nlohmann::json::parse(event.json(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    TRAINCTL_LOG(WARNING) << event.job_id() << " rank " << event.rank()
                          << ": unreadable trainer event dropped: " << event.json().substr(0, 200);
    return false;
  }
  *type = j["type"].get<std::string>();
  if (*type == "metric") {
    v1::MetricSample sample;
    const nlohmann::json& step = j["step"];
    sample.set_step(step.is_number_integer() ? step.get<int64_t>() : 0);
    if (j.contains("values") && j["values"].is_object()) {
      for (const auto& [key, value] : j["values"].items()) {
        if (value.is_number()) (*sample.mutable_values())[key] = value.get<double>();
      }
    }
    *record = jobs_->MetricRecord(event.job_id(), std::move(sample));
    return true;
  }
  if (*type == "checkpoint") {
    v1::Checkpoint checkpoint;
    const nlohmann::json& step = j["step"];
    checkpoint.set_step(step.is_number_integer() ? step.get<int64_t>() : 0);
    const nlohmann::json& path = j["path"];
    checkpoint.set_path(path.is_string() ? path.get<std::string>() : "");
    *record = jobs_->CheckpointRecord(event.job_id(), std::move(checkpoint));
    return true;
  }
  // What NCCL did (a rank's report) and the bandwidth probe (rank 0's), typed and checked
  // (common/diagnostics_reports.h); a report that fails the checks becomes a warning naming why.
  if (*type == "topology" || *type == "bandwidth") {
    v1::JobEvent out;
    absl::Status status;
    if (*type == "topology") {
      auto report = NcclReportFromEvent(j);
      status = report.status();
      if (report.ok()) {
        report->set_rank(event.rank());  // the worker knows which rank wrote it
        *out.mutable_nccl() = std::move(*report);
      }
    } else {
      auto report = BandwidthReportFromEvent(j);
      status = report.status();
      if (report.ok()) *out.mutable_bandwidth() = std::move(*report);
    }
    if (!status.ok()) {
      out.mutable_warning()->set_source(absl::StrCat("rank ", event.rank()));
      out.mutable_warning()->set_message(
          absl::StrCat(*type, " report dropped: ", std::string(status.message()).substr(0, 1000)));
    }
    *record = jobs_->JobEventRecord(event.job_id(), std::move(out));
    return true;
  }
  // How the lead rank set itself up, with the DeepSpeed values it took from the model.
  if (*type == "setup") {
    v1::JobEvent out;
    *out.mutable_setup() = RankSetupFromEvent(j);
    *record = jobs_->JobEventRecord(event.job_id(), std::move(out));
    return true;
  }
  // A rank's typed warning that a remedy answers (worker/trainer/trainer_failure.h): "oom",
  // "loss_spike". Untyped warnings stay in the rank's log.
  if (*type == "warning" && j.contains("kind") && j["kind"].is_string() &&
      (j["kind"] == "oom" || j["kind"] == "loss_spike")) {
    const nlohmann::json& message = j["message"];
    *record = jobs_->WarningRecord(
        event.job_id(), absl::StrCat("rank ", event.rank()),
        absl::StrCat(
            j["kind"].get<std::string>(), ": ",
            message.is_string() ? message.get<std::string>().substr(0, 2000) : std::string()));
    return true;
  }
  return false;  // other types are not stored as job events (yet)
}

std::vector<LogLine> EventIngester::AdmitLogLines(
    google::protobuf::RepeatedPtrField<LogLine>* lines, std::vector<BatchRecord>* events,
    std::set<std::string>* touched) {
  std::vector<LogLine> kept;
  kept.reserve(lines->size());
  for (LogLine& line : *lines) {
    LogBudget& budget = log_budgets_[line.job_id()];
    if (budget.stored < 0) {
      auto stored = jobs_->store()->LogBytes(line.job_id());
      budget.stored = stored.ok() ? *stored : 0;  // an unknown job: its write fails anyway
    }
    const auto bytes = static_cast<int64_t>(line.text().size());
    if (budget.stored + bytes <= options_.max_job_log_bytes) {
      budget.stored += bytes;
      touched->insert(line.job_id());
      kept.push_back(std::move(line));
      continue;
    }
    if (metrics_ != nullptr) metrics_->dropped.Increment();
    if (budget.warned) continue;
    budget.warned = true;
    TRAINCTL_LOG(WARNING) << line.job_id() << ": stored logs reached --max_job_log_bytes ("
                          << options_.max_job_log_bytes << " bytes); later lines are dropped";
    events->push_back(jobs_->WarningRecord(
        line.job_id(), "coordinator",
        absl::StrCat("the job's stored logs reached the coordinator's cap of ",
                     options_.max_job_log_bytes,
                     " bytes (--max_job_log_bytes): later lines are not stored; each rank's whole "
                     "output stays in its worker's rank log (worker/tasks/<task>/rank-<r>.log "
                     "under the worker's --work_dir)")));
  }
  return kept;
}

struct EventIngester::BatchWrites {
  explicit BatchWrites(size_t items) : where(items, {false, -1}), types(items) {}

  std::vector<BatchRecord> logs, events;
  std::set<std::string> touched;  // jobs whose stored log bytes grew
  // Per item: where its record is (logs or events, index), or -1 when it has none.
  std::vector<std::pair<bool, int>> where;
  std::vector<std::string> types;  // per item: its trainer event's type, if any
};

void EventIngester::Store(std::vector<Item>& batch) {
  BatchWrites writes(batch.size());
  StageBatch(batch, &writes);
  CommitRecords(&writes.logs, true);
  CommitRecords(&writes.events, false);
  AccountStoredLogs(writes);
  std::vector<Outcome> outcomes;
  outcomes.reserve(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) outcomes.push_back(ItemOutcome(batch[i], i, writes));
  on_stored_(std::move(outcomes));
}

void EventIngester::StageBatch(std::vector<Item>& batch, BatchWrites* writes) {
  for (size_t i = 0; i < batch.size(); ++i) {
    Item& item = batch[i];
    if (failed_sessions_.count(item.session)) continue;
    if (item.message.has_logs()) {
      std::vector<LogLine> kept = AdmitLogLines(item.message.mutable_logs()->mutable_lines(),
                                                &writes->events, &writes->touched);
      if (kept.empty()) continue;  // all over the cap: acknowledged, nothing to write
      writes->where[i] = {true, static_cast<int>(writes->logs.size())};
      writes->logs.push_back(jobs_->LogRecord(std::move(kept)));
    } else if (item.message.has_event()) {
      BatchRecord record;
      if (EventRecord(item.message.event(), &record, &writes->types[i])) {
        writes->where[i] = {false, static_cast<int>(writes->events.size())};
        writes->events.push_back(std::move(record));
      }
    }
  }
}

void EventIngester::CommitRecords(std::vector<BatchRecord>* records, bool are_logs) {
  if (records->empty()) return;
  const absl::Time start = absl::Now();
  (void)jobs_->WriteBatch(records);
  if (metrics_ != nullptr) {
    (are_logs ? metrics_->logs_commit : metrics_->events_commit)
        .Observe(absl::ToDoubleSeconds(absl::Now() - start));
  }
}

void EventIngester::AccountStoredLogs(const BatchWrites& writes) {
  bool logs_lost = false;  // a transient error: the counts are read from the store again
  for (const BatchRecord& record : writes.logs) {
    if (IsTransientStoreError(record.status)) {
      logs_lost = true;
    } else if (record.status.ok() && metrics_ != nullptr) {
      for (const LogLine& line : record.lines) {
        metrics_->stored_bytes.Increment(static_cast<double>(line.text().size()));
      }
    }
  }
  if (logs_lost) {
    for (auto& [job, budget] : log_budgets_) budget.stored = -1;
  } else {
    for (const std::string& job : writes.touched) {
      jobs_->ReportLogBytes(job, log_budgets_[job].stored);
    }
  }
}

EventIngester::Outcome EventIngester::ItemOutcome(const Item& item, size_t i,
                                                  const BatchWrites& writes) {
  Outcome out{item.session, item.node, item.message.seq(), absl::OkStatus()};
  auto failed = failed_sessions_.find(item.session);
  if (failed != failed_sessions_.end()) {
    out.status = failed->second;  // after a failure of its session: it comes again
    return out;
  }
  if (item.message.has_topology()) {
    StoreTopology(item, &out);
    return out;
  }
  const auto [is_log, index] = writes.where[i];
  const BatchRecord* record = nullptr;
  if (index >= 0) record = &(is_log ? writes.logs : writes.events)[index];
  if (record != nullptr && IsTransientStoreError(record->status)) {
    out.status = record->status;
    failed_sessions_[item.session] = record->status;
  } else if (record != nullptr && !record->status.ok()) {
    TRAINCTL_LOG(WARNING) << (is_log ? "logs" : writes.types[i] + " event") << " from " << item.node
                          << " dropped: " << record->status.message();
  } else if (metrics_ != nullptr && item.message.has_logs() && record != nullptr) {
    metrics_->lines.Increment(static_cast<double>(record->lines.size()));
  } else if (metrics_ != nullptr && item.message.has_event() && !writes.types[i].empty()) {
    metrics_->Events(writes.types[i]).Increment();
  }
  return out;
}

void EventIngester::StoreTopology(const Item& item, Outcome* out) {
  out->topology = true;
  v1::NodeTopology topology = item.message.topology();
  topology.set_node(item.node);  // the session's node, whatever the worker wrote there
  const absl::Status stored = jobs_->store()->PutNodeTopology(topology);
  if (IsTransientStoreError(stored)) {
    out->status = stored;
    failed_sessions_[item.session] = stored;
  } else if (!stored.ok()) {
    TRAINCTL_LOG(WARNING) << "topology probe from " << item.node
                          << " dropped: " << stored.message();
  }
}

}  // namespace trainctl
