// JobService over real gRPC on loopback and a real SQLite file, driven through trainctl's client.
#include "coordinator/job_service.h"

#include <grpcpp/grpcpp.h>

#include <thread>

#include "cli/job_client.h"
#include "common/clock.h"
#include "coordinator/sqlite_job_store.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace trainctl {
namespace {

using trainctl::v1::JobEvent;
using trainctl::v1::JobSpec;

JobSpec SmallSpec(const std::string& name) {
  JobSpec spec;
  spec.set_name(name);
  spec.set_kind(trainctl::v1::JOB_KIND_SFT);
  spec.set_model_name_or_path("tiny");
  spec.set_data_path("/data/shapes");
  spec.set_output_dir("/out/" + name);
  return spec;
}

class JobServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SqliteJobStore::Options options;
    options.path = dir_.path() + "/jobs.db";
    options.synchronous_full = false;
    store_ = std::move(SqliteJobStore::Open(options).value());
    jobs_ = std::make_unique<JobManager>(store_.get(), &clock_);
    jobs_->AddObserver(&notifier_);
    service_ = std::make_unique<JobServiceImpl>(jobs_.get(), &notifier_, &executor_);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(port, 0);
    client_ = std::make_unique<cli::JobClient>("127.0.0.1:" + std::to_string(port));
  }
  void TearDown() override { server_->Shutdown(); }

  std::string Submit(const std::string& name) {
    trainctl::v1::SubmitJobRequest request;
    *request.mutable_spec() = SmallSpec(name);
    auto r = client_->Submit(request);
    EXPECT_TRUE(r.ok()) << r.status();
    return r->job().id();
  }

  testing::TempDir dir_;
  RealClock clock_;
  JobNotifier notifier_;
  ThreadPool executor_{4};
  std::unique_ptr<SqliteJobStore> store_;
  std::unique_ptr<JobManager> jobs_;
  std::unique_ptr<JobServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<cli::JobClient> client_;
};

TEST_F(JobServiceTest, SubmitGetListCancel) {
  const std::string a = Submit("a");
  const std::string b = Submit("b");
  auto got = client_->Get(a);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->spec().name(), "a");

  trainctl::v1::ListJobsRequest list;
  list.set_page_size(1);
  auto page = client_->List(list);
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->jobs_size(), 1);
  EXPECT_EQ(page->jobs(0).id(), b);
  list.set_page_token(page->next_page_token());
  auto page2 = client_->List(list);
  ASSERT_EQ(page2->jobs_size(), 1);
  EXPECT_EQ(page2->jobs(0).id(), a);
  EXPECT_TRUE(page2->next_page_token().empty());

  auto cancelled = client_->Cancel(a, "");
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), trainctl::v1::JOB_STATE_CANCELLED);
  list.clear_page_token();
  list.set_page_size(10);
  list.add_states(trainctl::v1::JOB_STATE_PENDING);
  EXPECT_EQ(client_->List(list)->jobs_size(), 1);
}

