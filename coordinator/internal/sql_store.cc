#include "coordinator/internal/sql_store.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "google/protobuf/util/time_util.h"

namespace trainctl::internal {

int64_t ToMicros(const google::protobuf::Timestamp& t) {
  return google::protobuf::util::TimeUtil::TimestampToMicroseconds(t);
}

std::string JobBlob(const Job& job) {
  Job blob = job;
  blob.clear_id();
  blob.clear_stages();
  blob.clear_current_stage();
  return blob.SerializeAsString();
}

const char* EventKind(const JobEvent& e) {
  switch (e.payload_case()) {
    case JobEvent::kStateChange:
      return "state_change";
    case JobEvent::kMetric:
      return "metric";
    case JobEvent::kCheckpoint:
      return "checkpoint";
    case JobEvent::kStageChange:
      return "stage_change";
    case JobEvent::kNccl:
      return "nccl";
    case JobEvent::kBandwidth:
      return "bandwidth";
    case JobEvent::kSetup:
      return "setup";
    default:
      return "other";
  }
}

absl::Status ApplyUpdate(BatchTransaction& tx, int64_t n, const JobMutation& mutate, Job* updated,
                         std::vector<JobEvent>* events) {
  ASSIGN_OR_RETURN(*updated, tx.ReadJob(n));
  const Job before = *updated;
  events->clear();
  RETURN_IF_ERROR(mutate(updated, events));
  updated->set_id(FormatJobId(n));
  RETURN_IF_ERROR(tx.WriteJob(n, *updated, before));
  RETURN_IF_ERROR(tx.InsertEvents(n, events));
  return tx.ThinMetricEvents(n, *events);
}

absl::Status ApplyBatch(BatchTransaction& tx, std::vector<BatchRecord>* records,
                        std::map<int64_t, BatchJob>* jobs) {
  jobs->clear();  // a retry (after a full disk) starts afresh
  std::set<int64_t> missing;
  for (BatchRecord& r : *records) {
    r.status = absl::OkStatus();
    r.events.clear();
    if (r.job_id.empty()) {
      r.status = tx.InsertLogLines(&r.lines);
      if (IsTransientStoreError(r.status)) return r.status;
      continue;
    }
    absl::StatusOr<int64_t> n = ParseJobId(r.job_id);
    if (!n.ok() || missing.count(*n)) {
      r.status =
          n.ok() ? absl::NotFoundError(absl::StrCat("job ", r.job_id, " not found")) : n.status();
      continue;
    }
    auto it = jobs->find(*n);
    if (it == jobs->end()) {
      absl::StatusOr<Job> job = tx.ReadJob(*n);
      if (!job.ok()) {
        if (job.status().code() != absl::StatusCode::kNotFound) return job.status();
        missing.insert(*n);
        r.status = job.status();
        continue;
      }
      it = jobs->emplace(*n, BatchJob{*job, *job, {}}).first;
    }
    Job next = it->second.after;
    r.status = r.mutate(&next, &r.events);
    if (!r.status.ok()) continue;
    next.set_id(FormatJobId(*n));
    r.job = next;
    it->second.after = std::move(next);
    it->second.records.push_back(&r);
  }
  for (auto& [n, touched] : *jobs) {
    if (touched.records.empty()) continue;
    RETURN_IF_ERROR(tx.WriteJob(n, touched.after, touched.before));
    std::vector<JobEvent> added;
    for (BatchRecord* r : touched.records) {
      RETURN_IF_ERROR(tx.InsertEvents(n, &r->events));
      added.insert(added.end(), r->events.begin(), r->events.end());
    }
    RETURN_IF_ERROR(tx.ThinMetricEvents(n, added));
  }
  return absl::OkStatus();
}

}  // namespace trainctl::internal
