// The training loop every job kind runs through, and the interface a kind implements.
//
//   set-up    device, comm (c10d), the model (an HF directory is loaded; a registry name or bare
//             config is initialised from training.seed), the coordinator's resolved DeepSpeed
//             config with its hidden-size "auto"s filled from the model, the ZeRO engine,
//             attention, then the stage's own set-up (its data, frozen models);
//   resume    the newest complete checkpoint under output_dir, the same on every rank;
//   step      the stage's micro-batches (forward + Engine::Backward), then the optimizer step
//             with the learning-rate schedule (linear/cosine/constant with warm-up), gradient
//             clipping by global norm, fp16 overflow skips;
//   events    `metric` every logging_steps (the window's mean loss and stage metrics, learning
//             rate, grad norm, epoch, throughput), `memory` after the first and last step,
//             `checkpoint` per save_strategy, `warning`s; rank 0 speaks for the job;
//   shutdown  a final checkpoint when the strategy saves, and a failed collective's process
//             group left alone (its threads may wait on a dead peer).
//
// A stage that does not train (Stage::trains() false, eval) shares the set-up and events, with a
// frozen engine, and runs Stage::Evaluate in place of resume, steps and saves.
//
// A stage (sft.h, grpo.h, ...) supplies only what differs: its set-up, its step's micro-batches,
// and its data position. MakeStage chooses one by JobKind (stages/registry.cc).
#ifndef TRAINCTL_WORKER_TRAINER_STAGES_LOOP_H_
#define TRAINCTL_WORKER_TRAINER_STAGES_LOOP_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/data/loader.h"
#include "common/parallelism_spec.h"
#include "common/rank_env.h"
#include "nlohmann/json.hpp"
#include "trainctl/v1/job.pb.h"
#include "worker/trainer/event_sink.h"
#include "worker/trainer/model/attention.h"
#include "worker/trainer/model/qwen2vl_config.h"
#include "worker/trainer/zero/comm.h"
#include "worker/trainer/zero/engine.h"

namespace trainctl::trainer {

// What a rank runs: the launch the coordinator decided (the worker's launch file), or a spec
// validated by the trainer's own `train --spec` for a run by hand.
struct TrainRun {
  trainctl::v1::JobSpec spec;  // validated, defaults and remedies applied (common/job_spec.h)
  // The DeepSpeed config as the coordinator resolved it
  // (LaunchTask.resolved_deepspeed_config_json);
  // "" without one. The loop fills only its hidden-size "auto"s (common/deepspeed_config.h).
  std::string deepspeed_config;
  bool resume = true;  // continue from the newest complete checkpoint in output_dir
  RankEnv env;         // this rank's launch environment, read by the trainer's main
};

struct TrainResult {
  int64_t steps = 0;            // optimizer steps done in total (including before a resume)
  int64_t resumed_from = 0;     // the step resumed from; 0 for a fresh start
  double last_loss = 0;         // loss of the last optimizer step
  std::string last_checkpoint;  // empty when none was written
};

// What the loop lends a stage. Valid from Stage::Setup to the end of the run.
struct StageContext {
  const trainctl::v1::JobSpec& spec;
  const trainctl::v1::TrainingArguments& training;
  torch::Device device;
  zero::Comm& comm;
  // The model being trained, or the frozen model of a stage that does not train; null when
  // Stage::EngineModel named none.
  zero::Engine* engine;
  const zero::EngineOptions& options;  // the engine's: frozen models are built alike
  const model::Qwen2VLConfig& config;  // the engine's model's
  const std::string& tokenizer_dir;    // the model directory when it is one, else ""
  EventSink& events;
  const RankEnv& env;  // the rank's launch environment (the model registry, a teacher's key)
  // The device mesh: a sequence- or tensor-parallel group's ranks read the same batches
  // (DataRank).
  DeviceMesh mesh;
  // This rank's sequence-parallel group, a sub-group of comm, and the decoder's exchange over it;
  // null when mesh.sequence == 1.
  zero::Comm* sequence_comm = nullptr;
  std::shared_ptr<const model::SequenceParallel> sequence_parallel;

