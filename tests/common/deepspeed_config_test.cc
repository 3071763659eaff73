#include "common/deepspeed_config.h"

#include <fstream>
#include <map>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainctl {
namespace {

using nlohmann::json;
using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::StartsWith;

constexpr char kSeedPath[] = TRAINCTL_SOURCE_DIR "/configs/ds_zero3_bf16.json";

// The seed launch script's flags on 8 GPUs, with Qwen2-VL-7B's hidden size.
DeepSpeedInputs SeedInputs() {
  DeepSpeedInputs in;
  in.world_size = 8;
  in.micro_batch = 4;
  in.grad_accum = 4;
  in.learning_rate = 2e-5;
  in.bf16 = true;
  in.hidden_size = 3584;
  return in;
}

// SeedInputs plus everything a scheduler or optimizer "auto" can draw on, with non-default values.
DeepSpeedInputs FullInputs() {
  DeepSpeedInputs in = SeedInputs();
  in.max_grad_norm = 0.5;
  in.weight_decay = 0.01;
  in.adam_beta1 = 0.85;
  in.adam_beta2 = 0.95;
  in.adam_epsilon = 1e-6;
  in.total_steps = 1000;
  in.warmup_steps = 100;
  return in;
}

std::string ReadFile(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

absl::StatusOr<ResolvedDeepSpeedConfig> Resolve(const std::string& text,
                                                const DeepSpeedInputs& in) {
  return ResolveDeepSpeedConfig(json::parse(text), in);
}

std::string ErrorOf(const std::string& text, const DeepSpeedInputs& in) {
  absl::StatusOr<ResolvedDeepSpeedConfig> r = Resolve(text, in);
  if (r.ok()) return "<resolved without error>";
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(r.status().message());
}

template <typename Case>
std::string CaseName(const ::testing::TestParamInfo<Case>& param_info) {
  return param_info.param.name;
}

// --- The seed ---

TEST(DeepSpeedConfigTest, SeedFileResolvesWithSeedFlags) {
  const std::string text = ReadFile(kSeedPath);
  ASSERT_FALSE(text.empty()) << kSeedPath;
  absl::StatusOr<json> doc = ParseDeepSpeedJson(text, kSeedPath);
  ASSERT_TRUE(doc.ok()) << doc.status();
  absl::StatusOr<ResolvedDeepSpeedConfig> r = ResolveDeepSpeedConfig(*doc, SeedInputs());
  ASSERT_TRUE(r.ok()) << r.status();

  EXPECT_EQ(r->json["train_batch_size"], 128);
  EXPECT_EQ(r->json["train_micro_batch_size_per_gpu"], 4);
  EXPECT_EQ(r->json["gradient_accumulation_steps"], 4);
  EXPECT_EQ(r->json["zero_optimization"]["reduce_bucket_size"], 12845056);
  EXPECT_EQ(r->json["zero_optimization"]["stage3_prefetch_bucket_size"], 11560550);
  EXPECT_EQ(r->json["zero_optimization"]["stage3_param_persistence_threshold"], 35840);
  EXPECT_EQ(r->json["gradient_clipping"], 1.0);
  EXPECT_THAT(r->warnings,
              ElementsAre(StartsWith("deepspeed.bf16.initial_scale_power: only used by fp16"),
                          StartsWith("deepspeed.bf16.loss_scale: only used by fp16")));
}

TEST(DeepSpeedConfigTest, SeedFileTypedView) {
  absl::StatusOr<ResolvedDeepSpeedConfig> r = Resolve(ReadFile(kSeedPath), SeedInputs());
  ASSERT_TRUE(r.ok()) << r.status();
  const DeepSpeedConfig& c = r->config;
  EXPECT_EQ(c.stage, 3);
  EXPECT_EQ(c.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_TRUE(c.offload_optimizer.pin_memory);
  EXPECT_EQ(c.offload_param.device, OffloadDevice::kCpu);
  EXPECT_TRUE(c.offload_param.pin_memory);
  EXPECT_TRUE(c.overlap_comm);
  EXPECT_TRUE(c.contiguous_gradients);
  EXPECT_EQ(c.sub_group_size, 1000000000);
  EXPECT_EQ(c.reduce_bucket_size, 12845056);
  EXPECT_EQ(c.stage3_prefetch_bucket_size, 11560550);
  EXPECT_EQ(c.stage3_param_persistence_threshold, 35840);
  EXPECT_EQ(c.stage3_max_live_parameters, 1000000000);
  EXPECT_EQ(c.stage3_max_reuse_distance, 1000000000);
  EXPECT_TRUE(c.stage3_gather_16bit_weights_on_model_save);
  EXPECT_TRUE(c.bf16_enabled);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.train_batch_size, 128);
  EXPECT_EQ(c.micro_batch, 4);
  EXPECT_EQ(c.grad_accum, 4);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 1.0);
  EXPECT_FALSE(c.optimizer.has_value());
  EXPECT_FALSE(c.scheduler.has_value());
  EXPECT_TRUE(c.zero_allow_untested_optimizer);
}

TEST(DeepSpeedConfigTest, SeedWithUnknownHiddenSizeKeepsAutosAndWarns) {
  DeepSpeedInputs in = SeedInputs();
  in.hidden_size.reset();
  absl::StatusOr<ResolvedDeepSpeedConfig> r = Resolve(ReadFile(kSeedPath), in);
  ASSERT_TRUE(r.ok()) << r.status();
  for (const char* key : {"reduce_bucket_size", "stage3_prefetch_bucket_size",
                          "stage3_param_persistence_threshold"}) {
    EXPECT_EQ(r->json["zero_optimization"][key], "auto") << key;
    EXPECT_THAT(r->warnings, Contains(AllOf(StartsWith(std::string("deepspeed.zero_optimization.") +
                                                       key + ": \"auto\" left for the trainer"),
                                            HasSubstr("config.json"))));
  }
  EXPECT_FALSE(r->config.reduce_bucket_size.has_value());
  EXPECT_FALSE(r->config.stage3_prefetch_bucket_size.has_value());
  EXPECT_FALSE(r->config.stage3_param_persistence_threshold.has_value());
}

// --- Each "auto" ---

struct AutoCase {
  std::string name;
  std::string doc;
  std::string pointer;  // JSON pointer of the resolved value
  json expected;
  bool fp16_job = false;  // run with --fp16 instead of --bf16
};

void PrintTo(const AutoCase& c, std::ostream* os) { *os << c.name; }

class AutoTest : public ::testing::TestWithParam<AutoCase> {};

TEST_P(AutoTest, ResolvesFromFlags) {
  const AutoCase& c = GetParam();
  DeepSpeedInputs in = FullInputs();
  in.fp16 = c.fp16_job;
  in.bf16 = !c.fp16_job;
  absl::StatusOr<ResolvedDeepSpeedConfig> r = Resolve(c.doc, in);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->json.at(json::json_pointer(c.pointer)), c.expected);
}

