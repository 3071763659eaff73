#include "coordinator/in_memory_job_store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "google/protobuf/util/time_util.h"

namespace trainctl {
namespace {

bool StateMatches(const JobFilter& filter, const Job& job) {
  return filter.states.empty() ||
         std::find(filter.states.begin(), filter.states.end(), job.state()) != filter.states.end();
}

absl::Status NotFound(absl::string_view id) {
  return absl::NotFoundError(absl::StrCat("job ", id, " not found"));
}

}  // namespace

absl::StatusOr<CreateJobResult> InMemoryJobStore::CreateJob(const Job& job,
                                                            const std::string& request_id,
                                                            std::vector<JobEvent> initial_events) {
  absl::MutexLock lock(&mu_);
  if (!request_id.empty()) {
    if (auto it = request_ids_.find(request_id); it != request_ids_.end()) {
      return CreateJobResult{jobs_.at(it->second), false};
    }
  }
  const int64_t n = ++last_job_;
  Job stored = job;
  stored.set_id(FormatJobId(n));
  jobs_[n] = stored;
  if (!request_id.empty()) request_ids_[request_id] = n;
  AppendEventsLocked(stored.id(), &initial_events);
  return CreateJobResult{stored, true};
}

absl::StatusOr<Job> InMemoryJobStore::GetJob(absl::string_view id) {
  ASSIGN_OR_RETURN(int64_t n, ParseJobId(id));
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(n);
  if (it == jobs_.end()) return NotFound(id);
  return it->second;
}

absl::StatusOr<JobPage> InMemoryJobStore::ListJobs(const JobFilter& filter) {
  absl::MutexLock lock(&mu_);
  JobPage page;
  auto it = filter.before_id > 0 ? jobs_.lower_bound(filter.before_id) : jobs_.end();
  while (it != jobs_.begin()) {
    --it;
    if (!StateMatches(filter, it->second)) continue;
    if (static_cast<int>(page.jobs.size()) == filter.page_size) {
      page.next_before_id = page.jobs.empty() ? 0 : ParseJobId(page.jobs.back().id()).value();
      break;
    }
    page.jobs.push_back(it->second);
  }
  return page;
}

absl::StatusOr<std::vector<JobCount>> InMemoryJobStore::CountJobs() {
  absl::MutexLock lock(&mu_);
  std::map<std::pair<int, int>, int64_t> counts;
  for (const auto& [n, job] : jobs_) ++counts[{job.state(), job.spec().kind()}];
  std::vector<JobCount> out;
  for (const auto& [key, count] : counts) {
    out.push_back({static_cast<trainctl::v1::JobState>(key.first),
                   static_cast<trainctl::v1::JobKind>(key.second), count});
  }
  return out;
}

absl::StatusOr<Job> InMemoryJobStore::UpdateJob(absl::string_view id, const JobMutation& mutate,
                                                std::vector<JobEvent>* events) {
  ASSIGN_OR_RETURN(int64_t n, ParseJobId(id));
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(n);
  if (it == jobs_.end()) return NotFound(id);
  Job updated = it->second;
  std::vector<JobEvent> new_events;
  RETURN_IF_ERROR(mutate(&updated, &new_events));
  updated.set_id(it->second.id());  // the id is the store's, whatever the mutation did
  it->second = updated;
  AppendEventsLocked(updated.id(), &new_events);
  if (events != nullptr) *events = std::move(new_events);
  return updated;
}

void InMemoryJobStore::AppendEventsLocked(const std::string& job_id,
                                          std::vector<JobEvent>* events) {
  bool metrics = false;
  for (JobEvent& event : *events) {
    event.set_seq(++last_event_seq_);
    event.set_job_id(job_id);
    events_[event.seq()] = event;
    if (event.has_metric()) {
      metric_seqs_[job_id].push_back(event.seq());
      metrics = true;
    }
  }
  if (!metrics) return;
  std::vector<int64_t>& seqs = metric_seqs_[job_id];
  if (seqs.size() <= static_cast<size_t>(max_metric_events_)) return;
  std::vector<int64_t> times;
  for (int64_t seq : seqs) {
    times.push_back(google::protobuf::util::TimeUtil::TimestampToMicroseconds(events_[seq].time()));
  }
  const std::vector<size_t> drop = MetricEventsToThin(times, max_metric_events_);
  std::vector<int64_t> kept;
  for (size_t i = 0, d = 0; i < seqs.size(); ++i) {
    if (d < drop.size() && drop[d] == i) {
      events_.erase(seqs[i]);
      ++d;
    } else {
      kept.push_back(seqs[i]);
    }
  }
  seqs = std::move(kept);
}

absl::StatusOr<std::vector<JobEvent>> InMemoryJobStore::ListEvents(absl::string_view job_id,
                                                                   int64_t after_seq, int limit) {
  ASSIGN_OR_RETURN(int64_t n, ParseJobId(job_id));
  absl::MutexLock lock(&mu_);
  if (!jobs_.count(n)) return NotFound(job_id);
  const std::string id = FormatJobId(n);
  std::vector<JobEvent> out;
  for (auto it = events_.upper_bound(after_seq);
       it != events_.end() && static_cast<int>(out.size()) < limit; ++it) {
    if (it->second.job_id() == id) out.push_back(it->second);
  }
  return out;
}

absl::Status InMemoryJobStore::AppendLogs(std::vector<LogLine>* lines) {
  absl::MutexLock lock(&mu_);
  for (LogLine& line : *lines) {
    ASSIGN_OR_RETURN(int64_t n, ParseJobId(line.job_id()));
    if (!jobs_.count(n)) return NotFound(line.job_id());
    line.set_job_id(FormatJobId(n));
  }
  for (LogLine& line : *lines) {
    line.set_seq(++last_log_seq_);
    logs_[line.seq()] = line;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<LogLine>> InMemoryJobStore::ListLogs(absl::string_view job_id,
                                                                const LogQuery& query) {
  ASSIGN_OR_RETURN(int64_t n, ParseJobId(job_id));
  absl::MutexLock lock(&mu_);
  if (!jobs_.count(n)) return NotFound(job_id);
  const std::string id = FormatJobId(n);
  std::vector<LogLine> out;
  for (auto it = logs_.upper_bound(query.after_seq); it != logs_.end(); ++it) {
    if (it->second.job_id() == id) out.push_back(it->second);
  }
  if (query.tail > 0 && static_cast<int>(out.size()) > query.tail) {
    out.erase(out.begin(), out.end() - query.tail);
  }
  if (static_cast<int>(out.size()) > query.limit) out.resize(query.limit);
  return out;
}

absl::StatusOr<int64_t> InMemoryJobStore::LogBytes(absl::string_view job_id) {
  ASSIGN_OR_RETURN(int64_t n, ParseJobId(job_id));
  absl::MutexLock lock(&mu_);
  if (!jobs_.count(n)) return NotFound(job_id);
  const std::string id = FormatJobId(n);
  int64_t bytes = 0;
  for (const auto& [seq, line] : logs_) {
    if (line.job_id() == id) bytes += static_cast<int64_t>(line.text().size());
  }
  return bytes;
}

absl::Status InMemoryJobStore::PutNodeTopology(const trainctl::v1::NodeTopology& topology) {
  if (topology.node().empty()) {
    return absl::InvalidArgumentError("a node topology names no node");
  }
  absl::MutexLock lock(&mu_);
  topologies_[topology.node()] = topology;
  return absl::OkStatus();
}

absl::StatusOr<std::optional<trainctl::v1::NodeTopology>> InMemoryJobStore::GetNodeTopology(
    absl::string_view node) {
  absl::MutexLock lock(&mu_);
  auto it = topologies_.find(node);
  if (it == topologies_.end()) return std::nullopt;
  return it->second;
}

}  // namespace trainctl
