// The memory plan (common/memory_plan.h) and the model shapes it counts from
// (common/model_catalog.h): parameter counts equal the published models', DeepSpeed's estimator
// gives DeepSpeed's own printed figures, and the plan moves the way ZeRO, offload, checkpointing
// and the batch say it must.
#include "common/memory_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/job_spec.h"
#include "common/model_catalog.h"

namespace trainctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using trainctl::v1::JobSpec;
using trainctl::v1::MemoryPlan;

constexpr int64_t kGiB = int64_t{1} << 30;

const std::string kRegistry = std::string(TRAINCTL_SOURCE_DIR) + "/configs/models";

// The parameter counts the model cards state (safetensors totals).
TEST(ModelShapeTest, ParameterCountsAreThePublishedModels) {
  const std::pair<const char*, int64_t> cases[] = {{"Qwen/Qwen2-VL-2B-Instruct", 2208985600},
                                                   {"Qwen/Qwen2-VL-7B-Instruct", 8291375616},
                                                   {"Qwen/Qwen2.5-VL-3B-Instruct", 3754622976},
                                                   {"Qwen/Qwen2.5-VL-7B-Instruct", 8292166656}};
  for (const auto& [id, params] : cases) {
    // The built-in table (no registry) and, where the registry has the config, the file.
    auto builtin = LookupModelShape(id, "/nonexistent");
    ASSERT_TRUE(builtin.ok()) << builtin.status();
    EXPECT_EQ(builtin->Parameters(), params) << id;
    EXPECT_THAT(builtin->source, HasSubstr("built-in"));
    auto from_file = LookupModelShape(id, kRegistry);
    ASSERT_TRUE(from_file.ok()) << from_file.status();
    EXPECT_EQ(from_file->Parameters(), params) << id << " from " << from_file->source;
  }
}

TEST(ModelShapeTest, ReadsBothFamiliesAndNamesWhatIsWrong) {
  auto tiny = LookupModelShape("tiny", kRegistry);
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  EXPECT_EQ(tiny->family, "qwen2_vl");
  EXPECT_EQ(tiny->hidden, 64);
  EXPECT_EQ(tiny->vision.mlp, 64);  // embed_dim 32 x mlp_ratio 2
  EXPECT_TRUE(tiny->tied);

  auto q25 = ParseModelShape(R"({"model_type": "qwen2_5_vl", "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "vocab_size": 1000,
      "vision_config": {"depth": 4, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2,
                        "out_hidden_size": 64, "window_size": 56, "fullatt_block_indexes": [1, 3]}})",
                             "q25.json");
  ASSERT_TRUE(q25.ok()) << q25.status();
  EXPECT_TRUE(q25->qwen25());
  EXPECT_EQ(q25->vision.embed, 32);
  EXPECT_EQ(q25->vision.mlp, 48);
  EXPECT_EQ(q25->vision.window, 56);
  EXPECT_EQ(q25->vision.full_attention_blocks, 2);

  auto bad = ParseModelShape(R"({"model_type": "qwen2_vl", "hidden_size": 64,
      "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 10, "vision_config": {}})",
                             "bad.json");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("bad.json: intermediate_size: missing"));
  auto other = ParseModelShape(R"({"model_type": "llama"})", "l.json");
  EXPECT_THAT(std::string(other.status().message()), HasSubstr("model_type: \"llama\""));
  auto unknown = LookupModelShape("someone/some-model", kRegistry);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
}

// deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs_all_live on t5-small
// (60,506,624 params, 16,449,536 in its largest layer, 1 node x 1 GPU) prints, in GiB:
// offload param and optimizer 0.06 GPU / 1.52 CPU; optimizer only 0.17 / 1.35; none 1.08 / 0.09.
TEST(DeepSpeedEstimateTest, EqualsDeepSpeedsPrintedFigures) {
  auto gib = [](int64_t b) { return std::round(static_cast<double>(b) / kGiB * 100) / 100; };
  const int64_t total = 60506624, largest = 16449536;
  DeepSpeedEstimate both = EstimateDeepSpeedModelStates(3, total, largest, 1, 1, true, true);
  EXPECT_DOUBLE_EQ(gib(both.gpu_bytes), 0.06);
  EXPECT_DOUBLE_EQ(gib(both.cpu_bytes), 1.52);
  DeepSpeedEstimate opt = EstimateDeepSpeedModelStates(3, total, largest, 1, 1, true, false);
  EXPECT_DOUBLE_EQ(gib(opt.gpu_bytes), 0.17);
  EXPECT_DOUBLE_EQ(gib(opt.cpu_bytes), 1.35);
  DeepSpeedEstimate none = EstimateDeepSpeedModelStates(3, total, largest, 1, 1, false, false);
  EXPECT_DOUBLE_EQ(gib(none.gpu_bytes), 1.08);
  EXPECT_DOUBLE_EQ(gib(none.cpu_bytes), 0.09);
  // ZeRO-2 without offload: 4 Ψ + 16 Ψ / GPUs.
  DeepSpeedEstimate z2 = EstimateDeepSpeedModelStates(2, 1000, 10, 8, 1, false, false);
  EXPECT_EQ(z2.gpu_bytes, 4000 + 2000);
}