const char kWarmupDecay[] = R"({"scheduler": {"type": "WarmupDecayLR", "params": {
    "warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto",
    "total_num_steps": "auto"}}})";
const char kAdamW[] = R"({"optimizer": {"type": "AdamW", "params": {
    "lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}}})";
const char kZero3[] = R"({"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
    "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto"}})";

INSTANTIATE_TEST_SUITE_P(
    EachAuto, AutoTest,
    ::testing::Values(
        AutoCase{"MicroBatch", R"({"train_micro_batch_size_per_gpu": "auto"})",
                 "/train_micro_batch_size_per_gpu", 4},
        AutoCase{"GradAccum", R"({"gradient_accumulation_steps": "auto"})",
                 "/gradient_accumulation_steps", 4},
        AutoCase{"TrainBatchSize", R"({"train_batch_size": "auto"})", "/train_batch_size", 128},
        AutoCase{"TrainBatchSizeAbsent", "{}", "/train_batch_size", 128},
        AutoCase{"GradientClipping", R"({"gradient_clipping": "auto"})", "/gradient_clipping", 0.5},
        AutoCase{"OptimizerLr", kAdamW, "/optimizer/params/lr", 2e-5},
        AutoCase{"OptimizerBetas", kAdamW, "/optimizer/params/betas", json::array({0.85, 0.95})},
        AutoCase{"OptimizerEps", kAdamW, "/optimizer/params/eps", 1e-6},
        AutoCase{"OptimizerWeightDecay", kAdamW, "/optimizer/params/weight_decay", 0.01},
        AutoCase{"WarmupMinLr", kWarmupDecay, "/scheduler/params/warmup_min_lr", 0},
        AutoCase{"WarmupMaxLr", kWarmupDecay, "/scheduler/params/warmup_max_lr", 2e-5},
        AutoCase{"WarmupNumSteps", kWarmupDecay, "/scheduler/params/warmup_num_steps", 100},
        AutoCase{"TotalNumSteps", kWarmupDecay, "/scheduler/params/total_num_steps", 1000},
        AutoCase{"Fp16Enabled", R"({"fp16": {"enabled": "auto"}})", "/fp16/enabled", true, true},
        AutoCase{"Bf16Enabled", R"({"bf16": {"enabled": "auto"}})", "/bf16/enabled", true},
        AutoCase{"ReduceBucketSize", kZero3, "/zero_optimization/reduce_bucket_size", 12845056},
        AutoCase{"PrefetchBucketSize", kZero3, "/zero_optimization/stage3_prefetch_bucket_size",
                 11560550},
        AutoCase{"PersistenceThreshold", kZero3,
                 "/zero_optimization/stage3_param_persistence_threshold", 35840}),
    CaseName<AutoCase>);

