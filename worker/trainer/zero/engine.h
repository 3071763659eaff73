// The ZeRO engine: data-parallel training of a Qwen2-VL model across ranks with DeepSpeed's ZeRO
// stages, over Comm.
//
// The model's units (Units(): a decoder layer, a vision block, the embeddings, the head) are each
// flattened into one buffer, padded to a multiple of the world size W and split evenly: rank r owns
// elements [r*S, (r+1)*S) of every unit (S = ceil(numel / W)). What a rank keeps:
//   stage 0: full fp32 master weights and AdamW state; gradients all-reduced at each step;
//   stage 1: full working weights and gradients; master + AdamW state of its slice only
//            (gradients reduce-scattered at the step, updated slices all-gathered after);
//   stage 2: as 1, with gradients reduce-scattered after every micro-batch into an fp32 slice;
//   stage 3: only its slice (master + AdamW + fp32 gradient). A unit's working weights are
//            all-gathered (in the compute dtype) before it runs and freed after; the unit's
//            activations are kept as at stage 0, and its backward gathers the weights again
//            (only the weights: no second forward, unless gradient checkpointing asks for one)
//            and reduce-scatters the gradients into the owners' slices, overlapped with the
//            previous unit's backward. Units smaller than stage3_param_persistence_threshold
//            stay gathered.
//            With overlap_comm the next units' gathers (by the order recorded in the previous
//            forward) run while the current unit computes, bounded by
//            stage3_prefetch_bucket_size and stage3_max_live_parameters.
// At stage 3 the model is built unit by unit and each unit is sliced and freed at once, so no rank
// holds the whole model; HF weights are read the same way, slice by slice.
//
// Precision: weights and gradients in the compute dtype (bf16 / fp16 / fp32), master weights, the
// accumulated gradients and AdamW state in fp32. fp16 uses DeepSpeed's dynamic loss scaling.
// Gradient clipping uses the global norm over every rank's slices.
//
// A frozen engine (CreateFrozen) is forward-only: the reference model, reward model or
// distillation teacher next to a trained policy. It is sharded exactly like a trainable engine at
// the same stage (stage 3: each rank keeps its slice, built or read slice by slice; stages 0-2:
// the whole model, as those stages replicate weights) but keeps its slices in the compute dtype
// and has no optimizer state and no gradient buffers; its forwards run without autograd.
//
// Errors of collectives leave the engine as absl::Status (UNAVAILABLE naming the collective and
// the peers); c10::Error from tensor operations as INTERNAL.
//
// Not thread-safe: one training loop drives it.
#ifndef TRAINCTL_WORKER_TRAINER_ZERO_ENGINE_H_
#define TRAINCTL_WORKER_TRAINER_ZERO_ENGINE_H_

#include <torch/torch.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/deepspeed_config.h"
#include "nlohmann/json.hpp"
#include "trainctl/v1/job.pb.h"
#include "worker/trainer/model/qwen2vl.h"
#include "worker/trainer/model/tensor_parallel.h"
#include "worker/trainer/zero/adamw.h"
#include "worker/trainer/zero/comm.h"

namespace trainctl::zero {

struct EngineOptions {
  int stage = 0;
  torch::ScalarType compute_dtype = torch::kFloat32;
  torch::Device device{torch::kCPU};

  // fp16 loss scaling (DeepSpeed's names). static_loss_scale > 0 disables the dynamic scaler.
  bool fp16 = false;
  double static_loss_scale = 0;
  int64_t initial_scale_power = 16;
  int64_t loss_scale_window = 1000;
  int64_t hysteresis = 2;
  double min_loss_scale = 1;

  bool overlap_comm = false;
  int64_t reduce_bucket_size = 500000000;
  int64_t prefetch_bucket_size = 50000000;
  int64_t param_persistence_threshold = 100000;
  int64_t max_live_parameters = 1000000000;
  bool offload_optimizer = false;  // master weights and AdamW state in host memory
  bool offload_param = false;      // stage 3: parameter slices in host memory
  bool pin_memory = false;         // page-locked host buffers (CUDA builds)

