#include "common/job_spec.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/deepspeed_config.h"
#include "common/diagnostics_spec.h"
#include "common/internal/spec_checker.h"
#include "common/json_proto.h"
#include "common/model_catalog.h"
#include "common/parallelism_spec.h"
#include "common/pipeline_spec.h"
#include "common/remedies_spec.h"
#include "common/status_macros.h"

namespace trainctl {
namespace {

using internal::Checker;
using internal::CheckMaps;
using internal::CheckSizes;

using trainctl::v1::JobKind;
using trainctl::v1::PipelineStage;
using trainctl::v1::TrainingArguments;

constexpr const char* kSaveStrategies[] = {"no", "steps", "epoch"};
// transformers.SchedulerType values.
constexpr const char* kSchedulers[] = {"linear",
                                       "cosine",
                                       "cosine_with_restarts",
                                       "polynomial",
                                       "constant",
                                       "constant_with_warmup",
                                       "inverse_sqrt",
                                       "reduce_lr_on_plateau",
                                       "cosine_with_min_lr",
                                       "warmup_stable_decay"};
// TRL GRPOConfig's choices (trl/trainer/grpo_config.py); loss_type: those the trainer has.
constexpr const char* kLossTypes[] = {"grpo", "bnpo", "dr_grpo", "dapo"};
constexpr const char* kScaleRewards[] = {"group", "batch", "none"};
constexpr const char* kImportanceSamplingLevels[] = {"token", "sequence"};
// Logit distillation's divergences (worker/trainer/stages/distill_loss.h).
constexpr const char* kDistillLosses[] = {"forward_kl", "reverse_kl", "jsd"};
// Trace distillation's default system prompt: open-r1(-multimodal)'s SYSTEM_PROMPT, the format the
// format reward checks.
constexpr char kReasoningSystemPrompt[] =
    "A conversation between User and Assistant. The user asks a question, and the Assistant "
    "solves it. The assistant first thinks about the reasoning process in the mind and then "
    "provides the user with the answer. The reasoning process and answer are enclosed within "
    "<think> </think> and <answer> </answer> tags, respectively, i.e., <think> reasoning process "
    "here </think><answer> answer here </answer>";

// The file's bytes; INVALID_ARGUMENT naming the limit when it holds more than `max_bytes` (checked
// before reading, so a huge file costs nothing).
absl::StatusOr<std::string> ReadFile(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  }
  const std::streamoff size = in.tellg();
  if (size > static_cast<std::streamoff>(max_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", size, " bytes, over the limit of ", max_bytes, " bytes"));
  }
  in.seekg(0);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::string Dirname(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

void ApplyTrainingDefaults(TrainingArguments* t) {
  if (!t->has_per_device_train_batch_size()) t->set_per_device_train_batch_size(8);
  if (!t->has_per_device_eval_batch_size()) t->set_per_device_eval_batch_size(8);
  if (!t->has_gradient_accumulation_steps()) t->set_gradient_accumulation_steps(1);
  if (!t->has_learning_rate()) t->set_learning_rate(5e-5);
  if (!t->has_num_train_epochs()) t->set_num_train_epochs(3.0);
  if (!t->has_max_steps()) t->set_max_steps(-1);
  if (!t->has_bf16()) t->set_bf16(false);
  if (!t->has_fp16()) t->set_fp16(false);
  if (!t->has_logging_steps()) t->set_logging_steps(500);
  if (!t->has_save_strategy()) t->set_save_strategy("steps");
  if (!t->has_save_steps()) t->set_save_steps(500);
  if (!t->has_max_grad_norm()) t->set_max_grad_norm(1.0);
  if (!t->has_weight_decay()) t->set_weight_decay(0.0);
  if (!t->has_adam_beta1()) t->set_adam_beta1(0.9);
  if (!t->has_adam_beta2()) t->set_adam_beta2(0.999);
  if (!t->has_adam_epsilon()) t->set_adam_epsilon(1e-8);
  if (!t->has_warmup_ratio()) t->set_warmup_ratio(0.0);
  if (!t->has_warmup_steps()) t->set_warmup_steps(0);
  if (!t->has_lr_scheduler_type()) t->set_lr_scheduler_type("linear");
  if (!t->has_seed()) t->set_seed(42);
  if (!t->has_gradient_checkpointing()) t->set_gradient_checkpointing(false);
  if (!t->has_packing()) t->set_packing(false);
  if (!t->has_max_seq_length()) t->set_max_seq_length(1024);
  if (!t->has_max_pixels()) t->set_max_pixels(12845056);
  if (!t->has_min_pixels()) t->set_min_pixels(3136);
  if (!t->has_max_prompt_length()) t->set_max_prompt_length(512);
  if (!t->has_max_completion_length()) t->set_max_completion_length(256);
  if (!t->has_num_generations()) t->set_num_generations(8);
  if (!t->has_beta()) t->set_beta(0.0);  // TRL's default since v0.19 (was 0.04)
  if (!t->has_ddp_timeout()) t->set_ddp_timeout(1800);
  // TRL GRPOConfig's defaults (grpo_config.py at f2cd577).
  if (!t->has_temperature()) t->set_temperature(1.0);
  if (!t->has_top_p()) t->set_top_p(1.0);
  if (!t->has_top_k()) t->set_top_k(0);
  if (!t->has_epsilon()) t->set_epsilon(0.2);
  if (!t->has_epsilon_high()) t->set_epsilon_high(t->epsilon());
  if (!t->has_loss_type()) t->set_loss_type("dapo");
  if (!t->has_scale_rewards()) t->set_scale_rewards("group");
  // TRL's __post_init__ maps the boolean spellings: True -> "group", False -> "none".
  if (absl::EqualsIgnoreCase(t->scale_rewards(), "true")) t->set_scale_rewards("group");
  if (absl::EqualsIgnoreCase(t->scale_rewards(), "false")) t->set_scale_rewards("none");
  if (!t->has_num_iterations()) t->set_num_iterations(1);
  if (!t->has_importance_sampling_level()) t->set_importance_sampling_level("token");
  if (!t->has_mask_truncated_completions()) t->set_mask_truncated_completions(false);
  if (!t->has_gather_for_generation()) t->set_gather_for_generation(true);
  // Logit distillation: TRL GKDConfig's beta (0.5); its loss runs at temperature 1; pure KD.
  // distill_loss stays unset unless given: unset selects trace distillation.
  if (!t->has_jsd_beta()) t->set_jsd_beta(0.5);
  if (!t->has_kd_temperature()) t->set_kd_temperature(1.0);
  if (!t->has_kd_alpha()) t->set_kd_alpha(1.0);
  // Trace distillation.
  if (!t->has_keep_per_prompt()) t->set_keep_per_prompt(1);
  if (!t->has_teacher_concurrency()) t->set_teacher_concurrency(8);
  if (!t->has_teacher_timeout()) t->set_teacher_timeout(600);
  if (!t->has_teacher_max_retries()) t->set_teacher_max_retries(5);
  if (!t->has_distill_system_prompt()) t->set_distill_system_prompt(kReasoningSystemPrompt);
}

bool UsesRewards(const JobSpec& spec) {
  if (spec.kind() == trainctl::v1::JOB_KIND_GRPO) return true;
  if (spec.kind() != trainctl::v1::JOB_KIND_PIPELINE) return false;
  for (const PipelineStage& stage : spec.stages()) {
    if (stage.kind() == trainctl::v1::JOB_KIND_GRPO) return true;
  }
  return false;
}

std::string BaseName(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The GRPO knobs; `num_rewards` counts the reward functions and the reward model.
void CheckGrpoTraining(const std::string& path, const TrainingArguments& t, int num_rewards,
                       Checker& c) {
  if (!(t.temperature() >= 0) || !std::isfinite(t.temperature())) {
    c.Fail(path + ".temperature", absl::StrCat("must be >= 0, got ", t.temperature()));
  }
  if (!(t.top_p() > 0 && t.top_p() <= 1)) {
    c.Fail(path + ".top_p", absl::StrCat("must be in (0, 1], got ", t.top_p()));
  }
  c.AtLeast(path + ".top_k", t.top_k(), 0);
  // The ratio is clipped below at 1 - epsilon: epsilon >= 1 leaves no lower bound (or a negative
  // one). epsilon_high bounds it above (1 + epsilon_high), any positive value.
  if (!(t.epsilon() > 0 && t.epsilon() < 1)) {
    c.Fail(
        path + ".epsilon",
        absl::StrCat("must be in (0, 1) (the lower clip bound is 1 - epsilon), got ", t.epsilon()));
  }
  c.Positive(path + ".epsilon_high", t.epsilon_high());
  c.OneOf(path + ".loss_type", t.loss_type(), kLossTypes);
  c.OneOf(path + ".scale_rewards", t.scale_rewards(), kScaleRewards);
  c.AtLeast(path + ".num_iterations", t.num_iterations(), 1);
  c.OneOf(path + ".importance_sampling_level", t.importance_sampling_level(),
          kImportanceSamplingLevels);
  if (t.reward_weights_size() > 0 && t.reward_weights_size() != num_rewards) {
    c.Fail(path + ".reward_weights",
           absl::StrCat("needs one weight per reward (", num_rewards,
                        ": reward_funcs, then reward_model_name_or_path when set), got ",
                        t.reward_weights_size()));
  }
  for (int i = 0; i < t.reward_weights_size(); ++i) {
    if (!std::isfinite(t.reward_weights(i))) {
      c.Fail(absl::StrCat(path, ".reward_weights[", i, "]"),
             absl::StrCat("must be a finite number, got ", t.reward_weights(i)));
    }
  }
}

// Eval's generation knobs: greedy (temperature 0) gives one completion per prompt.
void CheckEvalTraining(const std::string& path, const TrainingArguments& t, Checker& c) {
  c.AtLeast(path + ".num_generations", t.num_generations(), 1);
  c.AtLeast(path + ".max_prompt_length", t.max_prompt_length(), 1);
  c.AtLeast(path + ".max_completion_length", t.max_completion_length(), 1);
  if (!(t.temperature() >= 0) || !std::isfinite(t.temperature())) {
    c.Fail(path + ".temperature", absl::StrCat("must be >= 0, got ", t.temperature()));
  } else if (t.temperature() == 0 && t.num_generations() > 1) {
    c.Fail(path + ".num_generations",
           absl::StrCat("greedy decoding (temperature 0) gives one completion per prompt; set "
                        "temperature > 0 to sample ",
                        t.num_generations(), ", got ", t.num_generations()));
  }
  if (!(t.top_p() > 0 && t.top_p() <= 1)) {
    c.Fail(path + ".top_p", absl::StrCat("must be in (0, 1], got ", t.top_p()));
  }
  c.AtLeast(path + ".top_k", t.top_k(), 0);
}

// reward_funcs: known names, each once.
void CheckRewardFuncs(const JobSpec& spec, Checker& c) {
  const std::vector<std::string>& known = RewardFuncNames();
  std::set<std::string> seen;
  for (int i = 0; i < spec.reward_funcs_size(); ++i) {
    const std::string& name = spec.reward_funcs(i);
    const std::string path = absl::StrCat("spec.reward_funcs[", i, "]");
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      c.Fail(path, absl::StrCat("unknown reward function '", name,
                                "', known: ", absl::StrJoin(known, "|")));
    } else if (!seen.insert(name).second) {
      c.Fail(path, absl::StrCat("duplicate reward function '", name, "'"));
    }
  }
}

int NumRewards(const JobSpec& spec) {
  return spec.reward_funcs_size() + (spec.reward_model_name_or_path().empty() ? 0 : 1);
}

void CheckTraining(const std::string& path, const TrainingArguments& t, JobKind kind, int world,
                   int num_rewards, Checker& c) {
  c.AtLeast(path + ".per_device_train_batch_size", t.per_device_train_batch_size(), 1);
  c.AtLeast(path + ".per_device_eval_batch_size", t.per_device_eval_batch_size(), 1);
  c.AtLeast(path + ".gradient_accumulation_steps", t.gradient_accumulation_steps(), 1);
  c.Positive(path + ".learning_rate", t.learning_rate());
  if (t.max_steps() <= 0) c.Positive(path + ".num_train_epochs", t.num_train_epochs());
  if (t.max_steps() == 0 || t.max_steps() < -1) {
    c.Fail(path + ".max_steps",
           absl::StrCat("must be > 0, or -1 to use num_train_epochs, got ", t.max_steps()));
  }
  if (t.bf16() && t.fp16()) c.Fail(path + ".fp16", "bf16 and fp16 cannot both be enabled");
  c.Positive(path + ".logging_steps", t.logging_steps());
  c.OneOf(path + ".save_strategy", t.save_strategy(), kSaveStrategies);
  if (t.save_strategy() == "steps") c.Positive(path + ".save_steps", t.save_steps());
  if (t.has_save_total_limit()) c.AtLeast(path + ".save_total_limit", t.save_total_limit(), 1);
  c.AtLeast(path + ".max_grad_norm", t.max_grad_norm(), 0.0);
  c.AtLeast(path + ".weight_decay", t.weight_decay(), 0.0);
  c.InRange(path + ".adam_beta1", t.adam_beta1(), 0, 1, /*hi_open=*/true);
  c.InRange(path + ".adam_beta2", t.adam_beta2(), 0, 1, /*hi_open=*/true);
  c.Positive(path + ".adam_epsilon", t.adam_epsilon());
  c.InRange(path + ".warmup_ratio", t.warmup_ratio(), 0, 1, /*hi_open=*/false);
  c.AtLeast(path + ".warmup_steps", t.warmup_steps(), 0);
  c.OneOf(path + ".lr_scheduler_type", t.lr_scheduler_type(), kSchedulers);
  c.AtLeast(path + ".min_pixels", t.min_pixels(), int64_t{1});
  if (t.max_pixels() < t.min_pixels()) {
    c.Fail(path + ".max_pixels",
           absl::StrCat("must be >= min_pixels (", t.min_pixels(), "), got ", t.max_pixels()));
  }
  c.AtLeast(path + ".ddp_timeout", t.ddp_timeout(), 1);
  c.AtLeast(path + ".max_seq_length", t.max_seq_length(), 1);
  if (t.packing() && kind != trainctl::v1::JOB_KIND_SFT && kind != trainctl::v1::JOB_KIND_GRPO &&
      !(kind == trainctl::v1::JOB_KIND_DISTILL && t.has_distill_loss())) {
    c.Fail(path + ".packing",
           "only sft, grpo and logit distillation (distill_loss) jobs pack samples");
  }
  if (kind == trainctl::v1::JOB_KIND_DISTILL && t.has_distill_loss()) {
    c.OneOf(path + ".distill_loss", t.distill_loss(), kDistillLosses);
    c.InRange(path + ".jsd_beta", t.jsd_beta(), 0, 1, /*hi_open=*/false);
    c.Positive(path + ".kd_temperature", t.kd_temperature());
    c.InRange(path + ".kd_alpha", t.kd_alpha(), 0, 1, /*hi_open=*/false);
  }
  if (kind == trainctl::v1::JOB_KIND_EVAL) CheckEvalTraining(path, t, c);
  if (kind == trainctl::v1::JOB_KIND_DISTILL && !t.has_distill_loss()) {
    CheckEvalTraining(path, t, c);  // the teacher samples as eval does
    c.AtLeast(path + ".keep_per_prompt", t.keep_per_prompt(), 1);
    if (t.keep_per_prompt() > t.num_generations()) {
      c.Fail(path + ".keep_per_prompt",
             absl::StrCat("must be at most num_generations (", t.num_generations(), "), got ",
                          t.keep_per_prompt()));
    }
    c.AtLeast(path + ".teacher_concurrency", t.teacher_concurrency(), 1);
    c.Positive(path + ".teacher_timeout", t.teacher_timeout());
    c.AtLeast(path + ".teacher_max_retries", t.teacher_max_retries(), 0);
  }
  if (kind == trainctl::v1::JOB_KIND_GRPO) {
    c.AtLeast(path + ".num_generations", t.num_generations(), 2);
    c.AtLeast(path + ".max_prompt_length", t.max_prompt_length(), 1);
    c.AtLeast(path + ".max_completion_length", t.max_completion_length(), 1);
    c.AtLeast(path + ".beta", t.beta(), 0.0);
    CheckGrpoTraining(path, t, num_rewards, c);
    // Each prompt's group of completions must fit in one generation batch: TRL's
    // per_device_train_batch_size x processes x steps_per_generation (= gradient accumulation).
    const int64_t global =
        int64_t{world} * t.per_device_train_batch_size() * t.gradient_accumulation_steps();
    if (t.num_generations() >= 2 && global % t.num_generations() != 0) {
      c.Fail(path + ".num_generations",
             absl::StrCat("must divide the completions of one step (world ", world,
                          " x per_device_train_batch_size ", t.per_device_train_batch_size(),
                          " x gradient_accumulation_steps ", t.gradient_accumulation_steps(), " = ",
                          global, "), got ", t.num_generations()));
    }
  }
}

}  // namespace

DeepSpeedInputs DeepSpeedInputsFor(const JobSpec& spec, const TrainingArguments& t) {
  DeepSpeedInputs in;
  // DeepSpeed's world size for the batch is the data-parallel one: the ranks of a sequence- or
  // tensor-parallel group share their batches (common/parallelism_spec.h).
  const int world = spec.resources().nodes() * spec.resources().slots_per_node();
  const int sharing = std::max(1, spec.parallelism().tensor_parallel_size()) *
                      std::max(1, spec.parallelism().sequence_parallel_size());
  in.world_size = world % sharing == 0 ? world / sharing : world;
  in.micro_batch = t.per_device_train_batch_size();
  in.grad_accum = t.gradient_accumulation_steps();
  in.learning_rate = t.learning_rate();
  in.max_grad_norm = t.max_grad_norm();
  in.weight_decay = t.weight_decay();
  in.adam_beta1 = t.adam_beta1();
  in.adam_beta2 = t.adam_beta2();
  in.adam_epsilon = t.adam_epsilon();
  in.bf16 = t.bf16();
  in.fp16 = t.fp16();
  if (t.max_steps() > 0) {
    in.total_steps = t.max_steps();
    in.warmup_steps = t.warmup_steps() > 0
                          ? int64_t{t.warmup_steps()}
                          : static_cast<int64_t>(std::ceil(t.warmup_ratio() * t.max_steps()));
  }
  return in;
}

namespace {

// Resolves the DeepSpeed config for one (stage of a) job; errors and warnings get "spec." in front
// of the resolver's "deepspeed.<key>" paths, and `where` (a stage) after it when not empty.
std::optional<nlohmann::json> ResolveFor(nlohmann::json doc, const JobSpec& spec,
                                         const std::string& model, const TrainingArguments& t,
                                         const std::string& where, std::vector<std::string>* errors,
                                         std::vector<std::string>* warnings) {
  DeepSpeedInputs in = DeepSpeedInputsFor(spec, t);
  in.hidden_size = LookupHiddenSize(model);
  const std::string suffix = where.empty() ? "" : absl::StrCat(" (", where, ")");
  auto resolved = ResolveDeepSpeedConfig(std::move(doc), in);
  if (!resolved.ok()) {
    for (absl::string_view line : absl::StrSplit(resolved.status().message(), '\n')) {
      errors->push_back(absl::StrCat("spec.", line, suffix));
    }
    return std::nullopt;
  }
  for (const std::string& w : resolved->warnings)
    warnings->push_back(absl::StrCat("spec.", w, suffix));
  return std::move(resolved->json);  // the document is large: no copy
}

// Logit distillation (distill_loss set) needs the teacher whose logits the student learns, in
// process; trace distillation exactly one teacher, a checkpoint or an endpoint.
void CheckTeacher(const JobSpec& spec, JobKind kind, const TrainingArguments& t, Checker& c) {
  if (kind != trainctl::v1::JOB_KIND_DISTILL) return;
  const std::string& endpoint = spec.teacher_endpoint();
  const bool has_model = !spec.teacher_model_name_or_path().empty();
  if (t.has_distill_loss()) {
    if (!has_model) {
      c.Fail(
          "spec.teacher_model_name_or_path",
          absl::StrCat("required for logit distillation (distill_loss '", t.distill_loss(), "')"));
    }
    if (!endpoint.empty()) {
      c.Fail("spec.teacher_endpoint",
             absl::StrCat("logit distillation (distill_loss '", t.distill_loss(),
                          "') needs the teacher's logits in process; an endpoint serves only "
                          "trace distillation (no distill_loss)"));
    }
    return;
  }
  if (has_model == !endpoint.empty()) {
    c.Fail("spec.teacher_model_name_or_path",
           absl::StrCat("trace distillation (no distill_loss) needs exactly one teacher: "
                        "teacher_model_name_or_path (a checkpoint generating in process) or "
                        "teacher_endpoint (an OpenAI-compatible server); ",
                        has_model ? "both are set" : "neither is set"));
  }
  if (!endpoint.empty() && !absl::StartsWith(endpoint, "http://") &&
      !absl::StartsWith(endpoint, "https://")) {
    c.Fail("spec.teacher_endpoint",
           absl::StrCat("must be an http:// or https:// URL, got '", endpoint, "'"));
  }
}

// Every error at once: the decode errors, then the checks' errors on other paths (a field that did
// not decode was left unset, so a check of it would only repeat the problem).
absl::Status SpecErrors(const std::vector<std::string>& decode_errors,
                        const std::vector<std::string>& errors) {
  std::set<std::string> decoded;
  for (const std::string& e : decode_errors) decoded.insert(e.substr(0, e.find(": ")));
  std::vector<std::string> lines = decode_errors;
  for (const std::string& e : errors) {
    if (!decoded.count(e.substr(0, e.find(": ")))) lines.push_back(e);
  }
  return absl::InvalidArgumentError(absl::StrJoin(lines, "\n"));
}

}  // namespace

std::string JobKindName(JobKind kind) {
  return EnumNumberName(trainctl::v1::JobKind_descriptor(), kind);
}

const std::vector<std::string>& RewardFuncNames() {
  static const auto* const kNames = new std::vector<std::string>{"accuracy", "format", "iou"};
  return *kNames;
}

const std::vector<std::string>& DefaultRewardFuncs() {
  static const auto* const kDefault = new std::vector<std::string>{"accuracy", "format"};
  return *kDefault;
}

absl::StatusOr<JobSpec> ParseJobSpec(absl::string_view text, SpecFormat format,
                                     absl::string_view source,
                                     std::vector<std::string>* field_errors) {
  if (text.size() > kMaxSpecDocumentBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": ", text.size(), " bytes, over the limit of ", kMaxSpecDocumentBytes, " bytes"));
  }
  nlohmann::json doc;
  if (format == SpecFormat::kJson) {
    ASSIGN_OR_RETURN(doc, ParseJsonText(text, source));
  } else {
    ASSIGN_OR_RETURN(doc, YamlToJson(text, source));
  }
  if (!doc.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": a job spec must be a mapping, got ", Describe(doc)));
  }
  // Accept a Kubernetes-style wrapper (`spec:` at the top) as well as the bare spec.
  if (doc.size() == 1 && doc.contains("spec") && doc["spec"].is_object()) doc = doc["spec"];
  if (doc.contains("deepspeed") && doc["deepspeed"].is_object()) {
    doc["deepspeed_config_json"] = doc["deepspeed"].dump();
    doc.erase("deepspeed");
  }
  JobSpec spec;
  std::vector<std::string> errors;
  DecodeJsonIntoMessage(doc, "spec", &spec, &errors);
  if (field_errors != nullptr) {
    field_errors->insert(field_errors->end(), errors.begin(), errors.end());
  } else if (!errors.empty()) {
    return absl::InvalidArgumentError(absl::StrJoin(errors, "\n"));
  }
  return spec;
}

