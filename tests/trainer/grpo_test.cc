// GRPO with the real parts: JSONL made here, shards by `trainctl prepare` with the real Qwen
// tokenizer, the tiny Qwen2-VL trained by real `trainctl-trainer` processes over Gloo.
//
// The task: "Which option is a vowel? A) b B) d C) e D) f" — the vowel is always option C, the
// consonants vary. A brief SFT on answers drawn at random teaches the format
// (<answer>L</answer><|im_end|>) and nothing of the answer, so the policy GRPO starts from
// guesses one of four letters (accuracy ~0.25); the accuracy reward against the true solutions
// can only rise by learning the answer. (A task whose answer depends on the question, "which
// letter follows X", is beyond what the tiny model learns in a test's few dozen steps: its
// SFT'd letter distribution is nearly the same for every question.)
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/grpc_probe.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/tokenizer/qwen_fixture.h"
#include "tests/trainer/shapes_fixture.h"
#include "worker/trainer/model/qwen2vl.h"
#include "worker/trainer/model/state_dict_adapter.h"

namespace trainctl {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::ReadEvents;
using testing::RunResult;
using testing::Subprocess;

// step -> the metric values of that step (logging_steps 1).
std::map<int64_t, json> Metrics(const std::vector<json>& events) {
  std::map<int64_t, json> out;
  for (const json& e : events) {
    if (e["type"] == "metric") out[e["step"].get<int64_t>()] = e["values"];
  }
  return out;
}

double MeanOf(const std::map<int64_t, json>& metrics, const std::string& name, int64_t first,
              int64_t last) {
  double sum = 0;
  int n = 0;
  for (int64_t s = first; s <= last; ++s) {
    sum += metrics.at(s).at(name).get<double>();
    ++n;
  }
  return sum / n;
}

class GrpoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(tokenizer::testing::QwenFixturePresent());
    const std::string letters = "ABCD";
    const std::string consonants = "bdfghkmpst";
    std::mt19937 random(3);
    std::vector<std::string> problems;
    for (int i = 0; i < 4; ++i) {
      std::string c;
      for (int j = 0; j < 3; ++j) c += consonants[random() % consonants.size()];
      problems.push_back(absl::StrCat("Which option is a vowel? A) ", c.substr(0, 1), " B) ",
                                      c.substr(1, 1), " C) e D) ", c.substr(2, 1),
                                      " Answer with the letter."));
    }
    auto record = [](const std::string& problem, char answer) {
      return absl::StrCat(
          json{{"problem", problem},
               {"solution", absl::StrCat("<answer>", std::string(1, answer), "</answer>")}}
              .dump(),
          "\n");
    };
    std::string sft, grpo;
    for (int k = 0; k < 8; ++k) {
      for (const std::string& problem : problems) {
        absl::StrAppend(&sft, record(problem, letters[random() % 4]));
        if (k < 4) absl::StrAppend(&grpo, record(problem, 'C'));
      }
    }
    Prepare(dir_.Write("sft.jsonl", sft), sft_shards_);
    Prepare(dir_.Write("grpo.jsonl", grpo), grpo_shards_);
  }

  void Prepare(const std::string& jsonl, const std::string& out) {
    RunResult prep = testing::Run({TRAINCTL_CLI_BIN, "prepare", "--input", jsonl, "--out", out,
                                   "--tokenizer", tokenizer::testing::QwenTokenizerDir()});
    ASSERT_EQ(prep.exit_code, 0) << prep.err;
  }

  std::vector<std::string> TrainArgs(const std::string& spec, const std::string& events) {
    return {TRAINCTL_TRAINER_BIN, "train", "--spec", spec, "--events", events, "--threads", "1"};
  }

  // The tiny model SFT'd on random answers: it writes the format and guesses the letter.
  std::string SftModel() {
    const json spec = {{"kind", "sft"},
                       {"name", "format"},
                       {"model_name_or_path", "tiny"},
                       {"data_path", sft_shards_},
                       {"output_dir", dir_.path() + "/sft"},
                       {"training",
                        {{"per_device_train_batch_size", 8},
                         {"learning_rate", 1e-2},
                         {"warmup_ratio", 0.1},
                         {"max_steps", 80},
                         {"logging_steps", 10},
                         {"save_strategy", "steps"},
                         {"save_steps", 80},
                         {"seed", 7}}}};
    RunResult r =
        testing::Run(TrainArgs(dir_.Write("sft.json", spec.dump()), dir_.path() + "/sft.jsonl"), {},
                     absl::Minutes(10));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return dir_.path() + "/sft/checkpoint-80";
  }

  // A GRPO spec on the letters task; `training` and `extra` override the defaults.
  std::string GrpoSpec(const std::string& name, const std::string& model, json training,
                       const json& extra = json::object()) {
    json t = {{"per_device_train_batch_size", 4},
              {"gradient_accumulation_steps", 2},
              {"num_generations", 8},
              {"max_completion_length", 12},
              {"learning_rate", 1e-3},
              {"logging_steps", 1},
              {"save_strategy", "steps"},
              {"save_steps", 4},
              {"seed", 11}};
    t.update(training);
    json spec = {{"kind", "grpo"},
                 {"name", name},
                 {"model_name_or_path", model},
                 {"data_path", grpo_shards_},
                 {"output_dir", dir_.path() + "/" + name},
                 {"reward_funcs", {"accuracy"}},
                 {"training", t}};
    spec.update(extra);
    return dir_.Write(name + ".json", spec.dump());
  }

  // Runs `world` ranks of `spec` to the end; rank 0's events.
  std::vector<json> Train(int world, const std::string& spec, const std::string& tag) {
    return testing::TrainRanks(world, TRAINCTL_TRAINER_BIN, spec, dir_.path() + "/" + tag);
  }

  testing::TempDir dir_;
  std::string sft_shards_ = dir_.path() + "/sft-shards";
  std::string grpo_shards_ = dir_.path() + "/grpo-shards";
};