// A spec through the validator, as the coordinator plans it.
MemoryPlan Plan(const std::string& yaml, bool cuda = true) {
  auto spec = ParseJobSpec(yaml, SpecFormat::kYaml, "spec.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  auto validated = ValidateJobSpec(*spec);
  EXPECT_TRUE(validated.ok()) << validated.status();
  MemoryPlanOptions options;
  options.registry = kRegistry;
  options.cuda = cuda;
  auto plan = PlanJobMemory(validated->spec, validated->resolved_deepspeed_config_json, options);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : MemoryPlan();
}

int64_t Part(const MemoryPlan& plan, const std::string& name, bool host = false) {
  for (const auto& p : host ? plan.cpu_parts() : plan.gpu_parts()) {
    if (p.name() == name) return p.bytes();
  }
  return -1;
}

std::string Sft(const std::string& model, int stage, const std::string& extra = "",
                const std::string& zero_extra = "", int micro = 4) {
  return absl::StrCat("kind: sft\nmodel_name_or_path: ", model,
                      "\ndata_path: /d\noutput_dir: /o\nresources: {nodes: 1, slots_per_node: 8}\n"
                      "training: {bf16: true, per_device_train_batch_size: ",
                      micro, extra, "}\ndeepspeed: {zero_optimization: {stage: ", stage, zero_extra,
                      "}, bf16: {enabled: true}}\n");
}

TEST(MemoryPlanTest, ZeroStagesShardTheModelStates) {
  const int64_t params = 8291375616;
  const MemoryPlan z0 = Plan(Sft("Qwen/Qwen2-VL-7B-Instruct", 0));
  const MemoryPlan z3 = Plan(Sft("Qwen/Qwen2-VL-7B-Instruct", 3));
  EXPECT_EQ(z0.parameters(), params);
  // Stage 0: 4 + 8 B per parameter everywhere, the 16-bit weights and gradients besides.
  EXPECT_EQ(Part(z0, "master_weights"), 4 * params);
  EXPECT_EQ(Part(z0, "optimizer_states"), 8 * params);
  EXPECT_EQ(Part(z0, "working_weights"), 2 * params);
  // Stage 3 over 8 ranks: 16 B per parameter / 8 (each unit's slice rounded up), nothing whole.
  const int64_t states =
      Part(z3, "master_weights") + Part(z3, "optimizer_states") + Part(z3, "fp32_gradients");
  EXPECT_NEAR(static_cast<double>(states), 16.0 * params / 8, 1000);
  EXPECT_EQ(Part(z3, "working_weights"), -1);
  EXPECT_GT(Part(z3, "gathered_weights"), 0);
  EXPECT_GT(z0.gpu_bytes(), 80 * kGiB);
  EXPECT_LT(z3.gpu_bytes(), 80 * kGiB);
  EXPECT_EQ(z3.device(), "cuda");
  EXPECT_EQ(z3.phase(), "train");
  EXPECT_THAT(FormatMemoryPlan(z3), HasSubstr("master_weights"));
}

// A rank's shape with split heads (head_size explicit, heads and kv_heads / 2) keeps half of a
// layer's attention and MLP and both norms whole; head_size 0 is the whole model's head_dim.
TEST(ModelShapeTest, SplitHeadsCountTheRanksShareOfTheAttention) {
  auto whole = LookupModelShape("Qwen/Qwen2-VL-7B-Instruct", kRegistry);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->head_dim(), 128);
  EXPECT_EQ(whole->q_dim(), whole->hidden);
  ModelShape half = *whole;
  half.head_size = whole->head_dim();
  half.heads /= 2;
  half.kv_heads /= 2;
  half.intermediate /= 2;
  EXPECT_EQ(half.head_dim(), 128);
  EXPECT_EQ(half.q_dim(), whole->hidden / 2);
  EXPECT_EQ(half.kv_dim(), whole->kv_dim() / 2);
  EXPECT_EQ(2 * half.Counts().decoder_layer - whole->Counts().decoder_layer, 2 * whole->hidden);
}