TEST_F(JobServiceTest, ErrorsKeepTheirCodeAndEveryLine) {
  trainctl::v1::SubmitJobRequest request;
  *request.mutable_spec() = SmallSpec("bad");
  request.mutable_spec()->mutable_resources()->set_slots_per_node(0);
  request.mutable_spec()->mutable_training()->set_learning_rate(-1);
  auto r = client_->Submit(request);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("spec.resources.slots_per_node: must be >= 1, got 0\n"),
            absl::string_view::npos)
      << r.status();
  EXPECT_NE(r.status().message().find("spec.training.learning_rate: must be > 0, got -1"),
            absl::string_view::npos)
      << r.status();
  EXPECT_EQ(client_->Get("job-77").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->Get("nonsense").status().code(), absl::StatusCode::kInvalidArgument);
  trainctl::v1::ListJobsRequest list;
  list.set_page_token("zz");
  EXPECT_EQ(client_->List(list).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(JobServiceTest, WatchReplaysThenFollowsUntilTheJobEnds) {
  const std::string id = Submit("w");
  std::vector<JobEvent> seen;
  absl::Mutex mu;
  absl::Status watch_status;
  std::thread watcher([&] {
    trainctl::v1::WatchJobRequest request;
    request.set_id(id);
    watch_status = client_->Watch(request, [&](const JobEvent& e) {
      absl::MutexLock lock(&mu);
      seen.push_back(e);
    });
  });
  auto count = [&] {
    absl::MutexLock lock(&mu);
    return seen.size();
  };
  ASSERT_TRUE(testing::WaitFor([&] { return count() == 1; }, absl::Seconds(10)));  // the replay
  ASSERT_TRUE(jobs_->Transition(id, trainctl::v1::JOB_STATE_SCHEDULED, "placed").ok());
  ASSERT_TRUE(jobs_->Transition(id, trainctl::v1::JOB_STATE_RUNNING, "").ok());
  trainctl::v1::MetricSample sample;
  sample.set_step(5);
  (*sample.mutable_values())["loss"] = 2.5;
  ASSERT_TRUE(jobs_->RecordMetric(id, sample).ok());
  trainctl::v1::Checkpoint ckpt;
  ckpt.set_step(5);
  ckpt.set_path("/out/w/checkpoint-5");
  ASSERT_TRUE(jobs_->RecordCheckpoint(id, ckpt).ok());
  ASSERT_TRUE(jobs_->Transition(id, trainctl::v1::JOB_STATE_SUCCEEDED, "").ok());
  watcher.join();  // the stream ends by itself after the terminal state
  ASSERT_TRUE(watch_status.ok()) << watch_status;
  ASSERT_EQ(seen.size(), 6u);
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_GT(seen[i].seq(), seen[i - 1].seq());
  EXPECT_EQ(seen[3].metric().step(), 5);
  EXPECT_EQ(seen[4].checkpoint().path(), "/out/w/checkpoint-5");
  EXPECT_EQ(seen[5].state_change().to(), trainctl::v1::JOB_STATE_SUCCEEDED);

  // Resuming after a seq replays only what came later; a finished job's stream ends at once.
  trainctl::v1::WatchJobRequest resume;
  resume.set_id(id);
  resume.set_after_seq(seen[3].seq());
  std::vector<JobEvent> rest;
  ASSERT_TRUE(client_->Watch(resume, [&](const JobEvent& e) { rest.push_back(e); }).ok());
  EXPECT_EQ(rest.size(), 2u);
}

TEST_F(JobServiceTest, ReplayOnlyWatchEndsOnALiveJob) {
  const std::string id = Submit("r");
  trainctl::v1::WatchJobRequest request;
  request.set_id(id);
  request.set_replay_only(true);
  int n = 0;
  ASSERT_TRUE(client_->Watch(request, [&](const JobEvent&) { ++n; }).ok());
  EXPECT_EQ(n, 1);
  request.set_id("job-404");
  EXPECT_EQ(client_->Watch(request, [](const JobEvent&) {}).code(), absl::StatusCode::kNotFound);
}

TEST_F(JobServiceTest, LogsFollowUntilTheJobEndsAndTailStartsLate) {
  const std::string id = Submit("l");
  auto append = [&](int rank, const std::string& text) {
    LogLine line;
    line.set_job_id(id);
    line.set_rank(rank);
    line.set_stream("stdout");
    line.set_text(text);
    ASSERT_TRUE(jobs_->AppendLogs({line}).ok());
  };
  append(0, "first");
  append(1, "second");
  std::vector<std::string> followed;
  absl::Mutex mu;
  std::thread follower([&] {
    trainctl::v1::StreamLogsRequest request;
    request.set_id(id);
    request.set_follow(true);
    EXPECT_TRUE(client_
                    ->Logs(request,
                           [&](const LogLine& l) {
                             absl::MutexLock lock(&mu);
                             followed.push_back(absl::StrCat(l.rank(), ":", l.text()));
                           })
                    .ok());
  });
  auto count = [&] {
    absl::MutexLock lock(&mu);
    return followed.size();
  };
  ASSERT_TRUE(testing::WaitFor([&] { return count() == 2; }, absl::Seconds(10)));
  for (int i = 0; i < 300; ++i) append(i % 2, "live " + std::to_string(i));
  ASSERT_TRUE(jobs_->Cancel(id, "").ok());
  follower.join();
  ASSERT_EQ(followed.size(), 302u);
  EXPECT_EQ(followed[0], "0:first");
  EXPECT_EQ(followed[301], "1:live 299");

  trainctl::v1::StreamLogsRequest tail;
  tail.set_id(id);
  tail.set_tail(3);
  std::vector<std::string> last;
  ASSERT_TRUE(client_->Logs(tail, [&](const LogLine& l) { last.push_back(l.text()); }).ok());
  EXPECT_EQ(last, (std::vector<std::string>{"live 297", "live 298", "live 299"}));
}

TEST_F(JobServiceTest, ManyConcurrentWatchersAllFinish) {
  const std::string id = Submit("many");
  std::vector<std::thread> watchers;
  std::atomic<int> finished{0};
  for (int i = 0; i < 16; ++i) {
    watchers.emplace_back([&] {
      cli::JobClient own(client_->addresses().front());
      trainctl::v1::WatchJobRequest request;
      request.set_id(id);
      int events = 0;
      if (own.Watch(request, [&](const JobEvent&) { ++events; }).ok() && events == 2) ++finished;
    });
  }
  ASSERT_TRUE(
      testing::WaitFor([&] { return notifier_.ListenerCount(id) == 16; }, absl::Seconds(10)));
  ASSERT_TRUE(jobs_->Cancel(id, "").ok());
  for (auto& t : watchers) t.join();
  EXPECT_EQ(finished.load(), 16);
}

}  // namespace
}  // namespace trainctl