// The learning check: GRPO on 2 CPU ranks with the seed's DeepSpeed config (ZeRO-3, bf16)
// raises the accuracy reward of the SFT'd policy clearly.
TEST_F(GrpoTest, RaisesTheAccuracyRewardOnTwoRanksWithTheSeedsDeepSpeedConfig) {
  const std::string model = SftModel();
  const std::string path = std::string(TRAINCTL_SOURCE_DIR) + "/configs/ds_zero3_bf16.json";
  const std::string text = testing::ReadFileOrEmpty(path);
  ASSERT_FALSE(text.empty()) << path;
  const std::string spec =
      GrpoSpec("learn", model, {{"max_steps", 24}, {"bf16", true}, {"save_steps", 24}},
               {{"deepspeed", path},
                {"deepspeed_config_json", text},
                {"resources", {{"nodes", 1}, {"slots_per_node", 2}}}});
  const auto metrics = Metrics(Train(2, spec, "learn"));
  ASSERT_EQ(metrics.size(), 24u);
  const double before = MeanOf(metrics, "rewards/accuracy/mean", 1, 4);
  const double after = MeanOf(metrics, "rewards/accuracy/mean", 21, 24);
  std::cout << "accuracy reward: steps 1-4 " << before << ", steps 21-24 " << after << "\n";
  // Measured: 0.406 -> 0.703 since `--threads 1` also holds OpenBLAS to one thread (2026-12-06;
  // before, OpenBLAS used a thread per core, and the run, 0.375 -> 0.844, depended on the core
  // count). A policy that does not learn stays near its starting 0.4.
  EXPECT_LT(before, 0.5);
  EXPECT_GT(after, before + 0.25);
  for (const char* name :
       {"reward", "reward_std", "completions/mean_length", "completions/clipped_ratio",
        "clip_ratio/region_mean", "generation/tokens_per_second", "time/generation_seconds"}) {
    EXPECT_TRUE(metrics.at(1).contains(name)) << name << ": " << metrics.at(1).dump();
  }
}

