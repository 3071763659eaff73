// The remedy ladder (coordinator/remedy_ladder.h) as a pure function: a spec, the remedies applied
// so far and a failure in; the next remedy, or none, out. And the spec the remedies make, which
// must stay a valid spec whose DeepSpeed config agrees with it.
#include "coordinator/remedy_ladder.h"

#include <optional>
#include <vector>

#include "common/job_spec.h"
#include "common/remedies_spec.h"
#include "common/trainer_exit_codes.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/seed.h"

namespace trainctl {
namespace {

namespace v1 = trainctl::v1;

v1::JobSpec Validated(v1::JobSpec spec) {
  auto v = ValidateJobSpec(spec);
  EXPECT_TRUE(v.ok()) << v.status();
  return v.ok() ? v->spec : spec;
}

// The seed's job (micro-batch 4 x accumulation 4, ZeRO-3 with the optimizer offloaded already)
// with remedies on and room for restarts.
v1::JobSpec SeedWithRemedies() {
  v1::JobSpec spec = testing::SeedJobSpec();
  spec.set_max_restarts(5);
  spec.mutable_remedies()->set_oom(true);
  spec.mutable_remedies()->mutable_loss_spike();
  return Validated(spec);
}

AttemptFailure Oom(int attempt, int rank = 3) {
  AttemptFailure f;
  f.attempt = attempt;
  f.exit_code = kTrainerExitOutOfMemory;
  f.rank = rank;
  f.detail = "CUDA out of memory. Tried to allocate 2.00 GiB";
  return f;
}

AttemptFailure Spike(int attempt, int64_t checkpoint) {
  AttemptFailure f;
  f.attempt = attempt;
  f.exit_code = kTrainerExitLossSpike;
  f.rank = 0;
  f.detail = "loss 41.2 > 3 x median 2.1";
  f.last_checkpoint_step = checkpoint;
  return f;
}

// Runs the ladder for `failures` in turn, collecting every remedy until one is refused.
std::vector<v1::Remedy> Climb(const v1::JobSpec& spec,
                              const std::vector<AttemptFailure>& failures) {
  Remedies applied;
  std::vector<v1::Remedy> out;
  for (const AttemptFailure& f : failures) {
    std::optional<v1::Remedy> r = NextRemedy(spec, applied, f);
    if (!r) break;
    *applied.Add() = *r;
    out.push_back(*r);
  }
  return out;
}

TEST(RemedyLadderTest, OomClimbsCheckpointingThenHalfMicroBatchAndStopsWhenOffloadIsInForce) {
  const v1::JobSpec spec = SeedWithRemedies();
  const std::vector<v1::Remedy> steps = Climb(spec, {Oom(0), Oom(1), Oom(2), Oom(3)});
  ASSERT_EQ(steps.size(), 2u);  // the seed's DeepSpeed config offloads the optimizer already
  EXPECT_EQ(steps[0].attempt(), 1);
  EXPECT_EQ(steps[0].cause(), "oom");
  EXPECT_EQ(steps[0].rank(), 3);
  EXPECT_EQ(steps[0].change(), "gradient_checkpointing on");
  EXPECT_EQ(steps[0].settings().at("gradient_checkpointing"), "true");
  EXPECT_EQ(RemedyLine(steps[0]), "attempt 1: OOM on rank 3 \u2192 gradient_checkpointing on");
  EXPECT_EQ(steps[1].attempt(), 2);
  EXPECT_EQ(steps[1].settings().at("per_device_train_batch_size"), "2");
  EXPECT_EQ(steps[1].settings().at("gradient_accumulation_steps"), "8");
}

TEST(RemedyLadderTest, OomEndsWithOptimizerOffloadWhenNotInForce) {
  v1::JobSpec spec = testing::SeedJobSpec();
  spec.mutable_deepspeed_config_json()->assign(
      R"({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 4,
          "gradient_accumulation_steps": "auto", "gradient_clipping": 1.0})");
  spec.mutable_remedies()->set_oom(true);
  spec.set_max_restarts(5);
  spec = Validated(spec);
  const std::vector<v1::Remedy> steps = Climb(spec, {Oom(0), Oom(1), Oom(2), Oom(3)});
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_EQ(steps[2].change(), "offload_optimizer cpu");