TEST(DeepSpeedConfigTest, ResolvedOptimizerAndSchedulerTypedView) {
  absl::StatusOr<ResolvedDeepSpeedConfig> r = Resolve(
      R"({"optimizer": {"type": "adamw", "params": {"lr": "auto", "betas": "auto"}},
          "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_max_lr": "auto",
              "warmup_num_steps": "auto", "total_num_steps": "auto"}}})",
      FullInputs());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->config.optimizer.has_value());
  EXPECT_EQ(r->config.optimizer->type, "AdamW");
  EXPECT_DOUBLE_EQ(r->config.optimizer->lr, 2e-5);
  EXPECT_DOUBLE_EQ(r->config.optimizer->betas[1], 0.95);
  EXPECT_TRUE(r->config.optimizer->adam_w_mode);
  EXPECT_FALSE(r->config.zero_allow_untested_optimizer);
  ASSERT_TRUE(r->config.scheduler.has_value());
  EXPECT_EQ(r->config.scheduler->warmup_num_steps, 100);
  EXPECT_EQ(r->config.scheduler->total_num_steps, 1000);
  EXPECT_DOUBLE_EQ(r->config.scheduler->warmup_max_lr, 2e-5);
}

TEST(DeepSpeedConfigTest, SchedulerAutosWithoutStepCountStayAutoWithWarning) {
  absl::StatusOr<ResolvedDeepSpeedConfig> r = Resolve(kWarmupDecay, SeedInputs());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->json["scheduler"]["params"]["total_num_steps"], "auto");
  EXPECT_EQ(r->json["scheduler"]["params"]["warmup_num_steps"], "auto");
  EXPECT_EQ(r->json["scheduler"]["params"]["warmup_max_lr"], 2e-5);
  EXPECT_THAT(r->warnings, Contains(StartsWith("deepspeed.scheduler.params.total_num_steps: "
                                               "\"auto\" left for the trainer")));
  EXPECT_FALSE(r->config.scheduler->total_num_steps.has_value());
  EXPECT_FALSE(r->config.scheduler->warmup_num_steps.has_value());
}

// --- Errors ---

TEST(DeepSpeedConfigTest, InconsistentTrainBatchSizeIsError) {
  EXPECT_EQ(ErrorOf(R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": "auto"})",
                    SeedInputs()),
            "deepspeed.train_batch_size: 64 != train_micro_batch_size_per_gpu 4 * "
            "gradient_accumulation_steps 4 * data-parallel world_size 8 = 128");
}

TEST(DeepSpeedConfigTest, ConsistentExplicitTrainBatchSizeIsAccepted) {
  absl::StatusOr<ResolvedDeepSpeedConfig> r = Resolve(
      R"({"train_batch_size": 128, "train_micro_batch_size_per_gpu": 4,
          "gradient_accumulation_steps": 4})",
      SeedInputs());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->config.train_batch_size, 128);
}

struct ErrorCase {
  std::string name;
  std::string doc;
  std::string error;  // a whole line of the status message
};

void PrintTo(const ErrorCase& c, std::ostream* os) { *os << c.name; }

