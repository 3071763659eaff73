// Shared by the JobStore suites: a factory per implementation and a job builder.
#ifndef TRAINCTL_TESTS_COORDINATOR_JOB_STORE_TEST_UTIL_H_
#define TRAINCTL_TESTS_COORDINATOR_JOB_STORE_TEST_UTIL_H_

#include <memory>
#include <string>

#include "coordinator/job_store.h"
#include "coordinator/metric_retention.h"
#include "coordinator/postgres_job_store.h"
#include "google/protobuf/util/time_util.h"
#include "gtest/gtest.h"
#include "tests/testing/postgres_server.h"

namespace trainctl::testing {

inline Job PendingJob(const std::string& name, int priority = 0) {
  Job job;
  job.mutable_spec()->set_name(name);
  job.mutable_spec()->set_kind(trainctl::v1::JOB_KIND_SFT);
  job.mutable_spec()->set_priority(priority);
  job.mutable_spec()->mutable_training()->set_learning_rate(2e-5);
  job.mutable_spec()->mutable_env()->insert({"NCCL_DEBUG", "INFO"});
  job.set_state(trainctl::v1::JOB_STATE_PENDING);
  *job.mutable_create_time() = google::protobuf::util::TimeUtil::SecondsToTimestamp(1'800'000'000);
  *job.mutable_update_time() = job.create_time();
  return job;
}

inline JobEvent StateEvent(trainctl::v1::JobState from, trainctl::v1::JobState to) {
  JobEvent e;
  e.mutable_state_change()->set_from(from);
  e.mutable_state_change()->set_to(to);
  return e;
}

inline LogLine Line(const std::string& job_id, int rank, const std::string& text) {
  LogLine line;
  line.set_job_id(job_id);
  line.set_rank(rank);
  line.set_stream("stdout");
  line.set_text(text);
  *line.mutable_time() = google::protobuf::util::TimeUtil::SecondsToTimestamp(1'800'000'001);
  return line;
}

// A PostgresJobStore leading a fresh database of the process's test server (SharedPostgres); null,
// with the test failed, when none could be had.
inline std::unique_ptr<JobStore> FreshPostgresStore(
    int max_metric_events = kDefaultMaxMetricEventsPerJob) {
  absl::StatusOr<PostgresServer*> server = SharedPostgres();
  if (!server.ok()) {
    ADD_FAILURE() << server.status();
    return nullptr;
  }
  absl::StatusOr<std::string> uri = (*server)->CreateDatabase();
  if (!uri.ok()) {
    ADD_FAILURE() << uri.status();
    return nullptr;
  }
  PostgresJobStore::Options options;
  options.uri = *uri;
  options.max_metric_events = max_metric_events;
  auto store = PostgresJobStore::Open(options);
  if (!store.ok()) {
    ADD_FAILURE() << store.status();
    return nullptr;
  }
  if (absl::Status s = (*store)->TryLead("test", absl::Minutes(10)); !s.ok()) {
    ADD_FAILURE() << s;
    return nullptr;
  }
  return *std::move(store);
}

}  // namespace trainctl::testing

#endif  // TRAINCTL_TESTS_COORDINATOR_JOB_STORE_TEST_UTIL_H_