// Sampling is seeded per completion, so one rank at stage 0 draws the same rollouts as two ranks
// at stage 3 (here gathering each unit on every decoding step, in lock-step); with one
// micro-batch per rank against two on one rank, the steps agree.
TEST_F(GrpoTest, TwoRankStageThreeStepsEqualOneRankStageZero) {
  const std::string model = SftModel();
  const json common = {{"max_steps", 2}, {"beta", 0.04}, {"save_strategy", "no"}};
  json one = common, two = common;
  one["gradient_accumulation_steps"] = 2;
  two["gradient_accumulation_steps"] = 1;
  // Per-unit gathers on every decoding step: the two ranks decode in lock-step.
  two["gather_for_generation"] = false;
  const auto ds = [](int stage) {
    return json{{"zero_optimization", {{"stage", stage}}},
                {"gradient_clipping", 1.0},
                {"train_micro_batch_size_per_gpu", "auto"},
                {"gradient_accumulation_steps", "auto"}}
        .dump();
  };
  const auto a =
      Metrics(Train(1, GrpoSpec("one", model, one, {{"deepspeed_config_json", ds(0)}}), "one"));
  const auto b = Metrics(Train(2,
                               GrpoSpec("two", model, two,
                                        {{"deepspeed_config_json", ds(3)},
                                         {"resources", {{"nodes", 1}, {"slots_per_node", 2}}}}),
                               "two"));
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  for (int64_t step = 1; step <= 2; ++step) {
    for (const char* name : {"loss", "grad_norm", "reward", "kl", "completions/mean_length"}) {
      const double x = a.at(step).at(name).get<double>(), y = b.at(step).at(name).get<double>();
      EXPECT_NEAR(x, y, 1e-5 * std::max(1.0, std::abs(x))) << name << " at step " << step;
    }
  }
}

TEST_F(GrpoTest, ResumeAfterAKillContinuesFromTheCheckpoint) {
  const std::string model = SftModel();
  const json training = {
      {"max_steps", 8}, {"per_device_train_batch_size", 8}, {"gradient_accumulation_steps", 1}};
  const auto straight = Metrics(Train(1, GrpoSpec("straight", model, training), "straight"));
  ASSERT_EQ(straight.size(), 8u);

  const std::string spec = GrpoSpec("killed", model, training);
  const std::string second_events = dir_.path() + "/killed-2.jsonl";
  const auto events = testing::KillOnceAndResume(
      TrainArgs(spec, dir_.path() + "/killed-1.jsonl"), TrainArgs(spec, second_events),
      second_events, dir_.path() + "/killed/checkpoint-4", dir_.path() + "/killed/checkpoint-8",
      dir_.path() + "/killed-1.log");
  EXPECT_EQ(testing::ResumedFrom(events), 4);
  const auto after = Metrics(events);
  ASSERT_EQ(after.size(), 4u);
  for (const auto& [step, values] : after) {
    // Rollouts follow from the step number, weights and optimizer from the checkpoint.
    EXPECT_EQ(values["loss"], straight.at(step)["loss"]) << "step " << step;
    EXPECT_EQ(values["reward"], straight.at(step)["reward"]) << "step " << step;
  }
}

// num_iterations (mu) = 2: each rollout serves two optimizer steps, the second with the ratio to
// the policy that generated it.
TEST_F(GrpoTest, EachRolloutServesNumIterationsSteps) {
  const std::string model = SftModel();
  const auto m = Metrics(Train(
      1,
      GrpoSpec("mu", model,
               {{"max_steps", 4}, {"num_iterations", 2}, {"save_strategy", "no"}, {"beta", 0.04}}),
      "mu"));
  ASSERT_EQ(m.size(), 4u);
  for (int64_t step : {1, 3}) {
    // The same rollout: the same rewards and lengths; generation ran only on the first.
    EXPECT_EQ(m.at(step)["reward"], m.at(step + 1)["reward"]) << step;
    EXPECT_EQ(m.at(step)["completions/mean_length"], m.at(step + 1)["completions/mean_length"]);
    EXPECT_GT(m.at(step)["time/generation_seconds"].get<double>(), 0) << step;
    EXPECT_EQ(m.at(step + 1)["time/generation_seconds"].get<double>(), 0) << step;
    // The first step of a rollout trains the policy that generated it: ratios exactly 1,
    // nothing clipped.
    EXPECT_EQ(m.at(step)["clip_ratio/region_mean"].get<double>(), 0) << step;
  }
}