TEST(MemoryPlanTest, TensorParallelSlicesTheLayersAndShardsOverTheZeroGroup) {
  const std::string tp1 = Sft("Qwen/Qwen2-VL-7B-Instruct", 3, ", max_seq_length: 2048");
  const MemoryPlan one = Plan(tp1);
  const MemoryPlan two = Plan(tp1 + "parallelism: {tensor_parallel_size: 2}\n");
  const MemoryPlan mlp_only =
      Plan(tp1 + "parallelism: {tensor_parallel_size: 2, tensor_parallel_mlp_only: true}\n");
  auto shape = LookupModelShape("Qwen/Qwen2-VL-7B-Instruct", kRegistry);
  ASSERT_TRUE(shape.ok()) << shape.status();
  const double h = static_cast<double>(shape->hidden), kv = static_cast<double>(shape->kv_dim());
  const double mlp = 3.0 * shape->layers * h * shape->intermediate;
  // q, k, v weights and biases, o's weight.
  const double attention = shape->layers * (2 * h * h + h + 2 * (h * kv + kv));
  const double replicated = static_cast<double>(shape->Parameters()) - mlp - attention;
  EXPECT_EQ(two.parameters(), one.parameters());  // the whole model's count
  EXPECT_EQ(mlp_only.parameters(), one.parameters());
  // fp32 master: (replicated + (MLP + attention) / 2) over the 8 / 2 ranks of the ZeRO group,
  // each unit's slice rounded up; with tensor_parallel_mlp_only the attention stays whole.
  EXPECT_NEAR(static_cast<double>(Part(two, "master_weights")),
              (replicated + (mlp + attention) / 2) / 4 * 4, 1000);
  EXPECT_NEAR(static_cast<double>(Part(mlp_only, "master_weights")),
              (replicated + attention + mlp / 2) / 4 * 4, 1000);
  // The largest unit is the embedding here (replicated), so the gathered units stay.
  EXPECT_EQ(Part(two, "gathered_weights"), Part(one, "gathered_weights"));
  EXPECT_EQ(Part(mlp_only, "gathered_weights"), Part(one, "gathered_weights"));
  // The MLP's gate, up and product are 1/2 wide, and by default q, k, v and the attention output
  // too; the norms' values stay.
  EXPECT_LT(Part(two, "activations"), Part(mlp_only, "activations"));
  EXPECT_LT(Part(mlp_only, "activations"), Part(one, "activations"));
  EXPECT_LT(two.gpu_bytes(), mlp_only.gpu_bytes());
  EXPECT_LT(mlp_only.gpu_bytes(), one.gpu_bytes());
  EXPECT_THAT(FormatMemoryPlan(two), HasSubstr("decoder MLPs and attention heads 1/2"));
  EXPECT_THAT(FormatMemoryPlan(mlp_only), HasSubstr("decoder MLPs 1/2"));
  EXPECT_THAT(FormatMemoryPlan(mlp_only), Not(HasSubstr("attention heads")));

  // The vocabulary split too: the embedding and the untied head lose half their rows, and the
  // largest unit (the embedding) with them; the loss's chunk is the rank's columns.
  const MemoryPlan vocab =
      Plan(tp1 + "parallelism: {tensor_parallel_size: 2, vocab_parallel: true}\n");
  const double rows = 2.0 * shape->vocab * h;  // embedding + lm_head
  EXPECT_NEAR(static_cast<double>(Part(vocab, "master_weights")),
              (replicated - rows + rows / 2 + (mlp + attention) / 2) / 4 * 4, 1000);
  EXPECT_LT(Part(vocab, "gathered_weights"), Part(two, "gathered_weights"));
  EXPECT_LT(Part(vocab, "logits_and_loss"), Part(two, "logits_and_loss"));
}

TEST(MemoryPlanTest, OffloadMovesStatesToTheHostOfEachNode) {
  const MemoryPlan seed =
      Plan(Sft("Qwen/Qwen2-VL-7B-Instruct", 3, "",
               ", offload_optimizer: {device: cpu}, offload_param: {device: cpu}"));
  EXPECT_EQ(Part(seed, "master_weights"), -1);
  // 16 B per parameter over the node's 8 ranks: the whole 16 Ψ on the one node.
  const int64_t host = Part(seed, "master_weights", true) + Part(seed, "optimizer_states", true) +
                       Part(seed, "fp32_gradients", true);
  EXPECT_NEAR(static_cast<double>(host), 16.0 * 8291375616, 10000);
  EXPECT_EQ(seed.cpu_bytes(), host);
  EXPECT_GT(seed.deepspeed_cpu_bytes(), 0);
}

