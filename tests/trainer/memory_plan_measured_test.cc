// The memory plan (common/memory_plan.h) against what real trainer ranks measure: each rank's
// `memory` event carries its peak (on CPU ranks the peak resident set above the one before the
// model was built), and the plan for the same spec, made for CPU ranks, must be within the stated
// band of it — SFT at ZeRO stages 0 and 3 and with tensor parallelism, GRPO, and a Qwen2.5-VL
// model.
#include <algorithm>
#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/json_proto.h"
#include "common/memory_plan.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/trainer/shapes_fixture.h"

namespace trainctl {
namespace {

using nlohmann::json;

// The band the plan must hold the measured peak in, as measured / planned. The plan counts the
// model states exactly and the busiest phase from the spec's limits: rows of max_seq_length
// tokens, every position labelled, one image at max_pixels per row. The SFT data here is made to
// meet those limits (packed rows of long answers, images at most 3136 pixels: 16 patches);
// the measured peak adds what the plan leaves out (the data loader's mapped shards, LibTorch's
// per-operator scratch).
constexpr double kLowest = 0.75, kHighest = 1.25;

// Text records whose answers are ~220 words: packed rows are nearly all labelled positions.
std::string LongAnswers() {
  std::string out;
  const char* words[] = {"the", "red", "blue", "circle", "square", "left", "above", "small"};
  for (int i = 0; i < 24; ++i) {
    std::string answer;
    for (int w = 0; w < 220; ++w)
      absl::StrAppend(&answer, w ? " " : "", words[(i * 7 + w * 3) % 8]);
    absl::StrAppend(
        &out,
        json({{"messages",
               {{{"role", "user"}, {"content", absl::StrCat("Describe scene ", i, ".")}},
                {{"role", "assistant"}, {"content", answer}}}}})
            .dump(),
        "\n");
  }
  return out;
}

class MemoryPlanMeasuredTest : public testing::ShapesTrainingTest {
 protected:
  void SetUp() override {
    testing::ShapesTrainingTest::SetUp();
    testing::RunResult prep =
        testing::Run({TRAINCTL_CLI_BIN, "prepare", "--input",
                      dir_.Write("long.jsonl", LongAnswers()), "--out", long_shards_, "--tokenizer",
                      tokenizer::testing::QwenTokenizerDir(), "--max_pixels", "3136"});
    ASSERT_EQ(prep.exit_code, 0) << prep.err;
  }

  // Runs `world` ranks of a spec built from `spec` (the fixture's shapes data), then compares
  // every rank's measured peak with the plan. Returns measured / planned of rank 0.
  double RunAndCompare(const std::string& name, int world, json spec) {
    spec["name"] = name;
    if (!spec.contains("data_path")) spec["data_path"] = long_shards_;
    spec["output_dir"] = dir_.path() + "/" + name;
    spec["resources"] = {{"nodes", 1}, {"slots_per_node", world}};
    const std::string path = dir_.Write(name + ".json", spec.dump());
    testing::TrainRanks(world, TRAINCTL_TRAINER_BIN, path, dir_.path() + "/" + name);

    auto parsed = ParseJobSpec(spec.dump(), SpecFormat::kJson, name);
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    auto validated = ValidateJobSpec(*parsed);
    EXPECT_TRUE(validated.ok()) << validated.status();
    MemoryPlanOptions options;
    options.cuda = false;
    auto plan = PlanJobMemory(validated->spec, validated->resolved_deepspeed_config_json, options);
    EXPECT_TRUE(plan.ok()) << plan.status();
    if (!plan.ok()) return 0;
    std::cout << name << ":\n" << FormatMemoryPlan(*plan);
    double first = 0;
    for (int r = 0; r < world; ++r) {
      json memory;
      for (const json& e :
           testing::ReadEvents(absl::StrCat(dir_.path(), "/", name, ".", r, ".jsonl"))) {
        if (e["type"] == "memory") memory = e;
      }
      EXPECT_TRUE(memory.is_object()) << name << " rank " << r << ": no memory event";
      if (!memory.is_object()) continue;
      EXPECT_EQ(memory["peak_source"], "rss_above_baseline");
      const double measured = memory["peak_bytes"].get<double>();
      const double ratio = measured / static_cast<double>(plan->gpu_bytes());
      std::cout << name << " rank " << r << ": measured "
                << FormatBytes(static_cast<int64_t>(measured)) << " (peak RSS "
                << FormatBytes(memory["peak_rss_bytes"].get<int64_t>()) << " - "
                << FormatBytes(memory["baseline_rss_bytes"].get<int64_t>())
                << " before the model), planned " << FormatBytes(plan->gpu_bytes())
                << ", measured / planned " << ratio << "\n";
      EXPECT_GE(ratio, kLowest) << name << " rank " << r;
      EXPECT_LE(ratio, kHighest) << name << " rank " << r;
      if (r == 0) first = ratio;
    }
    return first;
  }

  static json Sft(const std::string& model, int stage) {
    json spec = {{"kind", "sft"},
                 {"model_name_or_path", model},
                 {"training",
                  {{"per_device_train_batch_size", 2},
                   {"max_steps", 2},
                   {"max_seq_length", 256},
                   {"packing", true},  // rows filled to max_seq_length, as the plan counts
                   {"max_pixels", 3136},
                   {"save_strategy", "no"},
                   {"logging_steps", 1}}}};
    if (stage >= 0) {
      spec["deepspeed_config_json"] = json({{"zero_optimization", {{"stage", stage}}},
                                            {"train_micro_batch_size_per_gpu", "auto"},
                                            {"gradient_accumulation_steps", "auto"}})
                                          .dump();
    }
    return spec;
  }

  std::string long_shards_ = dir_.path() + "/long-shards";
};

TEST_F(MemoryPlanMeasuredTest, SftAtStagesZeroAndThree) {
  RunAndCompare("sft-stage0", 1, Sft("tiny", 0));
  RunAndCompare("sft-stage3", 2, Sft("tiny", 3));
  // Two ranks sharing each MLP (issue 27): the plan counts the MLPs' slices and ZeRO over the
  // ranks with the same tensor position.
  json tp = Sft("tiny", 3);
  tp["parallelism"] = {{"tensor_parallel_size", 2}};
  RunAndCompare("sft-tp2", 2, tp);
}

TEST_F(MemoryPlanMeasuredTest, Grpo) {
  json spec = Sft("tiny", 3);
  spec["kind"] = "grpo";
  spec["data_path"] = shards_;
  spec["reward_funcs"] = {"accuracy"};
  spec["training"] = {{"per_device_train_batch_size", 4},
                      {"gradient_accumulation_steps", 1},
                      {"num_generations", 4},
                      {"max_completion_length", 16},
                      {"max_prompt_length", 256},
                      {"max_steps", 2},
                      {"beta", 0.04},
                      {"save_strategy", "no"},
                      {"logging_steps", 1}};
  RunAndCompare("grpo", 2, spec);
}

TEST_F(MemoryPlanMeasuredTest, Qwen25VlSft) {
  RunAndCompare("qwen25vl", 1, Sft("tiny-qwen2.5-vl", 0));
}

}  // namespace
}  // namespace trainctl