  Remedies applied;
  for (const v1::Remedy& r : steps) *applied.Add() = r;
  absl::StatusOr<v1::JobSpec> remedied = ApplyRemedies(spec, applied);
  ASSERT_TRUE(remedied.ok()) << remedied.status();
  EXPECT_TRUE(remedied->training().gradient_checkpointing());
  EXPECT_EQ(remedied->training().per_device_train_batch_size(), 2);
  EXPECT_EQ(remedied->training().gradient_accumulation_steps(), 8);
  const nlohmann::json ds = nlohmann::json::parse(remedied->deepspeed_config_json());
  EXPECT_EQ(ds["zero_optimization"]["offload_optimizer"]["device"], "cpu");
  EXPECT_EQ(ds["train_micro_batch_size_per_gpu"], 2);  // explicit: follows the flag
  EXPECT_EQ(ds["gradient_accumulation_steps"], "auto");
  // Still a valid spec: the global batch is unchanged, the DeepSpeed config agrees.
  auto validated = ValidateJobSpec(*remedied);
  ASSERT_TRUE(validated.ok()) << validated.status();
  const nlohmann::json resolved = nlohmann::json::parse(validated->resolved_deepspeed_config_json);
  EXPECT_EQ(resolved["train_batch_size"], 8 * 4 * 4);
}

// With the memory plan (AttemptFailure::fits), steps whose plan does not fit are not tried alone:
// the remedy takes every step up to the first that fits, in one restart.
TEST(RemedyLadderTest, OomSkipsStepsWhoseMemoryPlanCannotFit) {
  v1::JobSpec spec = testing::SeedJobSpec();
  spec.mutable_deepspeed_config_json()->assign(
      R"({"zero_optimization": {"stage": 3}, "gradient_accumulation_steps": "auto"})");
  spec.mutable_remedies()->set_oom(true);
  spec.set_max_restarts(5);
  spec = Validated(spec);
  // Fits only with the optimizer offloaded.
  AttemptFailure failure = Oom(0);
  int asked = 0;
  failure.fits = [&asked](const v1::JobSpec& s) {
    ++asked;
    const nlohmann::json ds = nlohmann::json::parse(s.deepspeed_config_json());
    return ds["zero_optimization"].contains("offload_optimizer");
  };
  std::optional<v1::Remedy> r = NextRemedy(spec, {}, failure);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(asked, 3);
  EXPECT_EQ(r->settings().size(), 4u);  // checkpointing, micro-batch, accumulation, offload
  EXPECT_NE(r->change().find("gradient_checkpointing on; per_device_train_batch_size 4 → 2"),
            std::string::npos)
      << r->change();
  EXPECT_NE(r->change().find("fits only with all of them"), std::string::npos);
  // The first step fits: the ladder as without a plan.
  failure.fits = [](const v1::JobSpec&) { return true; };
  r = NextRemedy(spec, {}, failure);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->change(), "gradient_checkpointing on");
  // Nothing fits: the next step alone.
  failure.fits = [](const v1::JobSpec&) { return false; };
  r = NextRemedy(spec, {}, failure);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->change(), "gradient_checkpointing on");
}

TEST(RemedyLadderTest, OomSkipsWhatIsInForceAndAnOddMicroBatch) {
  v1::JobSpec spec = testing::SeedJobSpec();
  spec.clear_deepspeed();
  spec.clear_deepspeed_config_json();
  spec.mutable_training()->set_gradient_checkpointing(true);
  spec.mutable_training()->set_per_device_train_batch_size(3);
  spec.mutable_remedies()->set_oom(true);
  spec = Validated(spec);
  // Checkpointing on already, 3 cannot be halved, no DeepSpeed config to offload with: nothing.
  EXPECT_FALSE(NextRemedy(spec, {}, Oom(0)).has_value());

  spec.mutable_training()->set_per_device_train_batch_size(1);
  EXPECT_FALSE(NextRemedy(spec, {}, Oom(0)).has_value());
}

