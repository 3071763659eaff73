// Megatron-style tensor parallelism of the decoder's MLPs and attention heads (issue 27) with real
// trainer ranks over Gloo: a group of ranks sharing each batch, each holding a slice of every MLP
// and its share of every attention's heads (or of the MLPs only), trains as one rank holding
// everything — text and image batches, ZeRO stages 0 and 3, data x tensor parallel and sequence x
// tensor parallel on 4 ranks, gradient checkpointing, logit distillation with the teacher on the
// mesh too, GRPO with its rollouts and reference model on it — and its checkpoints and HF weights
// are the whole model's: they resume at another tensor-parallel size and hold the same tensors as
// a run without it.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/trainer/shapes_fixture.h"
#include "worker/trainer/model/qwen2vl.h"
#include "worker/trainer/model/state_dict_adapter.h"

namespace trainctl {
namespace {

using nlohmann::json;

// A safetensors file's float32 tensors by name, with their shapes (read here byte by byte: the
// test holds the trainer's writer to the format, not to itself).
struct Tensors {
  std::map<std::string, std::vector<int64_t>> shapes;
  std::map<std::string, std::vector<float>> values;
};

Tensors ReadFloatTensors(const std::string& path) {
  Tensors out;
  const std::string bytes = testing::ReadFileOrEmpty(path);
  if (bytes.size() < 8) return out;
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  const json header = json::parse(bytes.substr(8, header_size), nullptr, false);
  if (!header.is_object()) return out;
  const char* data = bytes.data() + 8 + header_size;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__" || info["dtype"] != "F32") continue;
    const int64_t begin = info["data_offsets"][0], end = info["data_offsets"][1];
    std::vector<float> v(static_cast<size_t>(end - begin) / sizeof(float));
    std::memcpy(v.data(), data + begin, static_cast<size_t>(end - begin));
    out.shapes[name] = info["shape"].get<std::vector<int64_t>>();
    out.values[name] = std::move(v);
  }
  return out;
}

class TensorParallelTest : public testing::ShapesTrainingTest {
 protected:
  // An SFT spec of `world` ranks (one node) with tensor_parallel_size `tp` and
  // sequence_parallel_size `sp`.
  std::string Spec(const std::string& name, int world, int tp, int sp, int stage, int batch,
                   const json& training = json::object(), bool vocab_parallel = false) {
    json t = {{"per_device_train_batch_size", batch},
              {"gradient_accumulation_steps", 1},
              {"max_steps", 6},
              {"save_strategy", "no"},
              {"logging_steps", 1},
              {"max_grad_norm", 0.05},  // clips every step: the norm must be the whole model's
              {"ddp_timeout", 60}};
    t.update(training);
    const json extra = {
        {"resources", {{"nodes", 1}, {"slots_per_node", world}}},
        {"parallelism",
         {{"tensor_parallel_size", tp},
          {"sequence_parallel_size", sp},
          {"vocab_parallel", vocab_parallel}}},
        {"deepspeed_config_json",
         json({{"zero_optimization",
                {{"stage", stage}, {"stage3_gather_16bit_weights_on_model_save", true}}},
               {"gradient_clipping", "auto"},
               {"train_micro_batch_size_per_gpu", "auto"},
               {"gradient_accumulation_steps", "auto"}})
             .dump()}};
    return WriteSpec(name, dir_.path() + "/" + name, t, extra);
  }

