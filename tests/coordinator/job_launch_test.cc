// What a job's ranks run (coordinator/job_launch.h): the stored spec as it is, the spec with its
// remedies, or a pipeline's current stage.
#include "coordinator/job_launch.h"

#include "common/job_spec.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/seed.h"

namespace trainctl {
namespace {

namespace v1 = trainctl::v1;

v1::Job StoredJob(v1::JobSpec spec) {
  absl::StatusOr<ValidatedJobSpec> validated = ValidateJobSpec(spec);
  EXPECT_TRUE(validated.ok()) << validated.status();
  v1::Job job;
  job.set_id("job-1");
  *job.mutable_spec() = validated->spec;
  job.set_resolved_deepspeed_config_json(validated->resolved_deepspeed_config_json);
  return job;
}

TEST(JobLaunchTest, AJobWithoutRemediesRunsItsStoredSpecAndConfig) {
  const v1::Job job = StoredJob(testing::SeedJobSpec());
  absl::StatusOr<JobLaunch> launch = ResolveJobLaunch(job);
  ASSERT_TRUE(launch.ok()) << launch.status();
  EXPECT_EQ(launch->spec.SerializeAsString(), job.spec().SerializeAsString());
  EXPECT_EQ(launch->resolved_deepspeed_config, job.resolved_deepspeed_config_json());
}

TEST(JobLaunchTest, RemediesAreAppliedAndTheConfigResolvedAgain) {
  v1::JobSpec spec = testing::SeedJobSpec();
  spec.set_max_restarts(3);
  spec.mutable_remedies()->mutable_loss_spike();
  v1::Job job = StoredJob(spec);
  v1::Remedy* remedy = job.add_remedies();
  remedy->set_attempt(1);
  remedy->set_cause("loss_spike");
  (*remedy->mutable_settings())["max_grad_norm"] = "0.5";
  absl::StatusOr<JobLaunch> launch = ResolveJobLaunch(job);
  ASSERT_TRUE(launch.ok()) << launch.status();
  EXPECT_DOUBLE_EQ(launch->spec.training().max_grad_norm(), 0.5);
  EXPECT_EQ(nlohmann::json::parse(launch->resolved_deepspeed_config)["gradient_clipping"], 0.5);
}

TEST(JobLaunchTest, ARemedyThatCannotApplyIsAnError) {
  v1::Job job = StoredJob(testing::SeedJobSpec());
  (*job.add_remedies()->mutable_settings())["learning_rate"] = "1";
  EXPECT_FALSE(ResolveJobLaunch(job).ok());
}

}  // namespace
}  // namespace trainctl
