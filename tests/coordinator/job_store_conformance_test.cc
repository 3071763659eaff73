// One suite, every JobStore implementation: what callers may rely on whichever store is behind.
#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <tuple>

#include "coordinator/in_memory_job_store.h"
#include "coordinator/sqlite_job_store.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/coordinator/job_store_test_util.h"
#include "tests/testing/temp_dir.h"

namespace trainctl {
namespace {

using google::protobuf::util::MessageDifferencer;
using testing::Line;
using testing::PendingJob;
using testing::StateEvent;
using trainctl::v1::JOB_STATE_PENDING;
using trainctl::v1::JOB_STATE_SCHEDULED;
using trainctl::v1::JOB_STATE_UNSPECIFIED;

struct StoreFactory {
  std::string name;
  std::function<std::unique_ptr<JobStore>(const std::string& dir)> make;
};

class JobStoreConformanceTest : public ::testing::TestWithParam<StoreFactory> {
 protected:
  void SetUp() override {
    store_ = GetParam().make(dir_.path());
    ASSERT_NE(store_, nullptr);
  }
  testing::TempDir dir_;
  std::unique_ptr<JobStore> store_;
};

TEST_P(JobStoreConformanceTest, CreateAssignsIdsInOrderAndGetReturnsTheJob) {
  auto a = store_->CreateJob(PendingJob("a"), "", {});
  auto b = store_->CreateJob(PendingJob("b"), "", {});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->job.id(), "job-1");
  EXPECT_EQ(b->job.id(), "job-2");
  EXPECT_TRUE(a->created);
  auto got = store_->GetJob("job-2");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(MessageDifferencer::Equals(*got, b->job)) << got->DebugString();
  EXPECT_EQ(store_->GetJob("2")->spec().name(), "b");  // bare numbers are ids too
}

TEST_P(JobStoreConformanceTest, RequestIdMakesCreateIdempotent) {
  auto first = store_->CreateJob(PendingJob("first"), "req-1",
                                 {StateEvent(JOB_STATE_UNSPECIFIED, JOB_STATE_PENDING)});
  auto again = store_->CreateJob(PendingJob("second"), "req-1",
                                 {StateEvent(JOB_STATE_UNSPECIFIED, JOB_STATE_PENDING)});
  ASSERT_TRUE(first.ok() && again.ok());
  EXPECT_FALSE(again->created);
  EXPECT_EQ(again->job.id(), first->job.id());
  EXPECT_EQ(again->job.spec().name(), "first");
  EXPECT_EQ(store_->ListJobs({})->jobs.size(), 1u);
  EXPECT_EQ(store_->ListEvents(first->job.id(), 0, 100)->size(), 1u);  // no second creation event
}

TEST_P(JobStoreConformanceTest, UnknownAndMalformedIds) {
  EXPECT_EQ(store_->GetJob("job-7").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->GetJob("job-x").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->GetJob("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->ListEvents("job-7", 0, 10).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->ListLogs("job-7", {}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->LogBytes("job-7").status().code(), absl::StatusCode::kNotFound);
}

TEST_P(JobStoreConformanceTest, ListIsNewestFirstWithPagesAndStateFilter) {
  for (int i = 1; i <= 7; ++i) {
    Job job = PendingJob("j" + std::to_string(i));
    if (i % 2 == 0) job.set_state(JOB_STATE_SCHEDULED);
    ASSERT_TRUE(store_->CreateJob(job, "", {}).ok());
  }
  JobFilter filter;
  filter.page_size = 3;
  auto p1 = store_->ListJobs(filter);
  ASSERT_TRUE(p1.ok());
  ASSERT_EQ(p1->jobs.size(), 3u);
  EXPECT_EQ(p1->jobs[0].id(), "job-7");
  EXPECT_EQ(p1->jobs[2].id(), "job-5");
  filter.before_id = p1->next_before_id;
  auto p2 = store_->ListJobs(filter);
  ASSERT_EQ(p2->jobs.size(), 3u);
  EXPECT_EQ(p2->jobs[0].id(), "job-4");
  filter.before_id = p2->next_before_id;
  auto p3 = store_->ListJobs(filter);
  ASSERT_EQ(p3->jobs.size(), 1u);
  EXPECT_EQ(p3->jobs[0].id(), "job-1");
  EXPECT_EQ(p3->next_before_id, 0);

  JobFilter scheduled;
  scheduled.states = {JOB_STATE_SCHEDULED};
  auto s = store_->ListJobs(scheduled);
  ASSERT_EQ(s->jobs.size(), 3u);
  for (const Job& job : s->jobs) EXPECT_EQ(job.state(), JOB_STATE_SCHEDULED);

  JobFilter exact;
  exact.page_size = 7;
  auto all = store_->ListJobs(exact);
  EXPECT_EQ(all->jobs.size(), 7u);
  EXPECT_EQ(all->next_before_id, 0);  // a full last page says there is no next one
}

TEST_P(JobStoreConformanceTest, CountJobsGroupsByStateAndKindAndFollowsUpdates) {
  auto count = [&] {
    std::vector<std::tuple<int, int, int64_t>> out;
    auto counts = store_->CountJobs();
    EXPECT_TRUE(counts.ok()) << counts.status();
    if (counts.ok()) {
      for (const JobCount& c : *counts) out.emplace_back(c.state, c.kind, c.count);
    }
    return out;
  };
  EXPECT_TRUE(count().empty());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(store_->CreateJob(PendingJob("sft"), "", {}).ok());
  Job grpo = PendingJob("grpo");
  grpo.mutable_spec()->set_kind(trainctl::v1::JOB_KIND_GRPO);
  ASSERT_TRUE(store_->CreateJob(grpo, "", {}).ok());
  const JobMutation schedule = [](Job* job, std::vector<JobEvent>*) {
    job->set_state(JOB_STATE_SCHEDULED);
    return absl::OkStatus();
  };
  ASSERT_TRUE(store_->UpdateJob("job-2", schedule, nullptr).ok());
  using T = std::tuple<int, int, int64_t>;
  EXPECT_EQ(count(), (std::vector<T>{T{JOB_STATE_PENDING, trainctl::v1::JOB_KIND_SFT, 2},
                                     T{JOB_STATE_PENDING, trainctl::v1::JOB_KIND_GRPO, 1},
                                     T{JOB_STATE_SCHEDULED, trainctl::v1::JOB_KIND_SFT, 1}}));
}

TEST_P(JobStoreConformanceTest, UpdateAppliesMutationAndNumbersEventsAcrossJobs) {
  auto a = store_->CreateJob(PendingJob("a"), "",
                             {StateEvent(JOB_STATE_UNSPECIFIED, JOB_STATE_PENDING)});
  auto b = store_->CreateJob(PendingJob("b"), "",
                             {StateEvent(JOB_STATE_UNSPECIFIED, JOB_STATE_PENDING)});
  std::vector<JobEvent> appended;
  auto updated = store_->UpdateJob(
      a->job.id(),
      [](Job* job, std::vector<JobEvent>* events) {
        job->set_state(JOB_STATE_SCHEDULED);
        job->set_id("job-999");  // ignored: ids belong to the store
        events->push_back(StateEvent(JOB_STATE_PENDING, JOB_STATE_SCHEDULED));
        return absl::OkStatus();
      },
      &appended);
  ASSERT_TRUE(updated.ok()) << updated.status();
  EXPECT_EQ(updated->id(), "job-1");
  EXPECT_EQ(updated->state(), JOB_STATE_SCHEDULED);
  ASSERT_EQ(appended.size(), 1u);
  EXPECT_EQ(appended[0].seq(), 3);  // 1 and 2 were the creation events
  EXPECT_EQ(appended[0].job_id(), "job-1");
  EXPECT_EQ(store_->GetJob("job-1")->state(), JOB_STATE_SCHEDULED);

  auto events = store_->ListEvents("job-1", 0, 100);
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[0].seq(), 1);
  EXPECT_EQ((*events)[1].seq(), 3);
  EXPECT_EQ((*events)[1].state_change().to(), JOB_STATE_SCHEDULED);
  EXPECT_EQ(store_->ListEvents("job-1", 1, 100)->size(), 1u);
  EXPECT_EQ(store_->ListEvents("job-1", 0, 1)->size(), 1u);
  EXPECT_EQ(store_->ListEvents(b->job.id(), 0, 100)->size(), 1u);
}

TEST_P(JobStoreConformanceTest, FailedMutationWritesNothing) {
  ASSERT_TRUE(store_->CreateJob(PendingJob("a"), "", {}).ok());
  auto result = store_->UpdateJob(
      "job-1",
      [](Job* job, std::vector<JobEvent>* events) {
        job->set_state(JOB_STATE_SCHEDULED);
        events->push_back(StateEvent(JOB_STATE_PENDING, JOB_STATE_SCHEDULED));
        return absl::FailedPreconditionError("no");
      },
      nullptr);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->GetJob("job-1")->state(), JOB_STATE_PENDING);
  EXPECT_TRUE(store_->ListEvents("job-1", 0, 10)->empty());
  EXPECT_EQ(store_
                ->UpdateJob(
                    "job-5", [](Job*, std::vector<JobEvent>*) { return absl::OkStatus(); }, nullptr)
                .status()
                .code(),
            absl::StatusCode::kNotFound);
}

// A pipeline's stages and its current stage are part of the job: created, updated (one stage
// at a time), read and listed as they were written.
TEST_P(JobStoreConformanceTest, PipelineStagesRoundTrip) {
  Job pipeline = PendingJob("p");
  pipeline.mutable_spec()->set_kind(trainctl::v1::JOB_KIND_PIPELINE);
  for (const char* name : {"sft", "eval", "rl"}) {
    trainctl::v1::StageStatus* stage = pipeline.add_stages();
    stage->set_name(name);
    stage->set_kind(trainctl::v1::JOB_KIND_SFT);
    stage->set_state(trainctl::v1::STAGE_STATE_PENDING);
    stage->set_output_dir(std::string("/out/") + name);
  }
  pipeline.mutable_stages(1)->set_model_from("sft");
  auto created = store_->CreateJob(pipeline, "", {});
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_TRUE(MessageDifferencer::Equals(*store_->GetJob(created->job.id()), created->job));

  auto updated = store_->UpdateJob(
      created->job.id(),
      [](Job* job, std::vector<JobEvent>*) {
        job->mutable_stages(0)->set_state(trainctl::v1::STAGE_STATE_SUCCEEDED);
        (*job->mutable_stages(0)->mutable_figures())["loss"] = 0.25;
        job->mutable_stages(1)->set_state(trainctl::v1::STAGE_STATE_RUNNING);
        job->set_current_stage(1);
        return absl::OkStatus();
      },
      nullptr);
  ASSERT_TRUE(updated.ok()) << updated.status();
  auto got = store_->GetJob(created->job.id());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(MessageDifferencer::Equals(*got, *updated)) << got->DebugString();
  EXPECT_EQ(got->current_stage(), 1);
  EXPECT_EQ(got->stages(0).figures().at("loss"), 0.25);
  EXPECT_EQ(got->stages(2).output_dir(), "/out/rl");

  ASSERT_TRUE(store_->CreateJob(PendingJob("plain"), "", {}).ok());
  auto page = store_->ListJobs({});
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->jobs.size(), 2u);
  EXPECT_EQ(page->jobs[0].stages_size(), 0);
  EXPECT_TRUE(MessageDifferencer::Equals(page->jobs[1], *updated)) << page->jobs[1].DebugString();
}