class FlagMismatchTest : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(FlagMismatchTest, NamesBothValues) {
  const std::vector<std::string> lines =
      absl::StrSplit(ErrorOf(GetParam().doc, FullInputs()), '\n');
  EXPECT_THAT(lines, Contains(GetParam().error));
}

INSTANTIATE_TEST_SUITE_P(
    EachFlag, FlagMismatchTest,
    ::testing::Values(
        ErrorCase{"MicroBatch", R"({"train_micro_batch_size_per_gpu": 2})",
                  "deepspeed.train_micro_batch_size_per_gpu: 2 disagrees with "
                  "--per_device_train_batch_size 4"},
        ErrorCase{"GradAccum", R"({"gradient_accumulation_steps": 8})",
                  "deepspeed.gradient_accumulation_steps: 8 disagrees with "
                  "--gradient_accumulation_steps 4"},
        ErrorCase{"GradientClipping", R"({"gradient_clipping": 1.0})",
                  "deepspeed.gradient_clipping: 1.0 disagrees with --max_grad_norm 0.5"},
        ErrorCase{"Bf16", R"({"bf16": {"enabled": false}})",
                  "deepspeed.bf16.enabled: false disagrees with --bf16 true"},
        ErrorCase{"Fp16", R"({"fp16": {"enabled": true}})",
                  "deepspeed.fp16.enabled: true disagrees with --fp16 false"},
        ErrorCase{"Lr", R"({"optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}})",
                  "deepspeed.optimizer.params.lr: 0.0001 disagrees with --learning_rate 2e-05"},
        ErrorCase{"Betas", R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.9, 0.999]}}})",
                  "deepspeed.optimizer.params.betas: [0.9,0.999] disagrees with "
                  "--adam_beta1/--adam_beta2 [0.85,0.95]"},
        ErrorCase{"Eps", R"({"optimizer": {"type": "Adam", "params": {"eps": 1e-8}}})",
                  "deepspeed.optimizer.params.eps: 1e-08 disagrees with --adam_epsilon 1e-06"},
        ErrorCase{"WeightDecay",
                  R"({"optimizer": {"type": "Adam", "params": {"weight_decay": 0.1}}})",
                  "deepspeed.optimizer.params.weight_decay: 0.1 disagrees with --weight_decay "
                  "0.01"},
        ErrorCase{"WarmupMaxLr",
                  R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.001}}})",
                  "deepspeed.scheduler.params.warmup_max_lr: 0.001 disagrees with "
                  "--learning_rate 2e-05"},
        ErrorCase{"WarmupNumSteps",
                  R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}})",
                  "deepspeed.scheduler.params.warmup_num_steps: 10 disagrees with "
                  "--warmup_steps 100"}),
    CaseName<ErrorCase>);

class BadValueTest : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(BadValueTest, IsErrorNamingTheKey) {
  EXPECT_EQ(ErrorOf(GetParam().doc, SeedInputs()), GetParam().error);
}