TEST(MemoryPlanTest, CheckpointingAndSmallerBatchesCutActivations) {
  const MemoryPlan plain = Plan(Sft("Qwen/Qwen2-VL-7B-Instruct", 3, ", max_seq_length: 4096"));
  const MemoryPlan ckpt = Plan(
      Sft("Qwen/Qwen2-VL-7B-Instruct", 3, ", max_seq_length: 4096, gradient_checkpointing: true"));
  const MemoryPlan half =
      Plan(Sft("Qwen/Qwen2-VL-7B-Instruct", 3, ", max_seq_length: 4096", "", /*micro=*/2));
  EXPECT_LT(Part(ckpt, "activations") * 5, Part(plain, "activations"));
  EXPECT_NEAR(static_cast<double>(Part(half, "activations")), Part(plain, "activations") / 2.0,
              Part(plain, "activations") * 0.01);
}

TEST(MemoryPlanTest, RemediesThatFitAreNamed) {
  const std::string spec = Sft("Qwen/Qwen2-VL-7B-Instruct", 0, ", max_seq_length: 4096");
  auto parsed = ParseJobSpec(spec, SpecFormat::kYaml, "spec.yaml");
  ASSERT_TRUE(parsed.ok());
  auto validated = ValidateJobSpec(*parsed);
  ASSERT_TRUE(validated.ok()) << validated.status();
  MemoryPlanOptions options;
  options.registry = kRegistry;
  const auto remedies = MemoryRemedies(validated->spec, validated->resolved_deepspeed_config_json,
                                       options, 80 * kGiB);
  ASSERT_FALSE(remedies.empty());
  EXPECT_THAT(remedies[0], HasSubstr("stage 3"));
  EXPECT_TRUE(
      MemoryRemedies(validated->spec, validated->resolved_deepspeed_config_json, options, 1 << 20)
          .empty());
}

TEST(MemoryPlanTest, GrpoPlansItsRolloutAndReference) {
  const std::string grpo =
      "kind: grpo\nmodel_name_or_path: Qwen/Qwen2-VL-2B-Instruct\ndata_path: /d\noutput_dir: /o\n"
      "resources: {nodes: 1, slots_per_node: 8}\n"
      "training: {bf16: true, per_device_train_batch_size: 1, gradient_accumulation_steps: 64, "
      "num_generations: 8, beta: 0.04, max_completion_length: 1024}\n"
      "deepspeed: {zero_optimization: {stage: 3}, bf16: {enabled: true}}\n";
  const MemoryPlan plan = Plan(grpo);
  EXPECT_GT(Part(plan, "reference_model"), 0);
  EXPECT_EQ(plan.phase(), "rollout");
  EXPECT_GT(Part(plan, "kv_cache"), 0);
  // The whole model gathered for generation, 2 B per parameter.
  EXPECT_EQ(Part(plan, "generation_weights"), 2 * 2208985600);
  // A sequence-parallel pair decodes half of the rows on each rank: half the KV cache (256 rows,
  // so that the rollout stays the busier phase).
  const std::string more = absl::StrReplaceAll(
      grpo, {{"gradient_accumulation_steps: 64", "gradient_accumulation_steps: 256"}});
  const MemoryPlan whole = Plan(more);
  const MemoryPlan pair = Plan(more + "parallelism: {sequence_parallel_size: 2}\n");
  ASSERT_EQ(pair.phase(), "rollout");
  EXPECT_EQ(Part(pair, "kv_cache"), Part(whole, "kv_cache") / 2);
}

TEST(MemoryPlanTest, CpuRanksCountHostMemoryPerRankAndNode) {
  const MemoryPlan plan = Plan(
      "kind: sft\nmodel_name_or_path: tiny\ndata_path: /d\noutput_dir: /o\n"
      "resources: {nodes: 1, slots_per_node: 2}\ntraining: {per_device_train_batch_size: 2}\n",
      /*cuda=*/false);
  EXPECT_EQ(plan.device(), "cpu");
  EXPECT_EQ(Part(plan, "cuda_runtime_and_nccl"), -1);
  EXPECT_EQ(plan.cpu_bytes(), 2 * plan.gpu_bytes());
  // fp32 at stage 0: the working weights are the master weights.
  EXPECT_EQ(Part(plan, "working_weights"), -1);
}

}  // namespace
}  // namespace trainctl