  double gradient_clipping = 0;  // 0: none

  // Tensor parallelism (model/tensor_parallel.h), null without it: the decoder MLPs' weights (and
  // with tensor_parallel->attention its q/k/v/o_proj) are this rank's slices, and ZeRO shards over
  // `zero_group` (the ranks with this rank's tensor position, common/parallelism_spec.h), which
  // must then be set and outlive the engine. Checkpoints, Layout() and GatherFullWeights keep whole
  // weights either way.
  std::shared_ptr<const model::TensorParallel> tensor_parallel;
  Comm* zero_group = nullptr;

  // AdamW (or Adam with L2 when !adam_w_mode).
  double lr = 5e-5;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0;
  bool adam_w_mode = true;
};

// The engine's options from the job: the resolved DeepSpeed config when the job has one (from
// ReadResolvedDeepSpeedConfig: its hidden-size "auto"s already filled), else stage 0 from the
// training arguments; each value from one of the two (common/deepspeed_config.h). `warnings` gets
// one line per key that is accepted but changes nothing here.
EngineOptions EngineOptionsFrom(const std::optional<DeepSpeedConfig>& ds,
                                const trainctl::v1::TrainingArguments& t,
                                std::vector<std::string>* warnings);

struct StepResult {
  double grad_norm = 0;  // global, before clipping, unscaled
  bool skipped = false;  // fp16 overflow: no update, loss scale lowered
  double loss_scale = 1;
};

// Bytes this rank holds for training state, by kind (what the ZeRO paper counts).
struct MemoryStats {
  int64_t parameters = 0;          // total parameter count of the model
  int64_t master_bytes = 0;        // fp32 master weights
  int64_t optimizer_bytes = 0;     // AdamW moments
  int64_t gradient_bytes = 0;      // gradient buffers (compute dtype and fp32)
  int64_t working_bytes = 0;       // working weights in the compute dtype held now
  int64_t peak_working_bytes = 0;  // the most working weights held at once
};

class Engine {
 public:
  // Builds the model (sharded as the stage requires) with HF's initialisation from `seed`, or
  // loads `weights_dir` (an HF checkpoint directory) slice by slice. `comm` must outlive it.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const model::Qwen2VLConfig& config,
                                                        const EngineOptions& options, Comm* comm,
                                                        int64_t seed,
                                                        const std::string& weights_dir = "");
  // A forward-only engine (see above); same arguments.
  static absl::StatusOr<std::unique_ptr<Engine>> CreateFrozen(const model::Qwen2VLConfig& config,
                                                              const EngineOptions& options,
                                                              Comm* comm, int64_t seed,
                                                              const std::string& weights_dir = "");
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // The model to run forward on; at stage 3 its weights exist only while a unit runs.
  model::Qwen2VLForConditionalGeneration& model() { return *model_; }
  const EngineOptions& options() const { return options_; }
  // Every rank of the job (checkpoints write one file per rank of it); the engine shards over
  // options().zero_group when one is set, else over this.
  Comm& comm() { return *world_comm_; }
  bool frozen() const { return frozen_; }

  // Backpropagates one micro-batch's loss (scaled when fp16) and, at stage 2, reduce-scatters its
  // gradients. Gradients of every micro-batch and rank are summed. FAILED_PRECONDITION on a
  // frozen engine.
  absl::Status Backward(const torch::Tensor& loss);
  // The optimizer step at a gradient-accumulation boundary with learning rate `lr`.
  absl::StatusOr<StepResult> Step(double lr);

  // Collective. Holds every unit's working weights gathered until the returned object is
  // destroyed (stage 3; a no-op at stages 0-2, whose weights are always whole): generation then
  // runs its many small forwards without a gather per unit per token (TRL's
  // ds3_gather_for_generation). Costs the whole model in the compute dtype on every rank.
  class HeldWeights {
   public:
    HeldWeights() = default;
    HeldWeights(HeldWeights&& other) noexcept
        : engine_(std::exchange(other.engine_, nullptr)), bytes_(other.bytes_) {}
    HeldWeights& operator=(HeldWeights&& other) noexcept;
    ~HeldWeights();
    int64_t bytes() const { return bytes_; }  // working weights gathered for the hold