INSTANTIATE_TEST_SUITE_P(
    EachKind, BadValueTest,
    ::testing::Values(
        ErrorCase{"Stage", R"({"zero_optimization": {"stage": 4}})",
                  "deepspeed.zero_optimization.stage: must be one of 0,1,2,3, got 4"},
        ErrorCase{"Bool", R"({"zero_optimization": {"overlap_comm": "yes"}})",
                  "deepspeed.zero_optimization.overlap_comm: must be true or false, got \"yes\""},
        ErrorCase{"NegativeCount", R"({"zero_optimization": {"sub_group_size": -1}})",
                  "deepspeed.zero_optimization.sub_group_size: must be a non-negative integer, "
                  "got -1"},
        ErrorCase{"FractionalCount", R"({"zero_optimization": {"reduce_bucket_size": 1.5}})",
                  "deepspeed.zero_optimization.reduce_bucket_size: must be a non-negative "
                  "integer, got 1.5"},
        ErrorCase{"NumberAsString", R"({"gradient_clipping": "1.0"})",
                  "deepspeed.gradient_clipping: must be a non-negative number, got \"1.0\""},
        ErrorCase{"OffloadDevice", R"({"zero_optimization": {"offload_param": {"device": "gpu"}}})",
                  "deepspeed.zero_optimization.offload_param.device: must be one of "
                  "\"cpu\",\"none\", got \"gpu\""},
        ErrorCase{"NvmeOffload",
                  R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme",
                      "nvme_path": "/local_nvme"}}})",
                  "deepspeed.zero_optimization.offload_optimizer.device: \"nvme\" is not "
                  "supported by trainctl; use one of \"cpu\",\"none\""},
        ErrorCase{"OptimizerType", R"({"optimizer": {"type": "Lamb"}})",
                  "deepspeed.optimizer.type: \"Lamb\" is not supported by trainctl; use one of "
                  "\"Adam\",\"AdamW\""},
        ErrorCase{"SchedulerType", R"({"scheduler": {"type": "Cosine"}})",
                  "deepspeed.scheduler.type: must be one of \"WarmupLR\",\"WarmupDecayLR\","
                  "\"WarmupCosineLR\", got \"Cosine\""},
        ErrorCase{"Betas", R"({"optimizer": {"type": "Adam", "params": {"betas": [0.9]}}})",
                  "deepspeed.optimizer.params.betas: must be [beta1, beta2] with each in [0, 1), "
                  "got [0.9]"},
        ErrorCase{"AutoWhereHfHasNone", R"({"zero_optimization": {"stage": "auto"}})",
                  "deepspeed.zero_optimization.stage: \"auto\" is not resolvable for this key"},
        ErrorCase{"NonObjectSection", R"({"zero_optimization": 3})",
                  "deepspeed.zero_optimization: must be an object, got 3"},
        ErrorCase{"ApexAmp", R"({"amp": {"enabled": true, "opt_level": "O1"}})",
                  "deepspeed.amp: apex amp is not supported by trainctl; use fp16 or bf16"},
        ErrorCase{"MissingOptimizerType", R"({"optimizer": {"params": {"lr": "auto"}}})",
                  "deepspeed.optimizer.type: required when the optimizer section is present"},
        ErrorCase{"DecayWithoutTotalSteps", R"({"scheduler": {"type": "WarmupDecayLR"}})",
                  "deepspeed.scheduler.params.total_num_steps: required by WarmupDecayLR"},
        ErrorCase{"ContiguousCheckpointing",
                  R"({"activation_checkpointing": {"partition_activations": true,
                      "contiguous_memory_optimization": true}})",
                  "deepspeed.activation_checkpointing.contiguous_memory_optimization: requires "
                  "activation_checkpointing.number_checkpoints"}),
    CaseName<ErrorCase>);

TEST(DeepSpeedConfigTest, Bf16AndFp16BothEnabledIsError) {
  DeepSpeedInputs in = SeedInputs();
  EXPECT_THAT(ErrorOf(R"({"bf16": {"enabled": true}, "fp16": {"enabled": true}})", in),
              HasSubstr("deepspeed.bf16.enabled: bf16 and fp16 cannot both be enabled"));
}

TEST(DeepSpeedConfigTest, EveryErrorIsReportedOnItsOwnLine) {
  const std::vector<std::string> lines =
      absl::StrSplit(ErrorOf(R"({"zero_optimization": {"stage": 7, "overlap_comm": 1},
                  "train_micro_batch_size_per_gpu": 2})",
                             SeedInputs()),
                     '\n');
  EXPECT_THAT(lines, ElementsAre(StartsWith("deepspeed.zero_optimization.overlap_comm: "),
                                 StartsWith("deepspeed.zero_optimization.stage: "),
                                 StartsWith("deepspeed.train_micro_batch_size_per_gpu: ")));
}

TEST(DeepSpeedConfigTest, NonObjectRootIsError) {
  absl::StatusOr<ResolvedDeepSpeedConfig> r = ResolveDeepSpeedConfig(json::array(), SeedInputs());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "deepspeed: the document root must be a JSON object, got array");
}

TEST(DeepSpeedConfigTest, InvalidInputsAreNamedByFlag) {
  DeepSpeedInputs in = SeedInputs();
  in.micro_batch = 0;
  in.fp16 = true;
  EXPECT_EQ(ErrorOf("{}", in),
            "--per_device_train_batch_size: must be positive, got 0\n"
            "--bf16: cannot be combined with --fp16");
}

TEST(DeepSpeedConfigTest, SyntaxErrorNamesSourceLineAndOffset) {
  absl::StatusOr<json> doc = ParseDeepSpeedJson("{\n\"stage\": 3,\n}", "configs/bad.json");
  ASSERT_FALSE(doc.ok());
  EXPECT_EQ(doc.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(doc.status().message()),
              AllOf(StartsWith("configs/bad.json: JSON syntax error at line 3, column 1 "
                               "(byte offset 14): "),
                    HasSubstr("unexpected '}'")));
}

