#include "common/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/deepspeed_config.h"
#include "common/job_spec.h"
#include "common/parallelism_spec.h"
#include "common/pipeline_spec.h"

namespace trainctl {
namespace {

using trainctl::v1::JobKind;
using trainctl::v1::JobSpec;
using trainctl::v1::MemoryPlan;

constexpr int64_t kGiB = int64_t{1} << 30;
// Logits per chunk of the fused head loss (model/internal/linear_cross_entropy.h's default).
constexpr int64_t kLossChunkLogits = int64_t{1} << 27;

// What the plan depends on, read once from the spec and its resolved DeepSpeed config.
struct Inputs {
  JobKind kind = trainctl::v1::JOB_KIND_SFT;
  int nodes = 1, slots = 1, world = 1;
  int stage = 0;
  bool offload_optimizer = false, offload_param = false;
  int64_t prefetch_bucket = 0, persistence_threshold = 0;
  int64_t dtype_bytes = 4;  // the compute dtype's
  bool cuda = true;
  int64_t micro = 1, accumulation = 1, seq = 1, patches = 0;
  int64_t sequence_parallel = 1;  // Ulysses: each rank's decoder layers hold 1/sp of a sequence
  int64_t tensor_parallel = 1;    // Megatron: each rank holds 1/tp of every decoder MLP,
  bool tensor_parallel_attention = false;  // of its attention heads (not tensor_parallel_mlp_only)
  bool vocab_parallel = false;             // and of the embedding's and the head's rows
  bool checkpointing = false;
  int64_t prompt = 0, completion = 0, generations = 1;
  bool gather_for_generation = true;
  bool logit_loss = false;  // distillation with distill_loss: student and teacher logits
  ModelShape policy;        // the trained (or evaluated, or generating) model
  std::optional<ModelShape> reference, reward, teacher;
  bool trains = true;  // false: eval and trace distillation load the model forward-only
};

class Builder {
 public:
  void Device(const std::string& name, double bytes, const std::string& detail) {
    Add(plan_.add_gpu_parts(), name, bytes, detail);
  }
  void Host(const std::string& name, double bytes, const std::string& detail) {
    Add(plan_.add_cpu_parts(), name, bytes, detail);
  }
  MemoryPlan& plan() { return plan_; }