   private:
    friend class Engine;
    Engine* engine_ = nullptr;
    int64_t bytes_ = 0;
  };
  absl::StatusOr<HeldWeights> HoldWeights();

  MemoryStats Memory() const;
  // How many times a unit's forward has run so far, its first runs and any recomputation in
  // backward together (stage 3 only; 0 at stages 0-2): one per unit and micro-batch without
  // gradient checkpointing, two for a checkpointed unit.
  int64_t unit_forward_runs() const { return unit_forward_runs_; }
  // The fp16 loss scale the next micro-batches are scaled by (1 without fp16).
  double loss_scale() const { return options_.fp16 ? loss_scale_ : 1.0; }

  // Sharded state for checkpoints. Tensors named "<unit>.<kind>" hold the part of the unit's
  // flat buffer this rank saves; ranges() gives [begin, end) of each unit in that buffer.
  struct ShardState {
    std::vector<std::pair<std::string, torch::Tensor>> tensors;
    nlohmann::json ranges;  // {unit: [begin, end]}
    nlohmann::json engine;  // optimizer step count, loss scaler
  };
  ShardState SaveShards() const;
  // Reads the unit slices this rank owns from any layout written by SaveShards on any world size:
  // `read(unit, kind, begin, end)` returns elements [begin, end) of that unit's flat buffer.
  using RangeReader = std::function<absl::StatusOr<torch::Tensor>(
      const std::string& unit, const std::string& kind, int64_t begin, int64_t end)>;
  absl::Status LoadShards(const RangeReader& read, const nlohmann::json& engine);

  // Collective. The full weights in the model's HF names, in `dtype`, assembled one unit at a
  // time; returned where `keep` (e.g. on the rank that writes them), empty elsewhere.
  std::vector<std::pair<std::string, torch::Tensor>> GatherFullWeights(
      torch::ScalarType dtype = torch::kFloat32, bool keep = true);

  // The flat layout, for checkpoints and offline export:
  // [{"unit": name, "numel": F, "params": [[name, [shape...]], ...]}, ...] in Units() order.
  nlohmann::json Layout() const;

 private:
  struct Unit;
  class Runner;
  friend class Runner;

  Engine(const EngineOptions& options, Comm* comm, bool frozen);
  static absl::StatusOr<std::unique_ptr<Engine>> Make(const model::Qwen2VLConfig& config,
                                                      const EngineOptions& options, Comm* comm,
                                                      int64_t seed, const std::string& weights_dir,
                                                      bool frozen);
  absl::Status Build(const model::Qwen2VLConfig& config, int64_t seed,
                     const std::string& weights_dir);
  void AdoptUnit(const std::string& name,
                 const std::vector<std::pair<std::string, torch::Tensor>>& params);
  void SetFull(Unit& u, const torch::Tensor& full);

  // Stage 3 working weights.
  // A unit's working weights and those of the units it borrows from, gathered and bound (counted,
  // so nested users share them); Release frees them when the last user is done.
  void Acquire(Unit& u);
  void Release(Unit& u);
  void AcquireOne(Unit& u);
  void ReleaseOne(Unit& u);
  void StartGather(Unit& u);
  void Bind(Unit& u);
  void FreeWorking(Unit& u);
  void Prefetch(const std::vector<Unit*>& order, size_t next);
  void EndMicroStep();
  // Stage 3 gradients: `flat` (a unit's gradients in its layout) reduce-scattered into the
  // owner's slice; FinishReduces waits for all but the `keep` newest and adds them to the slices'
  // fp32 gradients, so a unit's reduce-scatter runs while the next unit's backward computes.
  void StartReduce(Unit& owner, torch::Tensor flat);
  void FinishReduces(size_t keep);
  void AbandonReduces();
  void RefreshWorkingWeights();