TEST(DeepSpeedConfigTest, EmptyTextIsSyntaxError) {
  absl::StatusOr<json> doc = ParseDeepSpeedJson("", "empty.json");
  ASSERT_FALSE(doc.ok());
  EXPECT_THAT(std::string(doc.status().message()),
              StartsWith("empty.json: JSON syntax error at line 1, column 1 (byte offset 0)"));
}

// --- Warnings and accepted forms ---

TEST(DeepSpeedConfigTest, UnknownKeyIsWarning) {
  absl::StatusOr<ResolvedDeepSpeedConfig> r = Resolve(
      R"({"zero_optimization": {"stage": 3, "stage3_bogus": 1}, "bogus": {}})", SeedInputs());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->warnings, Contains("deepspeed.bogus: unknown key; ignored"));
  EXPECT_THAT(r->warnings,
              Contains("deepspeed.zero_optimization.stage3_bogus: unknown key; ignored"));
}

TEST(DeepSpeedConfigTest, UnsupportedDeepSpeedKeysAreWarnings) {
  absl::StatusOr<ResolvedDeepSpeedConfig> r = Resolve(
      R"({"flops_profiler": {"enabled": true}, "tensorboard": {"enabled": true},
          "comms_logger": {"enabled": true}, "amp": {"enabled": false},
          "zero_optimization": {"stage": 3, "zero_quantized_weights": true}})",
      SeedInputs());
  ASSERT_TRUE(r.ok()) << r.status();
  for (const char* key : {"flops_profiler", "tensorboard", "comms_logger", "amp",
                          "zero_optimization.zero_quantized_weights"}) {
    EXPECT_THAT(r->warnings,
                Contains(std::string("deepspeed.") + key + ": not supported by trainctl; ignored"));
  }
}

TEST(DeepSpeedConfigTest, IntegralFloatsAreAcceptedForIntegers) {
  absl::StatusOr<ResolvedDeepSpeedConfig> r = Resolve(
      R"({"train_micro_batch_size_per_gpu": 4.0, "train_batch_size": 1.28e2,
          "zero_optimization": {"stage": 3.0, "reduce_bucket_size": 5e8,
                                "allgather_bucket_size": 2e8}})",
      SeedInputs());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->config.stage, 3);
  EXPECT_EQ(r->config.reduce_bucket_size, 500000000);
  EXPECT_EQ(r->config.allgather_bucket_size, 200000000);
  EXPECT_EQ(r->config.train_batch_size, 128);
}

TEST(DeepSpeedConfigTest, DeprecatedGatherAliasIsHonouredWithWarning) {
  absl::StatusOr<ResolvedDeepSpeedConfig> r = Resolve(
      R"({"zero_optimization": {"stage": 3, "stage3_gather_fp16_weights_on_model_save": true}})",
      SeedInputs());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->config.stage3_gather_16bit_weights_on_model_save);
  EXPECT_THAT(r->warnings,
              Contains(StartsWith("deepspeed.zero_optimization."
                                  "stage3_gather_fp16_weights_on_model_save: deprecated alias")));
}

TEST(DeepSpeedConfigTest, DisagreeingGatherAliasIsError) {
  EXPECT_EQ(ErrorOf(R"({"zero_optimization": {"stage": 3,
                        "stage3_gather_16bit_weights_on_model_save": true,
                        "stage3_gather_fp16_weights_on_model_save": false}})",
                    SeedInputs()),
            "deepspeed.zero_optimization.stage3_gather_fp16_weights_on_model_save: disagrees "
            "with zero_optimization.stage3_gather_16bit_weights_on_model_save");
}

TEST(DeepSpeedConfigTest, DeprecatedCpuOffloadIsErrorOnlyWhenOn) {
  EXPECT_EQ(ErrorOf(R"({"zero_optimization": {"stage": 2, "cpu_offload": true}})", SeedInputs()),
            "deepspeed.zero_optimization.cpu_offload: deprecated and not read by trainctl; use "
            "zero_optimization.offload_optimizer");
  absl::StatusOr<ResolvedDeepSpeedConfig> r =
      Resolve(R"({"zero_optimization": {"stage": 2, "cpu_offload": false}})", SeedInputs());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->warnings,
              Contains("deepspeed.zero_optimization.cpu_offload: not supported by trainctl; "
                       "ignored"));
}