  // Runs the ranks; rank 0's events, whose setup event must show the mesh the spec asked for.
  std::vector<json> Run(int world, const std::string& spec, const std::string& tag) {
    std::vector<json> events =
        testing::TrainRanks(world, TRAINCTL_TRAINER_BIN, spec, dir_.path() + "/" + tag);
    const json parallelism = json::parse(testing::ReadFileOrEmpty(spec))["parallelism"];
    const int tp = parallelism["tensor_parallel_size"], sp = parallelism["sequence_parallel_size"];
    bool seen = false;
    for (const json& e : events) {
      if (e["type"] != "setup") continue;
      seen = true;
      EXPECT_EQ(e["mesh"]["tensor"], tp) << tag;
      EXPECT_EQ(e["mesh"]["sequence"], sp) << tag;
      EXPECT_EQ(e["mesh"]["data"], world / (tp * sp)) << tag;
    }
    EXPECT_TRUE(seen) << tag;
    return events;
  }
};

// Shapes batches have images and rows of unequal length; every step's loss depends on the
// previous steps' gradients (and, through clipping, on the global gradient norm over sliced and
// replicated weights), so equal losses over six steps mean equal gradients too.
TEST_F(TensorParallelTest, RanksSharingEachLayerTrainAsOne) {
  const std::vector<json> one_events = Run(1, Spec("one", 1, 1, 1, 0, 4), "one");
  const auto one = testing::Losses(one_events);
  ASSERT_EQ(one.size(), 6u);
  for (const json& e : one_events) {  // every step clipped
    if (e["type"] == "metric") {
      EXPECT_GT(e["values"]["grad_norm"].get<double>(), 0.05);
    }
  }
  const std::vector<json> tp2 = Run(2, Spec("tp2", 2, 2, 1, 0, 4), "tp2");
  testing::ExpectLossesClose(one, testing::Losses(tp2), "tp 2, stage 0");
  // Each rank holds half of every MLP and of every attention's heads: the tiny model's 2 layers
  // x (3 x 64 x 128 MLP weights + q and o 64 x 64, k and v 64 x 32, biases 64 + 2 x 32).
  auto master_bytes = [](const std::vector<json>& events) {
    for (const json& e : events) {
      if (e["type"] == "memory") return e["master_bytes"].get<int64_t>();
    }
    return int64_t{-1};
  };
  constexpr int64_t kMlp = 3 * 64 * 128, kAttention = 2 * 64 * 64 + 2 * 64 * 32 + 64 + 2 * 32;
  EXPECT_EQ(master_bytes(one_events) - master_bytes(tp2), 2 * (kMlp + kAttention) / 2 * 4);
  // tensor_parallel_mlp_only: attention whole on each rank, the MLPs split.
  json mlp_only = json::parse(testing::ReadFileOrEmpty(Spec("tp2mlp", 2, 2, 1, 0, 4)));
  mlp_only["parallelism"]["tensor_parallel_mlp_only"] = true;
  const std::vector<json> mlp = Run(2, dir_.Write("tp2mlp.json", mlp_only.dump()), "tp2mlp");
  testing::ExpectLossesClose(one, testing::Losses(mlp), "tp 2, MLPs only, stage 0");
  EXPECT_EQ(master_bytes(one_events) - master_bytes(mlp), 2 * kMlp / 2 * 4);
  testing::ExpectLossesClose(one, testing::Losses(Run(2, Spec("tp2z3", 2, 2, 1, 3, 4), "tp2z3")),
                             "tp 2, stage 3");
  // The embedding (tied to the head) split by vocabulary rows too: the lookups summed, the loss
  // from the group's log-sum-exps and target logits.
  const std::vector<json> vocab =
      Run(2, Spec("tp2vocab", 2, 2, 1, 0, 4, json::object(), true), "tp2vocab");
  testing::ExpectLossesClose(one, testing::Losses(vocab), "tp 2, vocab parallel, stage 0");
  EXPECT_EQ(master_bytes(one_events) - master_bytes(vocab),
            (2 * (kMlp + kAttention) + 151936 * 64) / 2 * 4);
  // Two data-parallel groups of two: each reads half the batch; ZeRO shards over ranks 0, 2 and
  // over 1, 3.
  testing::ExpectLossesClose(one, testing::Losses(Run(4, Spec("dp2tp2", 4, 2, 1, 3, 2), "dp2tp2")),
                             "dp 2 x tp 2, stage 3");
  // Sequence parallel attention and tensor parallel MLPs together, checkpointed: the exchanges
  // and the MLP sums run again in backward.
  const json ckpt = {{"gradient_checkpointing", true}};
  testing::ExpectLossesClose(
      testing::Losses(Run(1, Spec("one-ckpt", 1, 1, 1, 0, 4, ckpt), "one-ckpt")),
      testing::Losses(Run(4, Spec("sp2tp2", 4, 2, 2, 3, 4, ckpt), "sp2tp2")),
      "sp 2 x tp 2, stage 3, checkpointed");
}

// Logit distillation on the mesh: the student's MLPs and the frozen teacher's (a Qwen2.5-VL
// model here) are both split over a tensor-parallel group, and both models' sequences over a
// sequence-parallel one.
TEST_F(TensorParallelTest, LogitDistillationOnTheMeshTrainsAsOneRank) {
  // Two random tiny models' distributions over 151,936 tokens are close: their KL (~2e-5) is a
  // difference of nearly equal log-probabilities, which float rounding moves by ~1e-8 whatever
  // the mesh. Half cross-entropy keeps the loss where a relative comparison means something; the
  // KL's gradients still reach every weight.
  const json kd = {{"distill_loss", "forward_kl"}, {"kd_alpha", 0.5}, {"max_steps", 4}};
  auto spec = [&](const std::string& name, int world, int tp, int stage, int sp = 1) {
    const std::string path = Spec(name, world, tp, sp, stage, 4, kd);
    json j = json::parse(testing::ReadFileOrEmpty(path));
    j["kind"] = "distill";
    j["teacher_model_name_or_path"] = "tiny-qwen2.5-vl";
    return dir_.Write(name + ".json", j.dump());
  };
  const auto one = testing::Losses(Run(1, spec("kd-one", 1, 1, 0), "kd-one"));
  ASSERT_EQ(one.size(), 4u);
  testing::ExpectLossesClose(one, testing::Losses(Run(2, spec("kd-tp2", 2, 2, 3), "kd-tp2")),
                             "distillation, tp 2, stage 3");
  const std::vector<json> split = Run(2, spec("kd-sp2", 2, 1, 0, 2), "kd-sp2");
  testing::ExpectLossesClose(one, testing::Losses(split), "distillation, sp 2, stage 0");
  // The teacher's forwards exchange over the sequence group too: the student's forward and
  // backward and the teacher's forward (a model of the same width and heads) move 3/2 of what
  // an SFT run of the same batches does.
  const std::vector<json> student =
      Run(2, Spec("sft-sp2", 2, 1, 2, 0, 4, {{"max_steps", 4}}), "sft-sp2");
  auto sequence_bytes = [](const std::vector<json>& events) {
    double bytes = 0;
    for (const json& e : events) {
      if (e["type"] == "memory") bytes = e["sequence_comm_bytes_sent"].get<double>();
    }
    return bytes;
  };
  std::cout << "sequence group bytes: distillation " << sequence_bytes(split) << ", SFT "
            << sequence_bytes(student) << "\n";
  EXPECT_GT(sequence_bytes(student), 0);
  EXPECT_DOUBLE_EQ(sequence_bytes(split), 1.5 * sequence_bytes(student));
}

// GRPO steps of a mesh against one rank's: rollout lengths equal, rewards, gradient norms and
// losses within 1e-5 relative (1e-6 absolute for the near-zero loss), the KL to the reference
// after the first update within 1e-3 relative.
void ExpectSameGrpoSteps(const std::string& name, const std::map<int64_t, json>& got_steps,
                         const std::map<int64_t, json>& one) {
  for (const auto& [step, want] : one) {
    const json& got = got_steps.at(step);
    EXPECT_EQ(got["completions/mean_length"], want["completions/mean_length"]) << name << step;
    EXPECT_NEAR(got["reward"].get<double>(), want["reward"].get<double>(),
                1e-5 * std::abs(want["reward"].get<double>()))
        << name << " step " << step;
    EXPECT_NEAR(got["grad_norm"].get<double>(), want["grad_norm"].get<double>(),
                1e-5 * want["grad_norm"].get<double>())
        << name << " step " << step;
    EXPECT_NEAR(got["loss"].get<double>(), want["loss"].get<double>(), 1e-6)
        << name << " step " << step;
    std::cout << name << " step " << step << ": reward " << got["reward"] << " vs "
              << want["reward"] << ", grad_norm " << got["grad_norm"] << " vs " << want["grad_norm"]
              << ", kl " << got.value("kl", 0.0) << " vs " << want.value("kl", 0.0) << "\n";
    if (step > 1) {
      ASSERT_GT(want["kl"].get<double>(), 0) << step;
      EXPECT_NEAR(got["kl"].get<double>(), want["kl"].get<double>(),
                  1e-3 * want["kl"].get<double>())
          << name << " step " << step;
    }
  }
}

// GRPO on the mesh: a tensor-parallel pair generates with its MLP, attention-head and vocabulary
// slices (summed per layer and the logits gathered on every decoding step), scores and trains the
// same rows as one rank, its reference model split alike, and a reward model too (its score head
// whole); a sequence-parallel pair decodes and scores half of the rows on each rank (all of them
// when 2 does not divide them), exchanges the completions and scores, and splits the training
// forwards' sequences, its reference's too; and the two together. A
// GRPO loss is near zero by construction (group-normalised advantages), so the step's figures are
// compared: the rollouts' rewards and lengths, the gradient norm and, after the first update, the
// KL to the reference.
TEST_F(TensorParallelTest, GrpoOnTheMeshTrainsAsOneRank) {
  // A reward model (tiny's architecture with a score head, weights from a seed) whose scores
  // differ between completions: the tiny policy never earns a rule reward, and equal rewards
  // would leave every advantage zero and nothing to learn.
  const std::string rm = dir_.path() + "/rm";
  {
    auto config =
        model::LoadQwen2VLConfig(std::string(TRAINCTL_SOURCE_DIR) + "/configs/models/tiny");
    ASSERT_TRUE(config.ok()) << config.status();
    config->num_labels = 1;
    torch::manual_seed(3);
    model::Qwen2VLForConditionalGeneration net(*config);
    ASSERT_TRUE(model::SaveHfCheckpoint(net, rm).ok());
  }
  const json grpo = {{"num_generations", 4},
                     {"max_completion_length", 8},
                     {"max_steps", 3},
                     {"beta", 0.04},
                     {"temperature", 1.0},
                     {"warmup_ratio", 0.0}};  // step 1 updates: a KL to the reference from step 2
  // `rows` rows per step (num_generations: 4, or 3 for 3 rows); ZeRO-3 on the mesh.
  auto spec = [&](const std::string& name, int tp, int sp, int stage, int rows, bool gather) {
    json training = grpo;
    training["num_generations"] = rows == 3 ? 3 : 4;
    training["gather_for_generation"] = gather;
    const std::string path =
        Spec(name, tp * sp, tp, sp, stage, rows, training, /*vocab_parallel=*/tp > 1);
    json j = json::parse(testing::ReadFileOrEmpty(path));
    j["kind"] = "grpo";
    j["reward_funcs"] = {"accuracy"};
    j["reward_model_name_or_path"] = rm;
    return dir_.Write(name + ".json", j.dump());
  };
  auto figures = [](const std::vector<json>& events) {
    std::map<int64_t, json> out;
    for (const json& e : events) {
      if (e["type"] == "metric") out[e["step"].get<int64_t>()] = e["values"];
    }
    return out;
  };
  std::map<int, std::map<int64_t, json>> ones;  // one rank's figures by rows per step
  for (int rows : {4, 3}) {
    const std::string name = absl::StrCat("grpo-one-", rows);
    ones[rows] = figures(Run(1, spec(name, 1, 1, 0, rows, true), name));
    ASSERT_EQ(ones[rows].size(), 3u);
  }
  // Tensor parallel (vocabulary too), sequence parallel, and both; a sequence-parallel pair with
  // its weights gathered per unit on every decoding step (its ranks decode different rows in
  // lock-step), and one whose 3 rows do not split in two (both ranks decode all of them).
  struct Case {
    int tp, sp, rows;
    bool gather;
  };
  for (const Case& c : {Case{2, 1, 4, true}, Case{1, 2, 4, true}, Case{2, 2, 4, true},
                        Case{1, 2, 4, false}, Case{1, 2, 3, true}}) {
    const std::string name =
        absl::StrCat("grpo-tp", c.tp, "sp", c.sp, "-", c.rows, c.gather ? "" : "-per-unit");
    const std::vector<json> events =
        Run(c.tp * c.sp, spec(name, c.tp, c.sp, 3, c.rows, c.gather), name);
    const auto got_steps = figures(events);
    ASSERT_EQ(got_steps.size(), 3u) << name;
    // A sequence-parallel pair's ranks each decode half of the rows when 2 divides them (rank 0
    // reports).
    bool reported = false;
    for (const json& e : events) {
      if (e["type"] != "generation") continue;
      reported = true;
      EXPECT_EQ(e["rows"], c.rows) << name;
      EXPECT_EQ(e["rows_decoded"], c.rows % c.sp == 0 ? c.rows / c.sp : c.rows) << name;
      // ZeRO-3 shards over the sequence pair (the ranks with one tensor position).
      const char* weights = c.sp == 1  ? "whole on every rank"
                            : c.gather ? "gathered once per rollout"
                                       : "gathered per unit on every decoding step";
      EXPECT_EQ(e["weights"], weights) << name;
    }
    EXPECT_TRUE(reported) << name;
    ExpectSameGrpoSteps(name, got_steps, ones[c.rows]);
  }
}

// Checkpoints hold whole weights: a tensor-parallel run's checkpoint (MLPs and vocabulary split)
// resumes on one rank, and one rank's on a tensor-parallel pair, with the losses of an unbroken
// run; the HF weights a tensor-parallel run writes have the whole shapes and the unbroken run's
// values.
TEST_F(TensorParallelTest, CheckpointsAndWeightsDoNotDependOnTheGroupSize) {
  const json save = {{"save_strategy", "steps"}, {"save_steps", 3}};
  const auto straight = testing::Losses(Run(1, Spec("straight", 1, 1, 1, 0, 4, save), "straight"));
  ASSERT_EQ(straight.size(), 6u);
  const std::map<int64_t, double> tail(straight.find(4), straight.end());
  for (const auto& [from, to] : {std::pair{2, 1}, std::pair{1, 2}}) {
    const std::string first = absl::StrCat("tp", from, "to", to);
    Run(from, Spec(first, from, from, 1, 3, 4, save, from > 1), first);
    const std::string second = first + "-resumed";
    std::filesystem::copy(dir_.path() + "/" + first, dir_.path() + "/" + second,
                          std::filesystem::copy_options::recursive);
    std::filesystem::remove_all(dir_.path() + "/" + second + "/checkpoint-6");
    const auto events = Run(to, Spec(second, to, to, 1, 3, 4, save, to > 1), second);
    EXPECT_EQ(testing::ResumedFrom(events), 3) << second;
    testing::ExpectLossesClose(tail, testing::Losses(events), second);
  }

  const Tensors whole = ReadFloatTensors(dir_.path() + "/straight/checkpoint-3/model.safetensors");
  const Tensors joined = ReadFloatTensors(dir_.path() + "/tp2to1/checkpoint-3/model.safetensors");
  ASSERT_FALSE(whole.values.empty());
  ASSERT_EQ(joined.shapes, whole.shapes);
  EXPECT_EQ(joined.shapes.at("model.embed_tokens.weight"), (std::vector<int64_t>{151936, 64}));
  EXPECT_EQ(joined.shapes.at("model.layers.0.mlp.gate_proj.weight"),
            (std::vector<int64_t>{128, 64}));
  EXPECT_EQ(joined.shapes.at("model.layers.1.mlp.down_proj.weight"),
            (std::vector<int64_t>{64, 128}));
  double worst = 0;
  for (const auto& [name, values] : whole.values) {
    const std::vector<float>& got = joined.values.at(name);
    for (size_t i = 0; i < values.size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::abs(got[i] - values[i])));
    }
  }
  // Three AdamW steps at lr 5e-3 from the same weights: sums in another order differ by float
  // rounding, not by a misplaced slice (which would differ by the weights' own size, ~0.02).
  EXPECT_LT(worst, 1e-4);
  std::cout << "HF weights of tp 2 vs one rank after 3 steps: largest difference " << worst << "\n";
}

}  // namespace
}  // namespace trainctl
