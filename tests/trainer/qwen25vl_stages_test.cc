// Qwen2.5-VL through the trainer's stages with real ranks over Gloo: ZeRO-3 SFT on 2 ranks equals
// one rank at stage 0, the sharded checkpoint resumes on another world size and exports an HF
// folder of the 2.5 family; a GRPO run on 2 ranks; logit distillation from a Qwen2-VL teacher
// into a Qwen2.5-VL student (the two share the tokenizer). The tiny-qwen2.5-vl config, shapes data.
#include <cmath>
#include <filesystem>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/trainer/shapes_fixture.h"

namespace trainctl {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr char kModel[] = "tiny-qwen2.5-vl";

class Qwen25VlStagesTest : public testing::ShapesTrainingTest {
 protected:
  std::string Spec(const std::string& name, int world, int stage, int batch, json training,
                   json extra = json::object()) {
    json t = {{"per_device_train_batch_size", batch},
              {"gradient_accumulation_steps", 1},
              {"max_steps", 4},
              {"save_strategy", "no"},
              {"logging_steps", 1}};
    t.update(training);
    json ds = {{"zero_optimization",
                {{"stage", stage}, {"stage3_gather_16bit_weights_on_model_save", true}}},
               {"train_micro_batch_size_per_gpu", "auto"},
               {"gradient_accumulation_steps", "auto"}};
    extra.update({{"model_name_or_path", kModel},
                  {"deepspeed_config_json", ds.dump()},
                  {"resources", {{"nodes", 1}, {"slots_per_node", world}}}},
                 /*merge_objects=*/false);
    if (!extra.contains("kind")) extra["kind"] = "sft";
    return WriteSpec(name, dir_.path() + "/" + name, t, extra);
  }

  std::map<int64_t, double> Train(int world, const std::string& spec, const std::string& tag) {
    return testing::Losses(
        testing::TrainRanks(world, TRAINCTL_TRAINER_BIN, spec, dir_.path() + "/" + tag));
  }

  static void ExpectClose(const std::map<int64_t, double>& reference,
                          const std::map<int64_t, double>& got, const std::string& what) {
    testing::ExpectLossesClose(reference, got, what);
  }
};

TEST_F(Qwen25VlStagesTest, ZeroThreeOnTwoRanksResumesElsewhereAndExportsTheFamily) {
  const json save = {{"save_strategy", "steps"}, {"save_steps", 2}};
  const auto one = Train(1, Spec("one", 1, 0, 4, save), "one");
  ASSERT_EQ(one.size(), 4u);
  const auto two = Train(2, Spec("two", 2, 3, 2, save), "two");
  ExpectClose(one, two, "2 ranks at stage 3");

  // The 2-rank stage-3 checkpoint of step 2, resumed on one rank at stage 0.
  fs::copy(dir_.path() + "/two", dir_.path() + "/back", fs::copy_options::recursive);
  fs::remove_all(dir_.path() + "/back/checkpoint-4");
  const auto resumed = Train(1, Spec("back", 1, 0, 4, save), "back");
  ExpectClose(std::map<int64_t, double>(one.find(3), one.end()), resumed, "resumed on 1 rank");

  const std::string out = dir_.path() + "/exported";
  testing::RunResult r =
      testing::Run({TRAINCTL_TRAINER_BIN, "export", dir_.path() + "/two/checkpoint-4", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json config = json::parse(testing::ReadFileOrEmpty(out + "/config.json"));
  EXPECT_EQ(config["model_type"], "qwen2_5_vl");
  EXPECT_EQ(config["architectures"][0], "Qwen2_5_VLForConditionalGeneration");
  EXPECT_EQ(config["vision_config"]["window_size"], 56);
}

TEST_F(Qwen25VlStagesTest, GrpoOnTwoRanksAndDistillationFromAQwen2VlTeacher) {
  const auto grpo = Train(
      2,
      Spec("grpo", 2, 3, 4,
           {{"num_generations", 4}, {"max_completion_length", 8}, {"max_steps", 2}, {"beta", 0.04}},
           {{"kind", "grpo"}, {"reward_funcs", {"accuracy", "format"}}}),
      "grpo");
  ASSERT_EQ(grpo.size(), 2u);
  for (const auto& [step, loss] : grpo) EXPECT_TRUE(std::isfinite(loss)) << step;

  const auto kd = Train(1,
                        Spec("kd", 1, 0, 4, {{"distill_loss", "forward_kl"}, {"max_steps", 2}},
                             {{"kind", "distill"}, {"teacher_model_name_or_path", "tiny"}}),
                        "kd");
  ASSERT_EQ(kd.size(), 2u);
  for (const auto& [step, loss] : kd) EXPECT_TRUE(std::isfinite(loss) && loss > 0) << step;
}

}  // namespace
}  // namespace trainctl
