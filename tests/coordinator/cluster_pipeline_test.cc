// Pipeline jobs in the Cluster (tests/coordinator/cluster_fixture.h): stage by stage, each stage
// launched as the job it runs as; a failure restarts only the current stage; cancel stops it; a
// restarted coordinator resumes inside the current stage and never runs a finished one again.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/coordinator/cluster_fixture.h"

namespace trainctl {
namespace {

namespace v1 = trainctl::v1;
using testing::FakeWorker;
using testing::Running;

class ClusterPipelineTest : public testing::ClusterTest {
 protected:
  // sft -> eval (-> grpo with three stages) on the tiny model, one rank per stage.
  std::string SubmitPipeline(int stages = 2, int max_restarts = 0) {
    v1::JobSpec spec;
    spec.set_name("p");
    spec.set_kind(v1::JOB_KIND_PIPELINE);
    spec.set_model_name_or_path("tiny");
    spec.set_data_path("/data");
    spec.set_output_dir("/out");
    spec.set_max_restarts(max_restarts);
    const std::pair<const char*, v1::JobKind> kinds[] = {
        {"sft", v1::JOB_KIND_SFT}, {"eval", v1::JOB_KIND_EVAL}, {"rl", v1::JOB_KIND_GRPO}};
    for (int i = 0; i < stages; ++i) {
      v1::PipelineStage* stage = spec.add_stages();
      stage->set_name(kinds[i].first);
      stage->set_kind(kinds[i].second);
    }
    auto r = jobs_.Submit(spec, "");
    EXPECT_TRUE(r.ok()) << r.status();
    cluster_->Flush();
    cluster_->Flush();
    return r.ok() ? r->job.id() : "";
  }

  void Metric(FakeWorker& w, const v1::LaunchTask& launch, const std::string& json) {
    v1::WorkerMessage m;
    m.mutable_event()->set_job_id(launch.job_id());
    m.mutable_event()->set_attempt(launch.attempt());
    m.mutable_event()->set_json(json);
    Send(w, m);
  }

  // Runs the launched task to success: running, one metric, succeeded.
  void Succeed(FakeWorker& w, const v1::LaunchTask& launch, const std::string& metric_json) {
    Status(w, launch, v1::TASK_STATE_RUNNING, 1000);
    Metric(w, launch, metric_json);
    Status(w, launch, v1::TASK_STATE_SUCCEEDED);
  }