TEST_P(JobStoreConformanceTest, LogsAppendInOrderWithTailAndLimit) {
  ASSERT_TRUE(store_->CreateJob(PendingJob("a"), "", {}).ok());
  ASSERT_TRUE(store_->CreateJob(PendingJob("b"), "", {}).ok());
  std::vector<LogLine> lines;
  for (int i = 0; i < 10; ++i)
    lines.push_back(Line(i % 2 ? "job-1" : "2", i % 3, "line " + std::to_string(i)));
  ASSERT_TRUE(store_->AppendLogs(&lines).ok());
  EXPECT_EQ(lines[0].job_id(), "job-2");  // normalised
  EXPECT_LT(lines[0].seq(), lines[9].seq());

  auto job1 = store_->ListLogs("job-1", {});
  ASSERT_EQ(job1->size(), 5u);
  EXPECT_EQ((*job1)[0].text(), "line 1");
  EXPECT_EQ((*job1)[4].text(), "line 9");
  EXPECT_EQ((*job1)[4].rank(), 0);
  EXPECT_EQ((*job1)[4].stream(), "stdout");
  EXPECT_EQ((*job1)[4].time().seconds(), 1'800'000'001);

  LogQuery tail;
  tail.tail = 2;
  auto last = store_->ListLogs("job-1", tail);
  ASSERT_EQ(last->size(), 2u);
  EXPECT_EQ((*last)[0].text(), "line 7");
  EXPECT_EQ((*last)[1].text(), "line 9");

  LogQuery after;
  after.after_seq = (*job1)[2].seq();
  after.limit = 1;
  auto next = store_->ListLogs("job-1", after);
  ASSERT_EQ(next->size(), 1u);
  EXPECT_EQ((*next)[0].text(), "line 7");
}

TEST_P(JobStoreConformanceTest, LogBytesCountsTheTextOfOneJobInBytes) {
  ASSERT_TRUE(store_->CreateJob(PendingJob("a"), "", {}).ok());
  ASSERT_TRUE(store_->CreateJob(PendingJob("b"), "", {}).ok());
  EXPECT_EQ(*store_->LogBytes("job-1"), 0);
  // "\xC3\xA9" is one character of two bytes: bytes are counted, not characters.
  std::vector<LogLine> lines = {Line("job-1", 0, "caf\xC3\xA9"), Line("job-2", 0, "other"),
                                Line("job-1", 1, "")};
  ASSERT_TRUE(store_->AppendLogs(&lines).ok());
  EXPECT_EQ(*store_->LogBytes("job-1"), 5);
  EXPECT_EQ(*store_->LogBytes("job-2"), 5);
}

TEST_P(JobStoreConformanceTest, LogsForAnUnknownJobWriteNothing) {
  ASSERT_TRUE(store_->CreateJob(PendingJob("a"), "", {}).ok());
  std::vector<LogLine> lines = {Line("job-1", 0, "ok"), Line("job-9", 0, "lost")};
  EXPECT_EQ(store_->AppendLogs(&lines).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(store_->ListLogs("job-1", {})->empty());
}

TEST_P(JobStoreConformanceTest, ConcurrentCreatesAndUpdatesLoseNothing) {
  constexpr int kThreads = 8, kPerThread = 25;
  std::vector<std::thread> threads;
  std::vector<std::vector<std::string>> ids(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const std::string name = "t" + std::to_string(t) + "-" + std::to_string(i);
        auto created = store_->CreateJob(PendingJob(name), name,
                                         {StateEvent(JOB_STATE_UNSPECIFIED, JOB_STATE_PENDING)});
        ASSERT_TRUE(created.ok()) << created.status();
        ids[t].push_back(created->job.id());
        auto updated = store_->UpdateJob(
            created->job.id(),
            [](Job* job, std::vector<JobEvent>* events) {
              job->set_state(JOB_STATE_SCHEDULED);
              events->push_back(StateEvent(JOB_STATE_PENDING, JOB_STATE_SCHEDULED));
              return absl::OkStatus();
            },
            nullptr);
        ASSERT_TRUE(updated.ok()) << updated.status();
      }
    });
  }
  for (auto& t : threads) t.join();
  JobFilter all;
  all.page_size = 1000;
  auto page = store_->ListJobs(all);
  ASSERT_EQ(page->jobs.size(), static_cast<size_t>(kThreads * kPerThread));
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPerThread; ++i) {
      auto job = store_->GetJob(ids[t][i]);
      ASSERT_TRUE(job.ok());
      EXPECT_EQ(job->spec().name(), "t" + std::to_string(t) + "-" + std::to_string(i));
      EXPECT_EQ(job->state(), JOB_STATE_SCHEDULED);
      EXPECT_EQ(store_->ListEvents(ids[t][i], 0, 10)->size(), 2u);
    }
  }
}