  // Rank 0 speaks for the job: metrics, checkpoints and warnings come once, not once per rank.
  bool lead() const { return comm.rank() == 0; }
  void Warn(const std::string& message) const;
  // `t` (a host tensor) summed over every rank, each tensor-parallel group's counted once: its
  // ranks hold the same batches, losses and rewards. Sequence-parallel ranks' values are summed
  // (each is its share of the batch's loss, or a count the caller divides).
  absl::Status SumOverRanks(torch::Tensor& t, const std::string& what) const;
  // Splits a frozen model's (a reference's, a teacher's) decoder sequences over the sequence-
  // parallel group as the trained model's are; the group's ranks then run its forwards on their
  // shared batches together. INVALID_ARGUMENT naming `what` when sp does not divide the heads a
  // rank holds of it.
  absl::Status SplitSequences(zero::Engine& frozen, const std::string& what) const;
};

// One optimizer step's result as a stage reports it; every field is the same on every rank.
struct StageStep {
  double loss = 0;      // the global batch's loss
  int64_t tokens = 0;   // tokens processed by all ranks (throughput)
  int64_t samples = 0;  // samples (sequences) processed by all ranks
  // Further metrics by name (TRL's, e.g. "reward", "kl"): numbers are averaged over the
  // logging window and reported with the loop's own.
  nlohmann::json metrics = nlohmann::json::object();
};

class Stage {
 public:
  virtual ~Stage() = default;

  // After the engine exists: open data, build frozen models. Returns the optimizer steps in one
  // epoch (>= 1).
  virtual absl::StatusOr<int64_t> Setup(StageContext& ctx) = 0;

  // The micro-batches of optimizer step `step` (1-based): forwards and ctx.engine->Backward, so
  // that the gradients of every rank and micro-batch sum to the step's gradient. The loop runs
  // the optimizer step after.
  virtual absl::StatusOr<StageStep> Step(StageContext& ctx, int64_t step) = 0;

  // The data position to checkpoint after a step, and to continue from (`global_step` steps
  // done) when resuming.
  virtual data::LoaderState DataState() const = 0;
  virtual absl::Status RestoreDataState(const data::LoaderState& state, int64_t global_step) = 0;

  // False for a stage that only measures (eval): the loop then builds the model as a frozen
  // (forward-only) engine, calls Setup and then Evaluate once, and runs no optimizer step,
  // learning-rate schedule, checkpoint or resume (Step and the data state are never called).
  virtual bool trains() const { return true; }
  // The whole work of a stage that does not train, after Setup.
  virtual absl::Status Evaluate(StageContext& /*ctx*/) {
    return absl::UnimplementedError("this stage trains; it has no Evaluate");
  }
  // The model the loop builds ctx.engine of (ResolveModel's reference): spec.model_name_or_path.
  // A stage that does not train may name another (trace distillation's in-process teacher) or
  // none ("": an endpoint teacher; ctx.engine is then null and ctx.config, ctx.options defaults).
  virtual std::string EngineModel(const trainctl::v1::JobSpec& spec) const {
    return spec.model_name_or_path();
  }
};

// The base of a stage that only measures or generates (eval, trace distillation): no training
// step and no data position; it implements Setup and Evaluate.
class MeasuringStage : public Stage {
 public:
  bool trains() const final { return false; }
  absl::StatusOr<StageStep> Step(StageContext& /*ctx*/, int64_t /*step*/) final {
    return absl::FailedPreconditionError("this stage does not train");
  }
  data::LoaderState DataState() const final { return {}; }
  absl::Status RestoreDataState(const data::LoaderState& /*state*/, int64_t /*step*/) final {
    return absl::OkStatus();
  }
};

// The stage for `spec` (by its kind, and for distill by distill_loss): UNIMPLEMENTED naming the
// kind when this trainer has none.
absl::StatusOr<std::unique_ptr<Stage>> MakeStage(const trainctl::v1::JobSpec& spec);

// Runs `run.spec` to the end with the stage for its kind. INVALID_ARGUMENT / NOT_FOUND /
// DATA_LOSS for a bad model, data or checkpoint (naming it); UNAVAILABLE when a peer is gone;
// INTERNAL with LibTorch's message if a tensor operation fails.
absl::StatusOr<TrainResult> RunTraining(const TrainRun& run, EventSink* events);

// The model's config and, when `ref` is a directory with weights, that directory to load them
// from; otherwise a registry name or config path and "" (initialise from the seed). A training
// job's output directory (checkpoint-N folders, no config.json) stands for its newest complete
// checkpoint: how a pipeline stage takes the previous stage's model. Registry names are looked up
// in `registry` (model::FindModelConfig; the rank's TRAINCTL_MODEL_REGISTRY, "" for the default).
absl::StatusOr<std::pair<model::Qwen2VLConfig, std::string>> ResolveModel(
    const std::string& ref, const std::string& registry);

// The compute device of a rank: the CPU without CUDA; the one visible GPU when the worker made only
// one visible (CUDA_VISIBLE_DEVICES), else CUDA device `local_rank`.
torch::Device RankDevice(int local_rank);

}  // namespace trainctl::trainer

#endif  // TRAINCTL_WORKER_TRAINER_STAGES_LOOP_H_