absl::StatusOr<JobSpec> LoadJobSpecFile(const std::string& path,
                                        std::vector<std::string>* field_errors) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path, kMaxSpecDocumentBytes));
  const SpecFormat format =
      absl::EndsWithIgnoreCase(path, ".json") ? SpecFormat::kJson : SpecFormat::kYaml;
  ASSIGN_OR_RETURN(JobSpec spec, ParseJobSpec(text, format, path, field_errors));
  if (absl::Status s = EmbedDeepSpeedConfig(Dirname(path), &spec); !s.ok()) {
    if (field_errors == nullptr || s.code() != absl::StatusCode::kInvalidArgument) return s;
    field_errors->push_back(std::string(s.message()));
  }
  return spec;
}

absl::Status EmbedDeepSpeedConfig(absl::string_view base_dir, JobSpec* spec) {
  if (spec->deepspeed().empty() || !spec->deepspeed_config_json().empty()) return absl::OkStatus();
  const std::string path = absl::StartsWith(spec->deepspeed(), "/")
                               ? spec->deepspeed()
                               : absl::StrCat(base_dir, "/", spec->deepspeed());
  auto text = ReadFile(path, kMaxDeepSpeedConfigBytes);
  if (!text.ok())
    return absl::InvalidArgumentError(absl::StrCat("spec.deepspeed: ", text.status().message()));
  // Syntax errors are reported here, where the file name still means something to the user.
  auto doc = ParseDeepSpeedJson(*text, path);
  if (!doc.ok())
    return absl::InvalidArgumentError(absl::StrCat("spec.deepspeed: ", doc.status().message()));
  spec->set_deepspeed_config_json(*text);
  return absl::OkStatus();
}