// A reward model next to a rule reward, weighted: the reported reward is the weighted sum of
// the per-function means (each completion's reward is the weighted sum of its rewards).
TEST_F(GrpoTest, RewardModelScoresAreWeightedWithTheRuleRewards) {
  const std::string model = SftModel();
  // A reward model of the policy's architecture with a score head: the SFT checkpoint's config
  // with num_labels 1, weights from a seed.
  const std::string rm = dir_.path() + "/rm";
  {
    auto config = model::LoadQwen2VLConfig(model);
    ASSERT_TRUE(config.ok()) << config.status();
    config->num_labels = 1;
    torch::manual_seed(3);
    model::Qwen2VLForConditionalGeneration net(*config);
    ASSERT_TRUE(model::SaveHfCheckpoint(net, rm).ok());
  }
  const auto m = Metrics(
      Train(2,
            GrpoSpec("rm", model,
                     {{"max_steps", 2}, {"save_strategy", "no"}, {"reward_weights", {1.0, 0.5}}},
                     {{"reward_funcs", {"accuracy"}},
                      {"reward_model_name_or_path", rm},
                      {"resources", {{"nodes", 1}, {"slots_per_node", 2}}}}),
            "rm"));
  ASSERT_EQ(m.size(), 2u);
  for (const auto& [step, v] : m) {
    const double scored = v.at("rewards/reward_model/mean").get<double>();
    EXPECT_TRUE(std::isfinite(scored)) << v.dump();
    EXPECT_NE(scored, 0) << v.dump();
    EXPECT_NEAR(v.at("reward").get<double>(),
                v.at("rewards/accuracy/mean").get<double>() + 0.5 * scored, 1e-9)
        << v.dump();
  }
}

TEST_F(GrpoTest, AnUnknownRewardIsRefusedNamingTheKnownOnes) {
  const std::string spec =
      GrpoSpec("unknown", "tiny", {{"max_steps", 1}}, {{"reward_funcs", {"accuracy", "bleu"}}});
  RunResult r = testing::Run(TrainArgs(spec, dir_.path() + "/unknown.jsonl"), {}, absl::Minutes(2));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("bleu"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("accuracy"), std::string::npos) << r.err;  // the known ones are listed
}

// Samples without a solution (here an empty one; shards older than format 2 have none) would
// make every accuracy reward 0: the job is refused, saying how many and what to do.
TEST_F(GrpoTest, SamplesWithoutSolutionsAreRefusedForAnswerRewards) {
  std::string jsonl;
  for (int i = 0; i < 4; ++i) {
    absl::StrAppend(&jsonl,
                    json{{"messages",
                          {{{"role", "user"}, {"content", absl::StrCat("q", i)}},
                           {{"role", "assistant"}, {"content", "<answer>1</answer>"}}}},
                         {"solution", ""}}
                        .dump(),
                    "\n");
  }
  const std::string shards = dir_.path() + "/no-solutions";
  Prepare(dir_.Write("no-solutions.jsonl", jsonl), shards);
  const std::string spec = GrpoSpec(
      "nosol", "tiny",
      {{"max_steps", 1}, {"per_device_train_batch_size", 8}, {"gradient_accumulation_steps", 1}},
      {{"data_path", shards}});
  RunResult r = testing::Run(TrainArgs(spec, dir_.path() + "/nosol.jsonl"), {}, absl::Minutes(2));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("4 of 4 samples have no solution"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("trainctl prepare"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace trainctl