TEST_P(JobStoreConformanceTest, NodeTopologyKeepsTheLatestProbePerNode) {
  auto none = store_->GetNodeTopology("gpu-1");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->has_value());

  trainctl::v1::NodeTopology first;
  first.set_node("gpu-1");
  first.mutable_probe_time()->set_seconds(100);
  first.add_gpus()->set_name("NVIDIA H100 80GB HBM3");
  first.add_probe_errors("nvidia-smi topo -m failed");
  ASSERT_TRUE(store_->PutNodeTopology(first).ok());
  trainctl::v1::NodeTopology other;
  other.set_node("gpu-2");
  other.set_gpudirect_rdma(true);
  ASSERT_TRUE(store_->PutNodeTopology(other).ok());

  auto got = store_->GetNodeTopology("gpu-1");
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status();
  EXPECT_TRUE(MessageDifferencer::Equals(**got, first));

  trainctl::v1::NodeTopology second = first;
  second.mutable_probe_time()->set_seconds(200);
  second.clear_probe_errors();
  (*second.mutable_nccl_env())["NCCL_IB_HCA"] = "mlx5_0";
  ASSERT_TRUE(store_->PutNodeTopology(second).ok());
  got = store_->GetNodeTopology("gpu-1");
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_TRUE(MessageDifferencer::Equals(**got, second));
  EXPECT_TRUE((*store_->GetNodeTopology("gpu-2"))->gpudirect_rdma());

  trainctl::v1::NodeTopology nameless;
  EXPECT_EQ(store_->PutNodeTopology(nameless).code(), absl::StatusCode::kInvalidArgument);
}

