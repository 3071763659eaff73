// The worker's side of rank output: lines batched for the coordinator, each rank's forwarding
// held to options_.rank_log_rate_bytes (log_rate.h), and what was held back said in the rank's
// stream and, once, in the job's events. The rest of Worker is in worker.cc.
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/utf8.h"
#include "common/worker_limits.h"
#include "google/protobuf/util/time_util.h"
#include "worker/daemon/worker.h"

namespace trainctl::worker {
namespace {

namespace v1 = trainctl::v1;
using google::protobuf::util::TimeUtil;

constexpr int kLogBatchLines = 512;
static_assert(kLogBatchLines <= kMaxLogBatchLines);

}  // namespace

void Worker::FlushLogsLocked() {
  if (logs_.empty()) return;
  v1::WorkerMessage message;
  for (v1::LogLine& line : logs_) *message.mutable_logs()->add_lines() = std::move(line);
  logs_.clear();
  logs_bytes_ = 0;
  outbox_.Push(std::move(message));
}

void Worker::OnLog(const std::string& job_id, int rank, const std::string& stream,
                   std::string line) {
  v1::LogLine log;
  log.set_job_id(job_id);
  log.set_rank(rank);
  log.set_stream(stream);
  *log.mutable_time() = TimeUtil::MicrosecondsToTimestamp(absl::ToUnixMicros(absl::Now()));
  // Rank output is bytes; a protobuf string must be UTF-8 (the coordinator cannot parse it else).
  log.set_text(ToValidUtf8(line));
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  auto it = forwarding_.find({job_id, rank});
  if (it == forwarding_.end()) {
    it = forwarding_
             .emplace(std::make_pair(job_id, rank),
                      RankForwarding{LogRateLimiter(options_.rank_log_rate_bytes,
                                                    options_.rank_log_burst_bytes, now)})
             .first;
  }
  // Over the rate: the line stays in the rank's log file only.
  if (!it->second.limiter.Admit(static_cast<int64_t>(log.text().size()), now)) return;
  ReportHeldBackLocked(job_id, rank, /*ended=*/false);
  AppendLogLocked(std::move(log));
}

void Worker::AppendLogLocked(v1::LogLine log) {
  if (logs_bytes_ + log.text().size() > kMaxLogBatchBytes) FlushLogsLocked();
  logs_bytes_ += log.text().size();
  logs_.push_back(std::move(log));
  if (logs_.size() >= kLogBatchLines) FlushLogsLocked();
}

void Worker::ReportHeldBackLocked(const std::string& job_id, int rank, bool ended) {
  auto it = forwarding_.find({job_id, rank});
  if (it == forwarding_.end()) return;
  const LogRateLimiter::HeldBack held = it->second.limiter.TakeHeldBack();
  const bool warn = held.lines > 0 && !it->second.warned;
  if (held.lines > 0) it->second.warned = true;
  if (ended) forwarding_.erase(it);
  if (held.lines == 0) return;
  const std::string text = absl::StrCat(
      "[trainctl-worker] ", held.lines, " lines (", held.bytes, " bytes) of rank ", rank,
      "'s output were not sent to the coordinator: over the worker's --rank_log_rate of ",
      static_cast<int64_t>(options_.rank_log_rate_bytes), " bytes/s; the rank's log file on ",
      options_.node_name, " has them");
  v1::LogLine log;
  log.set_job_id(job_id);
  log.set_rank(rank);
  log.set_stream("stderr");
  *log.mutable_time() = TimeUtil::MicrosecondsToTimestamp(absl::ToUnixMicros(absl::Now()));
  log.set_text(text);
  AppendLogLocked(std::move(log));
  if (!warn) return;
  v1::WorkerMessage warning;
  warning.mutable_warning()->set_job_id(job_id);
  warning.mutable_warning()->set_message(
      absl::StrCat("rank ", rank, " writes faster than the worker forwards (--rank_log_rate ",
                   static_cast<int64_t>(options_.rank_log_rate_bytes),
                   " bytes/s): some of its lines are only in its log file on ", options_.node_name,
                   " (tasks/<task>/rank-", rank, ".log)"));
  FlushLogsLocked();  // the warning follows the lines it is about
  outbox_.Push(std::move(warning));
}

}  // namespace trainctl::worker