 private:
  static void Add(trainctl::v1::MemoryPart* part, const std::string& name, double bytes,
                  const std::string& detail) {
    part->set_name(name);
    part->set_bytes(static_cast<int64_t>(std::llround(bytes)));
    part->set_detail(detail);
  }
  MemoryPlan plan_;
};

std::string Count(double n) {
  if (n >= 1e9) return absl::StrFormat("%.2fB", n / 1e9);
  if (n >= 1e6) return absl::StrFormat("%.1fM", n / 1e6);
  return absl::StrCat(static_cast<int64_t>(n));
}

// Tensor parallelism (common/parallelism_spec.h): the trained model as one rank holds it. Each
// decoder layer's MLP (gate_proj and up_proj rows, down_proj columns) is 1/tp of the whole, and
// unless tensor_parallel_mlp_only so is its attention, split by heads: q_proj, k_proj and v_proj
// (weights and biases) keep the rank's heads' rows, o_proj their columns. The rest (norms, the
// vision tower) is replicated over the group, so the shape with intermediate / tp, heads / tp and
// kv_heads / tp (head_dim kept) counts the rank's parameters (replicated + MLP / tp + attention /
// tp per layer unit), its MLP activations (gate, up, SwiGLU product: intermediate / tp wide) and
// its attention's (q, k, v, the attention output, a CPU's probabilities: the rank's heads).
// Validation makes tp divide intermediate, and heads and kv_heads when attention is split.
// The same holds for the frozen models (reference, reward model, teacher), which run on the
// same mesh, and for rollouts (the MLPs and heads stay sliced while generating: the KV cache
// holds the rank's kv_heads).
// With vocab_parallel the embedding and the head hold vocab / tp rows, and the fused loss's
// chunk is of the rank's columns.
ModelShape TensorParallelRankShape(const Inputs& in, const ModelShape& whole) {
  ModelShape m = whole;
  m.intermediate /= in.tensor_parallel;
  if (in.tensor_parallel_attention) {
    m.head_size = whole.head_dim();
    m.heads /= in.tensor_parallel;
    m.kv_heads /= in.tensor_parallel;
  }
  if (in.vocab_parallel) m.vocab /= in.tensor_parallel;
  return m;
}

// The states' note on what a tensor-parallel rank holds of each decoder layer.
std::string TensorParallelDetail(const Inputs& in) {
  if (in.tensor_parallel <= 1) return "";
  return absl::StrCat(" (decoder MLPs", in.tensor_parallel_attention ? " and attention heads" : "",
                      " 1/", in.tensor_parallel, ")");
}

// The ranks ZeRO shards the trained model over: those with the same tensor position.
int64_t ZeroShardRanks(const Inputs& in) {
  return std::max<int64_t>(1, in.world / in.tensor_parallel);
}

// The trained model's states: fp32 master weights, AdamW moments, fp32 gradients and, below stage
// 3, the full working weights and 16-bit gradients every rank keeps (zero/engine.cc AdoptUnit).
// With tensor parallelism, of this rank's parameters (the MLPs' and heads' slices), over the ZeRO
// group.
void TrainedStates(const Inputs& in, Builder* b) {
  const ModelShape m = TensorParallelRankShape(in, in.policy);
  const int64_t params = m.Parameters();
  const int64_t zero = ZeroShardRanks(in);
  const int64_t slice = m.Sliced(in.stage >= 1 ? zero : 1);
  const bool host = in.offload_optimizer || !in.cuda;
  const std::string per = absl::StrCat(TensorParallelDetail(in),
                                       in.stage >= 1 ? absl::StrCat(" / ", zero, " ranks") : "");
  auto put = [&](const std::string& name, double bytes, const std::string& detail) {
    if (host && in.cuda) {
      b->Host(name, bytes * in.slots, absl::StrCat(detail, " x ", in.slots, " ranks of the node"));
    } else {
      b->Device(name, bytes, detail);
    }
  };
  put("master_weights", 4.0 * slice,
      absl::StrCat("fp32, ", Count(static_cast<double>(in.policy.Parameters())), " params", per));
  put("optimizer_states", 8.0 * slice, absl::StrCat("AdamW m and v, fp32", per));
  if (in.stage >= 1) put("fp32_gradients", 4.0 * slice, absl::StrCat("fp32 slice", per));
  if (in.stage < 3) {
    const int64_t full = in.stage >= 1 ? slice * zero : params;
    const bool aliased = in.stage == 0 && in.dtype_bytes == 4;  // the master is the working copy
    if (!aliased) {
      b->Device("working_weights", static_cast<double>(in.dtype_bytes * full),
                absl::StrCat(in.dtype_bytes, " B x every parameter (stage ", in.stage, ")"));
    }
    b->Device("gradients", static_cast<double>(in.dtype_bytes * full),
              absl::StrCat(in.dtype_bytes, " B x every parameter"));
  }
}

// A forward-only engine (reference, reward model, teacher; an evaluated model): its slices in the
// compute dtype, whole below stage 3, on the host with offload_param.
void FrozenStates(const Inputs& in, const ModelShape& m, const std::string& name, Builder* b) {
  const int64_t zero = ZeroShardRanks(in);
  const double bytes = static_cast<double>(
      in.dtype_bytes * TensorParallelRankShape(in, m).Sliced(in.stage == 3 ? zero : 1));
  const std::string detail =
      absl::StrCat(in.dtype_bytes, " B x ", Count(static_cast<double>(m.Parameters())), " params",
                   TensorParallelDetail(in),
                   in.stage == 3 ? absl::StrCat(" / ", zero, " ranks") : "", " (", m.source, ")");
  if (in.offload_param && in.cuda) {
    b->Host(name, bytes * in.slots, absl::StrCat(detail, " x ", in.slots, " ranks"));
  } else {
    b->Device(name, bytes, detail);
  }
}

// Elements one decoder layer keeps per token for backward: the two norms' inputs and outputs,
// q, k, v and the attention output, the MLP's gate, up and product; on CPUs the composite ops'
// extra copies and the eager attention's probabilities (heads x keys). q and the attention output
// are q_dim wide (h, or the rank's heads' share under split attention).
double LayerElementsPerToken(const ModelShape& m, const Inputs& in, int64_t keys) {
  const double h = m.hidden, q = m.q_dim(), kv = m.kv_dim(), i = m.intermediate;
  if (in.cuda) return 5 * h + 2 * q + 2 * kv + 3 * i;
  return 9 * h + 2 * q + 2 * kv + 4 * i + static_cast<double>(m.heads * keys);
}

// Elements one vision block keeps per patch; `keys` is its attention span (frame or window).
double BlockElementsPerPatch(const ModelShape& m, const Inputs& in, int64_t keys) {
  const double e = m.vision.embed, mlp = m.vision.mlp;
  const double base = 8 * e + (m.qwen25() ? 3 : 2) * mlp;
  return in.cuda ? base : base + 2 * e + static_cast<double>(m.vision.heads * keys);
}

// Activations of one micro-batch of `rows` x `seq` tokens with `patches` per row through `m`,
// kept for backward (with checkpointing: each unit's input, plus one unit recomputed).
double Activations(const Inputs& in, const ModelShape& m, int64_t rows, int64_t seq,
                   int64_t patches, std::string* detail) {
  // Sequence parallelism: the decoder layers hold this rank's slice (and attend over the whole
  // sequence for 1/sp of the heads); embeddings, images and the gathered last states stay whole.
  // Tensor parallelism: `m` is the rank's shape (TensorParallelRankShape), its MLPs 1/tp wide
  // and, unless tensor_parallel_mlp_only, its attention 1/tp of the heads.
  const double sp = static_cast<double>(in.sequence_parallel);
  const double tokens = static_cast<double>(rows * seq);
  const double layer = LayerElementsPerToken(m, in, seq) * tokens / sp;
  double text = in.checkpointing ? m.layers * m.hidden * tokens / sp + layer : m.layers * layer;
  text += 4.0 * m.hidden * tokens;  // embeddings out, final norm, the hidden-state gradients
  double vision = 0;
  if (patches > 0) {
    const double n = static_cast<double>(rows * patches);
    const int64_t window = m.vision.window > 0 ? m.vision.window / m.vision.patch : 0;
    const int64_t windowed =
        m.vision.window > 0 ? m.vision.depth - m.vision.full_attention_blocks : 0;
    const double full = BlockElementsPerPatch(m, in, patches) * n;
    const double win = BlockElementsPerPatch(m, in, std::min(patches, window * window)) * n;
    const double blocks = (m.vision.depth - windowed) * full + windowed * win;
    vision = in.checkpointing ? m.vision.depth * m.vision.embed * n + std::max(full, win) : blocks;
    vision += 6.0 * m.vision.embed * n;  // patch embedding, merger
  }
  *detail = absl::StrCat(
      rows, " x ", seq, " tokens",
      sp > 1 ? absl::StrCat(" (1/", in.sequence_parallel, " per rank in the decoder)") : "",
      in.tensor_parallel > 1
          ? absl::StrCat(", MLPs", in.tensor_parallel_attention ? " and attention heads" : "",
                         " 1/", in.tensor_parallel, " wide")
          : "",
      patches > 0 ? absl::StrCat(", ", rows, " x ", patches, " patches") : "",
      in.checkpointing ? ", checkpointed" : "", ", ", in.dtype_bytes, " B");
  return (text + vision) * static_cast<double>(in.dtype_bytes);
}

// The trained model's stage-3 working weights: the unit computing, the next one prefetched, and
// in backward a unit's 16-bit gradients computing while the previous one's are reduce-scattered.
void GatheredWeights(const Inputs& in, Builder* b) {
  if (in.stage < 3) return;
  const double unit = static_cast<double>(TensorParallelRankShape(in, in.policy).LargestUnit());
  const double prefetch = std::min(unit, static_cast<double>(in.prefetch_bucket));
  b->Device("gathered_weights", in.dtype_bytes * (2 * unit + prefetch),
            absl::StrCat("2 x the largest unit (", Count(unit), ") + prefetch ", Count(prefetch),
                         ", ", in.dtype_bytes, " B"));
}

}  // namespace

namespace {

// The loss's working memory: the fused head loss's chunk of fp32 logits and their gradients, the
// head's fp32 weight gradient and the hidden states' (SFT); full fp32 logits, their log-softmax and
// gradients where GRPO and logit distillation score every position (and the frozen model's).
double LossBytes(const Inputs& in, int64_t tokens, std::string* detail) {
  const double v = static_cast<double>(in.policy.vocab), h = static_cast<double>(in.policy.hidden);
  if (in.kind == trainctl::v1::JOB_KIND_SFT) {
    // vocab_parallel: the rank's columns of each chunk, its rows of the head's gradient.
    const double split = in.vocab_parallel ? static_cast<double>(in.tensor_parallel) : 1.0;
    const double chunk =
        std::min(static_cast<double>(tokens) * v, static_cast<double>(kLossChunkLogits)) / split;
    *detail = absl::StrCat("fp32 logits chunk ", Count(chunk), " x 2, head gradient ",
                           Count(v * h / split));
    return 4 * (2 * chunk + v * h / split + static_cast<double>(tokens) * h);
  }
  const double scored = in.kind == trainctl::v1::JOB_KIND_GRPO
                            ? static_cast<double>(in.micro * in.completion)
                            : static_cast<double>(tokens);
  const bool second = in.reference.has_value() || in.teacher.has_value();
  *detail =
      absl::StrCat(Count(scored), " positions x ", Count(v), " fp32 logits x ", second ? 4 : 3);
  return 4 * scored * v * (second ? 4 : 3);
}

// Train phase: activations, the loss, the gathered unit weights.
double TrainPhase(const Inputs& in, Builder* b) {
  std::string detail;
  const int64_t tokens = in.micro * in.seq;
  const double act = Activations(in, TensorParallelRankShape(in, in.policy), in.micro, in.seq,
                                 in.patches, &detail);
  b->Device("activations", act, detail);
  const double loss = LossBytes(in, tokens, &detail);
  b->Device("logits_and_loss", loss, detail);
  GatheredWeights(in, b);
  return act + loss;
}

// Rollout phase (GRPO, trace distillation, eval): the generating model's weights held gathered
// (stage 3 with gather_for_generation), its KV cache, the prefill's and the decoding's transients.
double RolloutPhase(const Inputs& in, const ModelShape& m, int64_t rows, Builder* b) {
  const double c = static_cast<double>(in.dtype_bytes);
  const double length = static_cast<double>(in.prompt + in.completion);
  double total = 0;
  if (in.stage == 3) {
    const double held = in.gather_for_generation ? static_cast<double>(m.Parameters())
                                                 : 2.0 * static_cast<double>(m.LargestUnit());
    b->Device("generation_weights", c * held,
              in.gather_for_generation ? "the whole model gathered (gather_for_generation)"
                                       : "2 units gathered per decoding step");
    total += c * held;
  }
  const double kv = 2.0 * m.layers * m.kv_dim() * length * rows * c;
  b->Device("kv_cache", kv,
            absl::StrCat(rows, " rows x ", in.prompt, " + ", in.completion, " positions x ",
                         m.layers, " layers"));
  // The sampled logits are whole (gathered over a vocab-parallel group): the policy's vocabulary.
  const double prefill =
      rows * in.prompt * c *
          (m.hidden + 2.0 * m.q_dim() + 2.0 * m.kv_dim() + 2.0 * m.intermediate) +
      4.0 * rows * static_cast<double>(in.policy.vocab) * 2;
  b->Device("prefill_and_sampling", prefill,
            "one layer's prefill, fp32 logits of the last position");
  return total + kv + prefill;
}

void Runtime(const Inputs& in, double transient, Builder* b) {
  if (!in.cuda) return;
  b->Device("cuda_runtime_and_nccl", 1.0 * kGiB, "CUDA context, cuBLAS workspace, NCCL buffers");
  b->Device("allocator_slack", 0.1 * transient, "10% of the phase's transient bytes");
}

// The plan of one job (not a pipeline).
MemoryPlan PlanInputs(const Inputs& in) {
  Builder persistent, train, rollout;
  if (in.trains) {
    TrainedStates(in, &persistent);
  } else {
    FrozenStates(in, in.policy, "model_weights", &persistent);
  }
  if (in.reference) FrozenStates(in, *in.reference, "reference_model", &persistent);
  if (in.reward) FrozenStates(in, *in.reward, "reward_model", &persistent);
  if (in.teacher) FrozenStates(in, *in.teacher, "teacher_model", &persistent);

  double train_bytes = -1, rollout_bytes = -1;
  if (in.trains) train_bytes = TrainPhase(in, &train);
  const bool generates = in.kind == trainctl::v1::JOB_KIND_GRPO || !in.trains;
  if (generates) {
    const ModelShape& gen = in.teacher && !in.trains ? *in.teacher : in.policy;
    int64_t rows = in.kind == trainctl::v1::JOB_KIND_GRPO      ? in.micro * in.accumulation
                   : in.kind == trainctl::v1::JOB_KIND_DISTILL ? in.micro * in.generations
                                                               : in.micro;
    // A sequence-parallel group's ranks each decode 1/sp of GRPO's rows when sp divides them.
    if (in.kind == trainctl::v1::JOB_KIND_GRPO && rows % in.sequence_parallel == 0) {
      rows /= in.sequence_parallel;
    }
    rollout_bytes = RolloutPhase(in, TensorParallelRankShape(in, gen), rows, &rollout);
  }
  Builder& busiest = rollout_bytes > train_bytes ? rollout : train;
  MemoryPlan plan = std::move(persistent.plan());
  plan.set_phase(&busiest == &rollout ? "rollout" : "train");
  for (auto& part : *busiest.plan().mutable_gpu_parts()) *plan.add_gpu_parts() = std::move(part);
  Builder runtime;
  Runtime(in, std::max(train_bytes, rollout_bytes), &runtime);
  for (auto& part : *runtime.plan().mutable_gpu_parts()) *plan.add_gpu_parts() = std::move(part);
  int64_t gpu = 0, cpu = 0;
  for (const auto& part : plan.gpu_parts()) gpu += part.bytes();
  for (const auto& part : plan.cpu_parts()) cpu += part.bytes();
  plan.set_gpu_bytes(gpu);
  plan.set_cpu_bytes(in.cuda ? cpu : gpu * in.slots);
  plan.set_device(in.cuda ? "cuda" : "cpu");
  plan.set_parameters(in.policy.Parameters());
  const DeepSpeedEstimate ds = EstimateDeepSpeedModelStates(
      in.stage, in.policy.Parameters(), in.policy.LargestLayerParameters(), in.slots, in.nodes,
      in.offload_optimizer, in.offload_param);
  plan.set_deepspeed_gpu_bytes(ds.gpu_bytes);
  plan.set_deepspeed_cpu_bytes(ds.cpu_bytes);
  plan.add_assumptions(absl::StrCat("model: ", in.policy.source));
  if (in.patches > 0) {
    plan.add_assumptions(absl::StrCat(
        "one image per sample at max_pixels, at most the sequence's tokens: ", in.patches,
        " patches"));
  }
  if (!in.cuda)
    plan.add_assumptions(
        "CPU ranks: device bytes are host memory, the process's own start-up footprint not "
        "counted");
  return plan;
}

absl::StatusOr<ModelShape> Shape(const std::string& model, const std::string& fallback,
                                 const MemoryPlanOptions& options) {
  auto shape = LookupModelShape(model, options.registry);
  if (!shape.ok() && !fallback.empty() && fallback != model) {
    return LookupModelShape(fallback, options.registry);
  }
  return shape;
}

// Reads a single job's plan inputs. `base_model`: where an earlier stage's output stands in for
// the model (a pipeline), the model the chain started from.
absl::StatusOr<Inputs> ReadInputs(const JobSpec& spec, const nlohmann::json& resolved,
                                  const std::string& base_model, const MemoryPlanOptions& options) {
  Inputs in;
  const auto& t = spec.training();
  in.kind = spec.kind();
  in.cuda = options.cuda;
  in.nodes = std::max(1, spec.resources().nodes());
  in.slots = std::max(1, spec.resources().slots_per_node());
  in.world = in.nodes * in.slots;
  auto policy = Shape(spec.model_name_or_path(), base_model, options);
  if (!policy.ok()) return policy.status();
  in.policy = *policy;
  bool bf16 = t.bf16(), fp16 = t.fp16();
  if (!resolved.is_null() && !(resolved.is_object() && resolved.empty())) {
    if (!resolved.is_object()) {
      return absl::InvalidArgumentError("resolved DeepSpeed config: not a JSON object");
    }
    nlohmann::json doc = resolved;  // the hidden-size "auto"s filled on a copy, as the trainer does
    FillModelAutos(in.policy.hidden, &doc);
    auto ds = ReadResolvedDeepSpeedConfig(doc, DeepSpeedInputsFor(spec, t));
    if (!ds.ok()) return ds.status();
    in.stage = ds->stage;
    in.offload_optimizer = ds->stage >= 1 && ds->offload_optimizer.device == OffloadDevice::kCpu;
    in.offload_param = ds->stage == 3 && ds->offload_param.device == OffloadDevice::kCpu;
    in.prefetch_bucket = ds->stage3_prefetch_bucket_size.value_or(0);
    in.persistence_threshold = ds->stage3_param_persistence_threshold.value_or(0);
    bf16 = ds->bf16_enabled;
    fp16 = ds->fp16.enabled;
  }
  in.dtype_bytes = bf16 || fp16 ? 2 : 4;
  in.micro = t.per_device_train_batch_size();
  in.accumulation = t.gradient_accumulation_steps();
  in.checkpointing = t.gradient_checkpointing();
  in.sequence_parallel = std::max(1, spec.parallelism().sequence_parallel_size());
  in.tensor_parallel = std::max(1, spec.parallelism().tensor_parallel_size());
  in.tensor_parallel_attention = TensorParallelSplitsAttention(spec);
  in.vocab_parallel = in.tensor_parallel > 1 && spec.parallelism().vocab_parallel();
  in.prompt = t.max_prompt_length();
  in.completion = t.max_completion_length();
  in.generations = t.num_generations();
  in.gather_for_generation = t.gather_for_generation();
  const bool grpo = in.kind == trainctl::v1::JOB_KIND_GRPO;
  in.seq = grpo ? in.prompt + in.completion : t.max_seq_length();
  const int64_t merge2 = in.policy.vision.merge * in.policy.vision.merge;
  const int64_t patch2 = in.policy.vision.patch * in.policy.vision.patch;
  in.patches = std::min(t.max_pixels() / patch2, (grpo ? in.prompt : in.seq) * merge2);
  in.trains = !(in.kind == trainctl::v1::JOB_KIND_EVAL ||
                (in.kind == trainctl::v1::JOB_KIND_DISTILL && !t.has_distill_loss()));
  if (in.kind == trainctl::v1::JOB_KIND_EVAL) in.micro = t.per_device_eval_batch_size();
  if (grpo && t.beta() != 0) in.reference = in.policy;
  if (grpo && !spec.reward_model_name_or_path().empty()) {
    auto reward = Shape(spec.reward_model_name_or_path(), "", options);
    if (!reward.ok()) return reward.status();
    in.reward = *reward;
  }
  if (in.kind == trainctl::v1::JOB_KIND_DISTILL && !spec.teacher_model_name_or_path().empty()) {
    auto teacher = Shape(spec.teacher_model_name_or_path(), "", options);
    if (!teacher.ok()) return teacher.status();
    in.teacher = *teacher;
  }
  return in;
}

// The inputs of the job, or of a pipeline's stage that needs the most (named in `stage`).
absl::StatusOr<Inputs> LargestInputs(const JobSpec& spec, const nlohmann::json& resolved,
                                     const MemoryPlanOptions& options, std::string* stage) {
  if (spec.kind() != trainctl::v1::JOB_KIND_PIPELINE) {
    return ReadInputs(spec, resolved, "", options);
  }
  std::optional<Inputs> largest;
  int64_t most = -1;
  for (int i = 0; i < spec.stages_size(); ++i) {
    auto stage_spec = PipelineStageSpec(spec, i);
    if (!stage_spec.ok()) return stage_spec.status();
    auto chain = ResolvePipelineStageInputs(spec, i);
    if (!chain.ok()) return chain.status();
    const std::string name = PipelineStageName(spec, i);
    // The pipeline's resolved config: stage name -> that stage's (none without DeepSpeed).
    const bool none = resolved.is_null() || (resolved.is_object() && resolved.empty());
    const auto it = none ? resolved.end() : resolved.find(name);
    if (!none && it == resolved.end()) {
      return absl::DataLossError(
          absl::StrCat("the resolved DeepSpeed config has no stage \"", name, "\""));
    }
    auto in = ReadInputs(*stage_spec, none ? nlohmann::json() : *it, chain->base_model, options);
    if (!in.ok()) return in.status();
    const int64_t bytes = PlanInputs(*in).gpu_bytes();
    if (bytes > most) {
      most = bytes;
      largest = *std::move(in);
      *stage = name;
    }
  }
  if (!largest) return absl::InvalidArgumentError("a pipeline without stages has no memory plan");
  return *std::move(largest);
}

struct Change {
  std::string what;
  Inputs in;
};

// The single changes a user would try, cheapest first (each alone).
std::vector<Change> SingleChanges(const Inputs& in) {
  std::vector<Change> out;
  if (in.trains && !in.checkpointing) {
    Change c{"gradient_checkpointing: true", in};
    c.in.checkpointing = true;
    out.push_back(std::move(c));
  }
  for (int64_t k = 2; in.trains && in.micro / k >= 1 && in.micro % k == 0; k *= 2) {
    Change c{absl::StrCat("per_device_train_batch_size: ", in.micro / k,
                          ", gradient_accumulation_steps: ", in.accumulation * k),
             in};
    c.in.micro /= k;
    c.in.accumulation *= k;
    out.push_back(std::move(c));
  }
  if (in.stage < 3) {
    Change c{"ZeRO stage 3 (zero_optimization.stage: 3)", in};
    c.in.stage = 3;
    out.push_back(std::move(c));
  }
  if (in.trains && !in.offload_optimizer) {
    Change c{"zero_optimization.offload_optimizer.device: cpu", in};
    c.in.stage = std::max(c.in.stage, 1);
    c.in.offload_optimizer = true;
    out.push_back(std::move(c));
  }
  if (!in.offload_param) {
    Change c{"ZeRO stage 3 with offload_optimizer and offload_param on the cpu", in};
    c.in.stage = 3;
    c.in.offload_optimizer = in.trains;
    c.in.offload_param = true;
    out.push_back(std::move(c));
  }
  for (int k = 2; k <= 8; k *= 2) {
    Change c{absl::StrCat("resources.nodes: ", in.nodes * k), in};
    c.in.nodes *= k;
    c.in.world = c.in.nodes * c.in.slots;
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace

std::vector<std::string> MemoryRemedies(const JobSpec& spec, const nlohmann::json& resolved,
                                        const MemoryPlanOptions& options, int64_t gpu_bytes,
                                        int limit) {
  std::string stage;
  auto in = LargestInputs(spec, resolved, options, &stage);
  if (!in.ok()) return {};
  std::vector<std::string> out;
  const std::vector<Change> changes = SingleChanges(*in);
  for (const Change& c : changes) {
    const int64_t bytes = PlanInputs(c.in).gpu_bytes();
    if (bytes <= gpu_bytes && static_cast<int>(out.size()) < limit) {
      out.push_back(absl::StrCat(c.what, " (", FormatBytes(bytes), " per rank)"));
    }
  }
  if (!out.empty()) return out;
  // None alone: all of them together but the nodes, then the nodes too.
  Inputs all = *in;
  std::string what;
  for (const Change& c : changes) {
    if (c.what.rfind("resources.nodes", 0) == 0) {
      all.nodes = c.in.nodes;
      all.world = c.in.world;
    } else {
      all.checkpointing |= c.in.checkpointing;
      all.micro = std::min(all.micro, c.in.micro);
      all.accumulation = std::max(all.accumulation, c.in.accumulation);
      all.stage = std::max(all.stage, c.in.stage);
      all.offload_optimizer |= c.in.offload_optimizer;
      all.offload_param |= c.in.offload_param;
    }
    what += (what.empty() ? "" : "; ") + c.what;
    const int64_t bytes = PlanInputs(all).gpu_bytes();
    if (bytes <= gpu_bytes) {
      out.push_back(absl::StrCat("all of: ", what, " (", FormatBytes(bytes), " per rank)"));
      break;
    }
  }
  return out;
}

std::string FormatBytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * kGiB) return absl::StrFormat("%.2f TiB", b / (1024.0 * kGiB));
  if (b >= kGiB) return absl::StrFormat("%.2f GiB", b / kGiB);
  if (b >= (1 << 20)) return absl::StrFormat("%.1f MiB", b / (1 << 20));
  if (b >= 1024) return absl::StrFormat("%.1f KiB", b / 1024);
  return absl::StrCat(bytes, " B");
}

std::string FormatMemoryPlan(const MemoryPlan& plan) {
  const bool cuda = plan.device() != "cpu";
  std::string out = absl::StrCat(
      "memory plan", plan.stage().empty() ? "" : absl::StrCat(" (stage ", plan.stage(), ")"), ": ",
      cuda ? "per GPU" : "per CPU rank (host memory)", ", busiest phase ", plan.phase(), "\n");
  absl::StrAppendFormat(&out, "  %-22s %12s %12s  %s\n", "part", cuda ? "per GPU" : "per rank",
                        "host/node", "how");
  for (const auto& p : plan.gpu_parts()) {
    absl::StrAppendFormat(&out, "  %-22s %12s %12s  %s\n", p.name(), FormatBytes(p.bytes()), "",
                          p.detail());
  }
  for (const auto& p : plan.cpu_parts()) {
    absl::StrAppendFormat(&out, "  %-22s %12s %12s  %s\n", p.name(), "", FormatBytes(p.bytes()),
                          p.detail());
  }
  absl::StrAppendFormat(&out, "  %-22s %12s %12s\n", "total", FormatBytes(plan.gpu_bytes()),
                        FormatBytes(plan.cpu_bytes()));
  absl::StrAppendFormat(
      &out, "  DeepSpeed's estimator, model states only: %s per GPU, %s per node\n",
      FormatBytes(plan.deepspeed_gpu_bytes()), FormatBytes(plan.deepspeed_cpu_bytes()));
  for (const auto& a : plan.assumptions()) absl::StrAppend(&out, "  (", a, ")\n");
  return out;
}

absl::StatusOr<MemoryPlan> PlanJobMemory(const JobSpec& spec, const nlohmann::json& resolved,
                                         const MemoryPlanOptions& options) {
  std::string stage;
  auto in = LargestInputs(spec, resolved, options, &stage);
  if (!in.ok()) return in.status();
  MemoryPlan plan = PlanInputs(*in);
  plan.set_stage(stage);
  return plan;
}

DeepSpeedEstimate EstimateDeepSpeedModelStates(int stage, int64_t total_params,
                                               int64_t largest_layer_params, int gpus_per_node,
                                               int nodes, bool offload_optimizer,
                                               bool offload_param) {
  // Python's int() truncation and float arithmetic, as DeepSpeed computes them.
  const double total = static_cast<double>(total_params);
  const double gpus = static_cast<double>(gpus_per_node) * nodes;
  const double buffer = 1.5;
  DeepSpeedEstimate e;
  if (stage == 3) {
    const double gpus_factor = 1.0 / nodes;
    const double largest = 4.0 * static_cast<double>(largest_layer_params);
    if (offload_optimizer && offload_param) {
      e.gpu_bytes = static_cast<int64_t>(largest);
      e.cpu_bytes = static_cast<int64_t>(total * 18 * gpus_factor * buffer);
    } else if (offload_optimizer) {
      e.gpu_bytes = static_cast<int64_t>(largest + std::trunc(2 * total / gpus));
      e.cpu_bytes = static_cast<int64_t>(total * 16 * gpus_factor * buffer);
    } else {
      e.gpu_bytes = static_cast<int64_t>(largest + std::trunc(18 * total / gpus));
      e.cpu_bytes = static_cast<int64_t>(static_cast<double>(largest_layer_params) * 4 *
                                         gpus_per_node * buffer);
    }
    return e;
  }
  if (offload_optimizer) {
    e.gpu_bytes = static_cast<int64_t>(2 * total);
    e.cpu_bytes = static_cast<int64_t>(total * std::max(4 * gpus, 16.0) * buffer);
  } else {
    e.gpu_bytes = static_cast<int64_t>(4 * total + std::trunc(16 * total / gpus));
    e.cpu_bytes = static_cast<int64_t>(total * 4 * gpus_per_node * buffer);
  }
  return e;
}

namespace {

absl::StatusOr<nlohmann::json> ParseResolved(const std::string& text) {
  if (text.empty()) return nlohmann::json();
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return absl::InvalidArgumentError("resolved DeepSpeed config: not JSON");
  }
  return doc;
}

}  // namespace

absl::StatusOr<MemoryPlan> PlanJobMemory(const JobSpec& spec, const std::string& resolved_json,
                                         const MemoryPlanOptions& options) {
  absl::StatusOr<nlohmann::json> resolved = ParseResolved(resolved_json);
  if (!resolved.ok()) return resolved.status();
  return PlanJobMemory(spec, *resolved, options);
}

std::vector<std::string> MemoryRemedies(const JobSpec& spec, const std::string& resolved_json,
                                        const MemoryPlanOptions& options, int64_t gpu_bytes,
                                        int limit) {
  absl::StatusOr<nlohmann::json> resolved = ParseResolved(resolved_json);
  if (!resolved.ok()) return {};
  return MemoryRemedies(spec, *resolved, options, gpu_bytes, limit);
}

}  // namespace trainctl