TEST(RemedyLadderTest, NothingWithoutTheSpecAskingOrForOtherFailures) {
  v1::JobSpec spec = Validated(testing::SeedJobSpec());
  EXPECT_FALSE(NextRemedy(spec, {}, Oom(0)).has_value());  // no remedies section
  EXPECT_FALSE(NextRemedy(spec, {}, Spike(0, 10)).has_value());
  spec.mutable_remedies()->set_oom(false);
  spec.mutable_remedies()->mutable_loss_spike();
  spec = Validated(spec);
  EXPECT_FALSE(NextRemedy(spec, {}, Oom(0)).has_value());  // oom off, loss_spike on
  EXPECT_TRUE(NextRemedy(spec, {}, Spike(0, 10)).has_value());
  AttemptFailure plain = Oom(0);
  plain.exit_code = 1;
  EXPECT_FALSE(NextRemedy(SeedWithRemedies(), {}, plain).has_value());
  plain.exit_code = -1;  // a signal
  EXPECT_FALSE(NextRemedy(SeedWithRemedies(), {}, plain).has_value());
}

TEST(RemedyLadderTest, LossSpikeRollsBackWithTheSeedValuesAtMostMaxRollbacksTimes) {
  const v1::JobSpec spec = SeedWithRemedies();  // max_rollbacks 2 by default
  const std::vector<v1::Remedy> steps = Climb(spec, {Spike(0, 30), Spike(1, 30), Spike(2, 40)});
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].cause(), "loss_spike");
  EXPECT_EQ(steps[0].settings().at("max_grad_norm"), "0.5");
  EXPECT_EQ(steps[0].settings().at("warmup_ratio"), "0.1");
  EXPECT_EQ(steps[0].change(),
            "rollback 1/2 to checkpoint-30, max_grad_norm 0.5, warmup_ratio 0.1");
  EXPECT_EQ(steps[1].change(),
            "rollback 2/2 to checkpoint-30, max_grad_norm 0.5, warmup_ratio 0.1");

  // An OOM ladder between spikes does not count as a rollback, and vice versa.
  const std::vector<v1::Remedy> mixed = Climb(spec, {Spike(0, 0), Oom(1), Spike(2, 5)});
  ASSERT_EQ(mixed.size(), 3u);
  EXPECT_EQ(mixed[0].change(), "rollback 1/2 to the start, max_grad_norm 0.5, warmup_ratio 0.1");
  EXPECT_EQ(mixed[1].change(), "gradient_checkpointing on");

  Remedies applied;
  *applied.Add() = steps[0];
  absl::StatusOr<v1::JobSpec> remedied = ApplyRemedies(spec, applied);
  ASSERT_TRUE(remedied.ok()) << remedied.status();
  EXPECT_DOUBLE_EQ(remedied->training().max_grad_norm(), 0.5);
  EXPECT_DOUBLE_EQ(remedied->training().warmup_ratio(), 0.1);
  EXPECT_EQ(remedied->training().warmup_steps(), 0);
  // The seed's explicit gradient_clipping 1.0 follows, or the config would contradict the flag.
  EXPECT_EQ(nlohmann::json::parse(remedied->deepspeed_config_json())["gradient_clipping"], 0.5);
  EXPECT_TRUE(ValidateJobSpec(*remedied).ok()) << ValidateJobSpec(*remedied).status();
}

TEST(RemedyLadderTest, LossSpikeKeepsAJobsLowerClippingAndLongerWarmup) {
  v1::JobSpec spec = SeedWithRemedies();
  spec.mutable_training()->set_max_grad_norm(0.2);
  spec.mutable_training()->set_warmup_ratio(0.3);
  std::optional<v1::Remedy> r = NextRemedy(spec, {}, Spike(0, 10));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->settings().at("max_grad_norm"), "0.2");
  EXPECT_EQ(r->settings().at("warmup_ratio"), "0.3");
}

TEST(RemedyLadderTest, ApplyRemediesRejectsWhatItDoesNotKnow) {
  Remedies bad;
  (*bad.Add()->mutable_settings())["learning_rate"] = "1";
  EXPECT_EQ(ApplyRemedies(SeedWithRemedies(), bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  Remedies unparsable;
  (*unparsable.Add()->mutable_settings())["per_device_train_batch_size"] = "two";
  EXPECT_EQ(ApplyRemedies(SeedWithRemedies(), unparsable).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ApplyRemedies(SeedWithRemedies(), {}).ok());
}

}  // namespace
}  // namespace trainctl