  std::vector<v1::StageChange> StageEvents(const std::string& id) {
    std::vector<v1::StageChange> out;
    const std::vector<v1::JobEvent> events = store_.ListEvents(id, 0, 1000).value();
    for (const v1::JobEvent& e : events) {
      if (e.has_stage_change()) out.push_back(e.stage_change());
    }
    return out;
  }
};

TEST_F(ClusterPipelineTest, StagesRunInOrderEachLaunchedAsTheJobItRunsAs) {
  FakeWorker a = Register("node-a", 1);
  const std::string id = SubmitPipeline();
  const v1::LaunchTask sft = OneLaunch(a);
  EXPECT_EQ(sft.task_id(), id + ".s0.0.0");
  EXPECT_EQ(sft.spec().kind(), v1::JOB_KIND_SFT);
  EXPECT_EQ(sft.spec().name(), "p/sft");
  EXPECT_EQ(sft.spec().model_name_or_path(), "tiny");
  EXPECT_EQ(sft.spec().output_dir(), "/out/sft");
  EXPECT_EQ(sft.spec().stages_size(), 0);
  Status(a, sft, v1::TASK_STATE_RUNNING, 1000);
  WaitState(id, v1::JOB_STATE_RUNNING);
  Metric(a, sft, R"({"type": "metric", "step": 4, "values": {"loss": 0.5, "total_steps": 4}})");
  EXPECT_EQ(jobs_.Get(id)->progress().step(), 4);
  Status(a, sft, v1::TASK_STATE_SUCCEEDED);

  // The next stage is placed anew, on the sft stage's output.
  const v1::LaunchTask eval = OneLaunch(a);
  EXPECT_EQ(eval.task_id(), id + ".s1.0.0");
  EXPECT_EQ(eval.attempt(), 0);
  EXPECT_EQ(eval.spec().kind(), v1::JOB_KIND_EVAL);
  EXPECT_EQ(eval.spec().model_name_or_path(), "/out/sft");
  EXPECT_EQ(eval.spec().output_dir(), "/out/eval");
  v1::Job job = jobs_.Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(job.current_stage(), 1);
  EXPECT_EQ(job.progress().step(), 0) << "progress is the current stage's";
  ASSERT_EQ(job.stages_size(), 2);
  EXPECT_EQ(job.stages(0).state(), v1::STAGE_STATE_SUCCEEDED);
  EXPECT_EQ(job.stages(0).figures().at("loss"), 0.5);
  EXPECT_EQ(job.stages(1).state(), v1::STAGE_STATE_RUNNING);
  EXPECT_EQ(job.stages(1).model_from(), "sft");

  Succeed(a, eval, R"({"type": "metric", "step": 0, "values": {"accuracy": 0.25}})");
  job = WaitState(id, v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(job.stages(1).state(), v1::STAGE_STATE_SUCCEEDED);
  EXPECT_EQ(job.stages(1).figures().at("accuracy"), 0.25);
  EXPECT_TRUE(job.stages(1).has_end_time());

  std::vector<std::string> seen;
  for (const v1::StageChange& c : StageEvents(id)) {
    seen.push_back(c.name() + " " + v1::StageState_Name(c.state()));
  }
  EXPECT_EQ(seen,
            (std::vector<std::string>{"sft STAGE_STATE_RUNNING", "sft STAGE_STATE_SUCCEEDED",
                                      "eval STAGE_STATE_RUNNING", "eval STAGE_STATE_SUCCEEDED"}));
  // Every event of the job names the stage current when it was recorded.
  const std::vector<v1::JobEvent> events = store_.ListEvents(id, 0, 1000).value();
  for (const v1::JobEvent& e : events) {
    if (!e.has_metric()) continue;
    EXPECT_EQ(e.stage(), e.metric().values().count("loss") ? "sft" : "eval");
  }
}

TEST_F(ClusterPipelineTest, AFailureRestartsOnlyTheCurrentStage) {
  FakeWorker a = Register("node-a", 1);
  const std::string id = SubmitPipeline(2, /*max_restarts=*/1);
  Succeed(a, OneLaunch(a), R"({"type": "metric", "step": 1, "values": {"loss": 0.5}})");
  const v1::LaunchTask eval = OneLaunch(a);
  const google::protobuf::Timestamp sft_end = jobs_.Get(id)->stages(0).end_time();
  Status(a, eval, v1::TASK_STATE_RUNNING, 1000);
  Status(a, eval, v1::TASK_STATE_FAILED, 0, /*failed_rank=*/0, /*exit_code=*/1);

  const v1::LaunchTask again = OneLaunch(a);
  EXPECT_EQ(again.spec().kind(), v1::JOB_KIND_EVAL) << "the sft stage does not run again";
  EXPECT_EQ(again.attempt(), 1);
  EXPECT_EQ(again.task_id(), id + ".s1.1.0");
  v1::Job job = jobs_.Get(id).value();
  EXPECT_EQ(job.current_stage(), 1);
  EXPECT_EQ(job.stages(0).state(), v1::STAGE_STATE_SUCCEEDED);
  EXPECT_EQ(job.stages(0).end_time().seconds(), sft_end.seconds());
  EXPECT_EQ(job.stages(1).state(), v1::STAGE_STATE_RUNNING);
  EXPECT_EQ(job.stages(1).restarts(), 1);

  // Out of restarts: the job fails with the stage's reason.
  Status(a, again, v1::TASK_STATE_RUNNING, 1000);
  Status(a, again, v1::TASK_STATE_FAILED, 0, /*failed_rank=*/0, /*exit_code=*/1);
  job = WaitState(id, v1::JOB_STATE_FAILED);
  EXPECT_TRUE(absl::StartsWith(job.message(), "stage eval (2/2): ")) << job.message();
  EXPECT_EQ(job.stages(0).state(), v1::STAGE_STATE_SUCCEEDED);
  EXPECT_EQ(job.stages(1).state(), v1::STAGE_STATE_FAILED);
  EXPECT_TRUE(absl::StrContains(job.stages(1).message(), "exited with code 1"))
      << job.stages(1).message();
}

TEST_F(ClusterPipelineTest, CancelMidPipelineStopsTheCurrentStage) {
  FakeWorker a = Register("node-a", 1);
  const std::string id = SubmitPipeline(3);
  Succeed(a, OneLaunch(a), R"({"type": "metric", "step": 1, "values": {"loss": 0.5}})");
  const v1::LaunchTask eval = OneLaunch(a);
  Status(a, eval, v1::TASK_STATE_RUNNING, 1000);
  WaitState(id, v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(jobs_.Cancel(id, "enough").ok());
  const std::vector<v1::CancelTask> cancels = Cancels(a);
  ASSERT_EQ(cancels.size(), 1u);
  EXPECT_EQ(cancels[0].task_id(), eval.task_id());
  Status(a, eval, v1::TASK_STATE_CANCELLED);
  const v1::Job job = WaitState(id, v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(job.stages(0).state(), v1::STAGE_STATE_SUCCEEDED);
  EXPECT_EQ(job.stages(1).state(), v1::STAGE_STATE_CANCELLED);
  EXPECT_EQ(job.stages(2).state(), v1::STAGE_STATE_PENDING) << "never reached";
  cluster_->Flush();
  EXPECT_TRUE(a.channel->Take(v1::CoordinatorMessage::kLaunch).empty());
}

TEST_F(ClusterPipelineTest, ARestartedCoordinatorResumesInsideTheCurrentStage) {
  FakeWorker a = Register("node-a", 1);
  const std::string id = SubmitPipeline(2);
  const v1::LaunchTask sft = OneLaunch(a);
  Succeed(a, sft, R"({"type": "metric", "step": 1, "values": {"loss": 0.5}})");
  const v1::LaunchTask eval = OneLaunch(a);
  Status(a, eval, v1::TASK_STATE_RUNNING, 1000);
  WaitState(id, v1::JOB_STATE_RUNNING);

  Restart();
  // The worker still runs the eval task, and still holds the sft task's end (same attempt and node
  // rank): only the eval task is the current stage's.
  v1::RunningTask ended = Running(sft.task_id(), id, 1);
  ended.set_state(v1::TASK_STATE_SUCCEEDED);
  FakeWorker a2 = Register("node-a", 1, {ended, Running(eval.task_id(), id, 1, 1000)});
  EXPECT_TRUE(Cancels(a2).empty()) << "adopted, not cancelled";
  EXPECT_TRUE(a2.channel->Take(v1::CoordinatorMessage::kLaunch).empty());
  // The sft task's end, sent again from the worker's outbox, changes nothing.
  Status(a2, sft, v1::TASK_STATE_SUCCEEDED);
  EXPECT_EQ(jobs_.Get(id)->current_stage(), 1);
  EXPECT_EQ(jobs_.Get(id)->state(), v1::JOB_STATE_RUNNING);

  Status(a2, eval, v1::TASK_STATE_SUCCEEDED);
  const v1::Job job = WaitState(id, v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(job.stages(0).state(), v1::STAGE_STATE_SUCCEEDED);
  EXPECT_EQ(job.stages(1).state(), v1::STAGE_STATE_SUCCEEDED);
  cluster_->Flush();
  EXPECT_TRUE(a2.channel->Take(v1::CoordinatorMessage::kLaunch).empty()) << "sft never again";
}

TEST_F(ClusterPipelineTest, ARestartedCoordinatorPlacesTheNextStageOfAWaitingPipeline) {
  const std::string id = SubmitPipeline(2);
  FakeWorker a = Register("node-a", 1);
  const v1::LaunchTask sft = OneLaunch(a);
  Status(a, sft, v1::TASK_STATE_RUNNING, 1000);
  WaitState(id, v1::JOB_STATE_RUNNING);
  Restart();  // with the sft stage running: its worker comes back and reports it done
  FakeWorker a2 = Register("node-a", 1, {Running(sft.task_id(), id, 1, 1000)});
  Status(a2, sft, v1::TASK_STATE_SUCCEEDED);
  const v1::LaunchTask eval = OneLaunch(a2);
  EXPECT_EQ(eval.spec().kind(), v1::JOB_KIND_EVAL);
  EXPECT_EQ(jobs_.Get(id)->current_stage(), 1);
}

}  // namespace
}  // namespace trainctl