void ApplyJobSpecDefaults(JobSpec* spec) {
  // A stage that sets epsilon but not epsilon_high gets its own epsilon as the upper bound, not the
  // job's (the job's training arguments are made explicit before stages inherit them).
  if (!spec->training().has_epsilon_high()) {
    for (PipelineStage& stage : *spec->mutable_stages()) {
      TrainingArguments* t = stage.mutable_training();
      if (t->has_epsilon() && !t->has_epsilon_high()) t->set_epsilon_high(t->epsilon());
    }
  }
  // Eval decodes greedily, one completion per prompt, unless the spec asks to sample.
  const bool job_sets_temperature = spec->training().has_temperature();
  const bool job_sets_generations = spec->training().has_num_generations();
  auto eval_defaults = [&](trainctl::v1::JobKind kind, TrainingArguments* t) {
    if (kind != trainctl::v1::JOB_KIND_EVAL) return;
    if (!job_sets_temperature && !t->has_temperature()) t->set_temperature(0);
    if (!job_sets_generations && !t->has_num_generations()) t->set_num_generations(1);
  };
  for (PipelineStage& stage : *spec->mutable_stages()) {
    eval_defaults(stage.kind(), stage.mutable_training());
  }
  eval_defaults(spec->kind(), spec->mutable_training());
  ApplyTrainingDefaults(spec->mutable_training());
  if (UsesRewards(*spec) && spec->reward_funcs_size() == 0 &&
      spec->reward_model_name_or_path().empty()) {
    for (const std::string& name : DefaultRewardFuncs()) spec->add_reward_funcs(name);
  }
  auto* resources = spec->mutable_resources();
  if (!resources->has_nodes()) resources->set_nodes(1);
  if (!resources->has_slots_per_node()) resources->set_slots_per_node(1);
  if (!spec->has_max_restarts()) spec->set_max_restarts(0);
  ApplyRemediesDefaults(spec);
  if (spec->name().empty()) {
    const std::string model = spec->model_name_or_path().empty() && spec->stages_size() > 0
                                  ? spec->stages(0).model_name_or_path()
                                  : spec->model_name_or_path();
    spec->set_name(model.empty() ? JobKindName(spec->kind())
                                 : absl::StrCat(JobKindName(spec->kind()), "-",
                                                absl::AsciiStrToLower(BaseName(model))));
  }
  for (int i = 0; i < spec->stages_size(); ++i) {
    PipelineStage* stage = spec->mutable_stages(i);
    TrainingArguments merged = spec->training();
    // Fields the stage sets win; a list the stage sets replaces the job's (MergeFrom appends).
    if (stage->training().reward_weights_size() > 0) merged.clear_reward_weights();
    merged.MergeFrom(stage->training());
    ApplyTrainingDefaults(&merged);  // only normalises: every field is set by now
    *stage->mutable_training() = merged;
    if (stage->name().empty()) stage->set_name(absl::StrCat(JobKindName(stage->kind()), "-", i));
    if (stage->output_dir().empty() && !spec->output_dir().empty()) {
      stage->set_output_dir(absl::StrCat(spec->output_dir(), "/", stage->name()));
    }
    if (i == 0) {
      if (stage->model_name_or_path().empty())
        stage->set_model_name_or_path(spec->model_name_or_path());
      if (stage->data_path().empty()) stage->set_data_path(spec->data_path());
    }
  }
}