  void BackwardOrThrow(const torch::Tensor& loss);
  StepResult StepOrThrow(double lr);
  void ReduceScatterGradients();  // stages 1-2: full gradients -> fp32 slices
  torch::Tensor& ShardGrad(Unit& u);
  torch::TensorOptions MasterOptions() const;

  // StepOrThrow's steps, in its order. Gradients summed across ranks into each rank's slices
  // (stage 0: all-reduced; stage 1: reduce-scattered; stages 2-3 did it in Backward).
  void SumGradientsAcrossRanks();
  // The squared global gradient norm (loss-scaled), the same on every rank; one host sync. With
  // tensor parallelism a sliced weight's squares are summed over the group, a replicated one's
  // counted once (TensorParallelGradSquares).
  double GlobalGradSquares();
  double TensorParallelGradSquares();
  // INVALID_ARGUMENT, naming the numbers and `config`'s source, when the group's size does not
  // divide what it splits: the MLP width, the attention and key/value heads, the vocabulary.
  absl::Status CheckTensorParallelFits(const model::Qwen2VLConfig& config) const;
  // Tensor parallelism: the replicated weights' gradient slices averaged over the group, so that
  // every rank of it updates them identically even where kernels are not bit-for-bit repeatable
  // (on GPUs, fused attention's backward): the group's copies never drift apart.
  void AverageReplicatedGradients();
  // Tensor parallelism: a unit's flat buffer (this rank's layout, `numel` elements at least) as
  // the whole weights' flat buffer, gathering the group's slices (collective over the group), and
  // back. Identity without tensor parallelism.
  torch::Tensor WholeFlat(const Unit& u, const torch::Tensor& flat) const;
  torch::Tensor SlicedFlat(const Unit& u, const torch::Tensor& whole) const;
  int64_t WholeNumel(const Unit& u) const;
  std::vector<int64_t> WholeShape(const std::string& name, const std::vector<int64_t>& shape) const;
  // SaveShards under tensor parallelism: every unit's whole buffers, split over every rank of
  // the job as a run without it would save them (collective: gathers over both groups).
  ShardState SaveWholeShards() const;
  nlohmann::json EngineState() const;  // optimizer step count, loss scaler
  // fp16 overflow, dynamic scaler: hysteresis first, then the scale halved (floor: min_loss_scale).
  void LowerLossScale();
  // AdamW on each master slice with its gradients times `coefficient` (unscale and clip).
  void UpdateMasters(double coefficient, double lr);
  // fp16 with a dynamic scaler: the loss scale doubled every loss_scale_window good steps.
  void RaiseLossScaleAfterGoodStep();
  // Every gradient buffer zeroed (stage 3: dropped) for the next accumulation.
  void ClearGradients();

  EngineOptions options_;
  bool frozen_ = false;
  std::unique_ptr<ShardedAdamW> optimizer_;  // null when frozen
  Comm* world_comm_;
  Comm* comm_;  // the ranks units are sharded over (zero_group, else every rank)
  int world_;   // comm_'s size and this rank's place in it
  int rank_;
  const model::TensorParallel* tp_ = nullptr;  // set when options_.tensor_parallel->size > 1
  std::shared_ptr<model::Qwen2VLForConditionalGeneration> model_;
  std::vector<std::unique_ptr<Unit>> units_;  // Units() order
  std::map<std::string, Unit*> by_name_;
  std::unique_ptr<Runner> runner_;

  // Stage 3 prefetch: the order units ran in this micro-batch's forward and the last one's.
  std::vector<Unit*> trace_, last_trace_;
  int64_t live_numel_ = 0;
  int64_t peak_live_numel_ = 0;
  int64_t unit_forward_runs_ = 0;
  struct PendingReduce {
    Unit* owner = nullptr;
    Handle handle;
    torch::Tensor flat, part;  // kept alive until the collective is done
  };
  std::deque<PendingReduce> reducing_;

  double loss_scale_ = 1;
  int64_t good_steps_ = 0;
  int64_t hysteresis_left_ = 0;
};

}  // namespace trainctl::zero

#endif  // TRAINCTL_WORKER_TRAINER_ZERO_ENGINE_H_