// Concurrent writers share a transaction in the SQL stores: one that fails does not undo the
// others.
TEST_P(JobStoreConformanceTest, AFailingWriterAmongConcurrentOnesDoesNotUndoTheOthers) {
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(store_->CreateJob(PendingJob("j"), "", {}).ok());
  std::vector<std::thread> threads;
  std::atomic<int> failed{0};
  for (int i = 1; i <= 40; ++i) {
    threads.emplace_back([&, i] {
      auto r = store_->UpdateJob(
          FormatJobId(i),
          [i](Job* job, std::vector<JobEvent>* events) {
            job->set_message("touched");
            events->push_back(
                StateEvent(trainctl::v1::JOB_STATE_PENDING, trainctl::v1::JOB_STATE_PENDING));
            return i % 4 == 0 ? absl::AbortedError("odd one out") : absl::OkStatus();
          },
          nullptr);
      if (!r.ok()) ++failed;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failed.load(), 10);
  for (int i = 1; i <= 40; ++i) {
    auto job = store_->GetJob(FormatJobId(i));
    EXPECT_EQ(job->message(), i % 4 == 0 ? "" : "touched") << i;
    EXPECT_EQ(store_->ListEvents(FormatJobId(i), 0, 10)->size(), i % 4 == 0 ? 0u : 1u) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllStores, JobStoreConformanceTest,
    ::testing::Values(
        StoreFactory{"InMemory",
                     [](const std::string&) -> std::unique_ptr<JobStore> {
                       return std::make_unique<InMemoryJobStore>();
                     }},
        StoreFactory{"Sqlite",
                     [](const std::string& dir) -> std::unique_ptr<JobStore> {
                       SqliteJobStore::Options options;
                       options.path = dir + "/jobs.db";
                       options.synchronous_full = false;  // same semantics; fsync only slows tests
                       return std::move(SqliteJobStore::Open(options).value());
                     }},
        StoreFactory{"Postgres", [](const std::string&) { return testing::FreshPostgresStore(); }}),
    [](const ::testing::TestParamInfo<StoreFactory>& param_info) { return param_info.param.name; });

}  // namespace
}  // namespace trainctl