TEST(DeepSpeedConfigTest, StageThreeKeysBelowStageThreeAreWarnings) {
  absl::StatusOr<ResolvedDeepSpeedConfig> r = Resolve(
      R"({"zero_optimization": {"stage": 2, "stage3_max_live_parameters": 1e9,
          "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}}})",
      SeedInputs());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->warnings, Contains("deepspeed.zero_optimization.stage3_max_live_parameters: only "
                                    "used by ZeRO stage 3; ignored at stage 2"));
  EXPECT_THAT(r->warnings, Contains("deepspeed.zero_optimization.offload_param: only used by ZeRO "
                                    "stage 3; ignored at stage 2"));
  EXPECT_EQ(r->config.offload_param.device, OffloadDevice::kNone);
  EXPECT_EQ(r->config.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_FALSE(r->config.overlap_comm);
}

TEST(DeepSpeedConfigTest, SchedulerParamOfAnotherTypeIsWarning) {
  DeepSpeedInputs in = FullInputs();
  absl::StatusOr<ResolvedDeepSpeedConfig> r = Resolve(
      R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": "auto",
          "warmup_max_lr": "auto", "cos_min_ratio": 0.1}}})",
      in);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->warnings, Contains("deepspeed.scheduler.params.warmup_max_lr: not a "
                                    "WarmupCosineLR parameter; ignored"));
  EXPECT_DOUBLE_EQ(r->config.scheduler->cos_min_ratio, 0.1);
}

TEST(DeepSpeedConfigTest, EmptyDocumentTakesDeepSpeedDefaultsAndFlags) {
  DeepSpeedInputs in;  // defaults: one GPU, micro batch 8, no mixed precision
  absl::StatusOr<ResolvedDeepSpeedConfig> r = ResolveDeepSpeedConfig(json::object(), in);
  ASSERT_TRUE(r.ok()) << r.status();
  const DeepSpeedConfig& c = r->config;
  EXPECT_EQ(r->json, json({{"train_batch_size", 8}}));
  EXPECT_EQ(c.stage, 0);
  EXPECT_FALSE(c.overlap_comm);
  EXPECT_EQ(c.reduce_bucket_size, 500000000);
  EXPECT_EQ(c.stage3_prefetch_bucket_size, 50000000);
  EXPECT_EQ(c.stage3_param_persistence_threshold, 100000);
  EXPECT_FALSE(c.bf16_enabled);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 0.0);
  EXPECT_EQ(c.steps_per_print, 10);
  EXPECT_THAT(r->warnings, ElementsAre(StartsWith("deepspeed.gradient_clipping: absent")));
}

// configs/ds_zero3_cpu.json has bf16 off and carries fp16's loss-scaling keys in its bf16 section:
// the warning says they are fp16's, not that bf16 (which is off) ignores them.
TEST(DeepSpeedConfigTest, LossScalingKeysInBf16SectionWarnWithoutClaimingBf16IsOn) {
  DeepSpeedInputs in;
  in.world_size = 2;
  in.micro_batch = 1;
  absl::StatusOr<ResolvedDeepSpeedConfig> r =
      Resolve(ReadFile(TRAINCTL_SOURCE_DIR "/configs/ds_zero3_cpu.json"), in);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->config.bf16_enabled);
  for (const std::string& warning : r->warnings) EXPECT_THAT(warning, Not(HasSubstr("under bf16")));
  for (const char* key : {"loss_scale", "initial_scale_power"}) {
    EXPECT_THAT(r->warnings, Contains(absl::StrCat("deepspeed.bf16.", key,
                                                   ": only used by fp16 dynamic loss scaling; "
                                                   "ignored in the bf16 section")));
  }
}

TEST(DeepSpeedConfigTest, AbsentPrecisionSectionFollowsFlag) {
  absl::StatusOr<ResolvedDeepSpeedConfig> r = ResolveDeepSpeedConfig(json::object(), SeedInputs());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->config.bf16_enabled);
  EXPECT_FALSE(r->config.fp16.enabled);
}

// --- The trainer's half: the document the coordinator resolved, the model's "auto"s filled ---