absl::StatusOr<ValidatedJobSpec> ValidateJobSpec(const JobSpec& input,
                                                 const std::vector<std::string>& decode_errors) {
  ValidatedJobSpec out;
  out.spec = input;
  JobSpec& spec = out.spec;
  ApplyJobSpecDefaults(&spec);

  std::vector<std::string> errors;
  Checker c(&errors);
  // A client built from other protos can send what no spec file can say (kind: 99).
  CheckKnownFieldsAndValues(input, "spec", &errors);
  const bool pipeline = spec.kind() == trainctl::v1::JOB_KIND_PIPELINE;
  if (spec.kind() == trainctl::v1::JOB_KIND_UNSPECIFIED) {
    c.Fail("spec.kind", "required, one of distill|sft|grpo|eval|pipeline|probe");
  }
  // A probe job measures the interconnect only: no model, no data, nothing written.
  const bool probe = spec.kind() == trainctl::v1::JOB_KIND_PROBE;
  if (!pipeline) {
    if (spec.model_name_or_path().empty() && !probe) c.Fail("spec.model_name_or_path", "required");
    if (spec.data_path().empty() && !probe) c.Fail("spec.data_path", "required");
    if (spec.stages_size() > 0) c.Fail("spec.stages", "only a pipeline job has stages");
  } else if (spec.stages_size() == 0) {
    c.Fail("spec.stages", "a pipeline needs at least one stage");
  }
  if (spec.output_dir().empty() && !probe) c.Fail("spec.output_dir", "required");
  c.AtLeast("spec.resources.nodes", spec.resources().nodes(), 1);
  c.AtLeast("spec.resources.slots_per_node", spec.resources().slots_per_node(), 1);
  c.AtLeast("spec.max_restarts", spec.max_restarts(), 0);
  // In 64 bits: both factors are user-supplied int32s.
  const int64_t world64 = int64_t{std::max(1, spec.resources().nodes())} *
                          std::max(1, spec.resources().slots_per_node());
  constexpr int64_t kMaxWorld = std::numeric_limits<int32_t>::max();
  if (world64 > kMaxWorld) {
    c.Fail("spec.resources",
           absl::StrCat("nodes x slots_per_node must be at most ", kMaxWorld, ", got ", world64));
  }
  const int world = static_cast<int>(std::min(world64, kMaxWorld));
  if (!pipeline) {
    CheckTraining("spec.training", spec.training(), spec.kind(), world, NumRewards(spec), c);
    CheckTeacher(spec, spec.kind(), spec.training(), c);
  }
  if (UsesRewards(spec)) CheckRewardFuncs(spec, c);
  // A pipeline's baseline goes to its eval stages (CheckPipelineStages).
  if (!spec.baseline_model_name_or_path().empty() && spec.kind() != trainctl::v1::JOB_KIND_EVAL &&
      !pipeline) {
    c.Fail("spec.baseline_model_name_or_path",
           absl::StrCat("only an eval job measures a baseline; this job is ",
                        JobKindName(spec.kind())));
  }
  CheckMaps(spec, c);
  CheckSizes(input, c);
  CheckRemedies(spec, c, &out.warnings);
  CheckDiagnostics(spec, c);
  CheckParallelism(spec, &errors);
  if (!spec.deepspeed().empty() && spec.deepspeed_config_json().empty()) {
    c.Fail(
        "spec.deepspeed_config_json",
        absl::StrCat(
            "empty: the DeepSpeed file '", spec.deepspeed(),
            "' was not embedded (trainctl submit embeds it; API clients must send the document)"));
  }
  // Every stage as the standalone job it runs as (common/pipeline_spec.h).
  if (pipeline) CheckPipelineStages(spec, &errors);
  if (!errors.empty() || !decode_errors.empty()) return SpecErrors(decode_errors, errors);

  if (!spec.deepspeed_config_json().empty()) {
    auto doc = ParseDeepSpeedJson(spec.deepspeed_config_json(), spec.deepspeed().empty()
                                                                    ? "spec.deepspeed_config_json"
                                                                    : spec.deepspeed());
    if (!doc.ok())
      return absl::InvalidArgumentError(absl::StrCat("spec.deepspeed: ", doc.status().message()));
    if (!pipeline) {
      // The one resolution: the parsed document moves in, uncopied.
      auto resolved = ResolveFor(*std::move(doc), spec, spec.model_name_or_path(), spec.training(),
                                 "", &errors, &out.warnings);
      if (resolved) {
        out.resolved_deepspeed_config_json = resolved->dump(2);
        out.resolved_deepspeed_config = std::move(*resolved);
      }
    } else {
      nlohmann::json per_stage = nlohmann::json::object();
      for (int i = 0; i < spec.stages_size(); ++i) {
        const PipelineStage& stage = spec.stages(i);
        // A stage training an earlier stage's output has the architecture of the chain's start.
        auto inputs = ResolvePipelineStageInputs(spec, i);
        const std::string model = inputs.ok() ? inputs->base_model : spec.model_name_or_path();
        auto resolved = ResolveFor(*doc, spec, model, stage.training(), "stage " + stage.name(),
                                   &errors, &out.warnings);
        if (resolved) per_stage[stage.name()] = std::move(*resolved);
      }
      out.resolved_deepspeed_config_json = per_stage.dump(2);
      out.resolved_deepspeed_config = std::move(per_stage);
    }
  }
  if (!errors.empty()) return absl::InvalidArgumentError(absl::StrJoin(errors, "\n"));
  return out;
}

}  // namespace trainctl