TEST(DeepSpeedConfigTest, TheTrainerFillsOnlyTheHiddenSizeAutosTheCoordinatorLeft) {
  const std::string text = ReadFile(kSeedPath);
  DeepSpeedInputs coordinator = SeedInputs();
  coordinator.hidden_size.reset();  // a model directory: the coordinator cannot know it
  absl::StatusOr<ResolvedDeepSpeedConfig> sent = Resolve(text, coordinator);
  ASSERT_TRUE(sent.ok()) << sent.status();
  EXPECT_EQ(sent->json["zero_optimization"]["reduce_bucket_size"], "auto");
  absl::StatusOr<ResolvedDeepSpeedConfig> known = Resolve(text, SeedInputs());
  ASSERT_TRUE(known.ok()) << known.status();

  json doc = sent->json;
  const std::map<std::string, int64_t> filled = FillModelAutos(3584, &doc);
  EXPECT_EQ(filled, (std::map<std::string, int64_t>{
                        {"zero_optimization.reduce_bucket_size", 12845056},
                        {"zero_optimization.stage3_param_persistence_threshold", 35840},
                        {"zero_optimization.stage3_prefetch_bucket_size", 11560550}}));
  EXPECT_EQ(doc, known->json);  // what resolving with the hidden size known gives
  absl::StatusOr<DeepSpeedConfig> config = ReadResolvedDeepSpeedConfig(doc, coordinator);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->stage, known->config.stage);
  EXPECT_EQ(config->reduce_bucket_size, known->config.reduce_bucket_size);
  EXPECT_EQ(config->stage3_prefetch_bucket_size, known->config.stage3_prefetch_bucket_size);
  EXPECT_EQ(config->micro_batch, 4);
  EXPECT_EQ(config->grad_accum, 4);
  EXPECT_TRUE(config->bf16_enabled);
  EXPECT_EQ(config->gradient_clipping, known->config.gradient_clipping);
  EXPECT_EQ(FillModelAutos(3584, &doc), (std::map<std::string, int64_t>{}));  // nothing left
}

TEST(DeepSpeedConfigTest, ExplicitSizesStandWhenTheTrainerFills) {
  json doc = {
      {"zero_optimization",
       {{"stage", 3}, {"reduce_bucket_size", 1000}, {"stage3_prefetch_bucket_size", "auto"}}}};
  EXPECT_EQ(
      FillModelAutos(10, &doc),
      (std::map<std::string, int64_t>{{"zero_optimization.stage3_prefetch_bucket_size", 90}}));
  EXPECT_EQ(doc["zero_optimization"]["reduce_bucket_size"], 1000);
}

TEST(DeepSpeedConfigTest, ReadingAResolvedDocumentRefusesWhatNoResolverWrote) {
  absl::StatusOr<DeepSpeedConfig> left = ReadResolvedDeepSpeedConfig(
      json{{"zero_optimization", {{"stage3_param_persistence_threshold", "auto"}}}},
      DeepSpeedInputs());
  EXPECT_EQ(left.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(left.status().message()),
              HasSubstr("deepspeed.zero_optimization.stage3_param_persistence_threshold: still"));
  EXPECT_EQ(ReadResolvedDeepSpeedConfig(json::array(), DeepSpeedInputs()).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<DeepSpeedConfig> bad = ReadResolvedDeepSpeedConfig(
      json{{"optimizer", {{"type", "AdamW"}, {"params", {{"betas", {"a", "b"}}}}}}},
      DeepSpeedInputs());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), StartsWith("resolved DeepSpeed config: "));
  absl::StatusOr<DeepSpeedConfig> one_beta = ReadResolvedDeepSpeedConfig(
      json{{"optimizer", {{"type", "AdamW"}, {"params", {{"betas", {0.9}}}}}}}, DeepSpeedInputs());
  EXPECT_EQ(one_beta.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(one_beta.status().message()), HasSubstr("betas: not a pair"));
  absl::StatusOr<DeepSpeedConfig> size = ReadResolvedDeepSpeedConfig(
      json{{"zero_optimization", {{"reduce_bucket_size", "big"}}}}, DeepSpeedInputs());
  EXPECT_EQ(size.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(size.status().message()),
              HasSubstr("zero_optimization.reduce_bucket_size: not an integer"));
}

}  // namespace
}  // namespace trainctl
