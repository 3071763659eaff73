#include "worker/trainer/stages/loop.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#ifdef TRAINCTL_CUDA_BUILD
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/data/manifest.h"
#include "common/deepspeed_config.h"
#include "common/diagnostics_spec.h"
#include "common/job_spec.h"
#include "common/parallelism_spec.h"
#include "common/process_stats.h"
#include "common/status_macros.h"
#include "worker/trainer/checkpoint/trainer_checkpoint.h"
#include "worker/trainer/diagnostics/bandwidth_probe.h"
#include "worker/trainer/diagnostics/nccl_log.h"
#include "worker/trainer/model/attention.h"
#include "worker/trainer/model/status_guard.h"
#include "worker/trainer/stages/internal/flops.h"
#include "worker/trainer/stages/internal/mesh_groups.h"
#include "worker/trainer/stages/loss_spike.h"
#include "worker/trainer/stages/lr_schedule.h"
#include "worker/trainer/trainer_failure.h"

namespace trainctl::trainer {
namespace {

// The CUDA device's name for the peak-FLOPs table; empty on CPUs (MFU then needs
// TRAINCTL_PEAK_FLOPS).
std::string DeviceName(const torch::Device& device) {
#ifdef TRAINCTL_CUDA_BUILD
  if (device.is_cuda()) return at::cuda::getDeviceProperties(device.index())->name;
#endif
  (void)device;
  return std::string();
}

namespace fs = std::filesystem;

bool HasWeights(const fs::path& dir) {
  return fs::exists(dir / "model.safetensors") || fs::exists(dir / "model.safetensors.index.json");
}

// The tokenizer directory a prepared dataset names in its manifest ("prepared.tokenizer"), when
// it still holds tokenizer.json; "" otherwise (raw JSONL, no manifest, moved files).
std::string PreparedWithTokenizer(const std::string& data_path) {
  std::ifstream in(fs::path(data_path) / "manifest.json", std::ios::binary);
  if (!in) return "";
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<data::DatasetManifest> manifest =
      data::ParseManifest(text.str(), data_path + "/manifest.json");
  if (!manifest.ok() || manifest->tokenizer.empty() ||
      !fs::exists(fs::path(manifest->tokenizer) / "tokenizer.json")) {
    return "";
  }
  return manifest->tokenizer;
}

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

// NCCL's INFO log for this rank (diagnostics/nccl_log.h): the variables the job did not set, set
// before the process group exists. The files go to <output_dir>/diagnostics, or a temporary
// directory of this process when the job has no output_dir (a probe job).
absl::StatusOr<NcclLogPlan> PrepareNcclLog(const trainctl::v1::JobSpec& spec, const RankEnv& env,
                                           const std::string& host) {
  std::error_code ec;
  const fs::path dir = spec.output_dir().empty() ? fs::temp_directory_path(ec) /
                                                       ("trainctl-nccl-" + std::to_string(getpid()))
                                                 : fs::path(spec.output_dir()) / "diagnostics";
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create ", dir.string(), " for NCCL's log: ", ec.message()));
  }
  NcclLogPlan plan = PlanNcclLog(
      [&env](const std::string& name) -> std::optional<std::string> {
        auto it = env.nccl.find(name);
        if (it == env.nccl.end()) return std::nullopt;
        return it->second;
      },
      env.rank, env.local_rank, dir.string(), host, getpid());
  // For NCCL, which reads its settings from the environment when it creates its communicator.
  for (const auto& [name, value] : plan.set_env) setenv(name.c_str(), value.c_str(), 0);
  return plan;
}

// Optimizer steps between events/saves: HF's `*_steps` may be a ratio of the total when < 1.
int64_t Interval(double steps, int64_t total) {
  if (steps < 1) return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(steps * total)));
  return static_cast<int64_t>(steps);
}

class Loop {
 public:
  Loop(const TrainRun& run, EventSink* events)
      : spec_(run.spec),
        t_(run.spec.training()),
        deepspeed_config_(run.deepspeed_config),
        env_(run.env),
        events_(events) {}
  ~Loop() {
    stage_.reset();
    const bool failed = (comm_ && comm_->failed()) || groups_.failed();
    if (failed) (void)engine_.release();
    groups_.Release();
    zero::ReleaseIfFailed(comm_);
  }

  absl::StatusOr<TrainResult> Run(bool resume) {
    RETURN_IF_ERROR(Setup());
    TrainResult result;
    if (!stage_->trains()) {
      RETURN_IF_ERROR(stage_->Evaluate(*ctx_));
      return result;
    }
    if (resume) {
      std::vector<std::string> skipped;
      auto latest = FindLatestCheckpoint(spec_.output_dir(), &skipped);
      for (const std::string& why : skipped) ctx_->Warn("skipped checkpoint: " + why);
      RETURN_IF_ERROR(AgreeOnCheckpoint(latest));
      if (latest) {
        ASSIGN_OR_RETURN(state_, LoadCheckpoint(*latest, *engine_, groups_.mesh.data));
        RETURN_IF_ERROR(stage_->RestoreDataState(state_.loader, state_.global_step));
        result.resumed_from = state_.global_step;
        rewarm_from_ = state_.global_step;
        if (ctx_->lead()) {
          events_->Emit(
              "status",
              {{"state", "resumed"}, {"step", state_.global_step}, {"checkpoint", *latest}});
        }
      }
    }
    while (state_.global_step < total_steps_) {
      ASSIGN_OR_RETURN(result.last_loss, Step());
      if (ShouldSave()) {
        ASSIGN_OR_RETURN(result.last_checkpoint, Save());
      }
    }
    if (t_.save_strategy() != "no" && last_saved_step_ != state_.global_step) {
      ASSIGN_OR_RETURN(result.last_checkpoint, Save());
    }
    result.steps = state_.global_step;
    return result;
  }

 private:
  // Every rank must resume from the same step, or their shards would not belong together: a node
  // that sees another output_dir (no shared file system) or other files fails the job here, on
  // every rank, instead of training on inconsistent state.
  absl::Status AgreeOnCheckpoint(const std::optional<std::string>& latest) {
    if (comm_->world_size() == 1) return absl::OkStatus();
    double step = -1;
    if (latest) {
      const std::string name = fs::path(*latest).filename().string();
      step = std::atof(name.c_str() + std::string("checkpoint-").size());
    }
    torch::Tensor sums = torch::tensor({step, step * step}, torch::kFloat64);
    RETURN_IF_ERROR(comm_->AllReduceSum(sums, "checkpoint choice"));
    const double n = comm_->world_size();
    const double mean = sums[0].item<double>() / n;
    if (sums[1].item<double>() / n - mean * mean > 0.25) {
      return absl::FailedPreconditionError(
          absl::StrCat("the ranks found different newest checkpoints under ", spec_.output_dir(),
                       " (rank ", comm_->rank(), ": ", latest ? *latest : std::string("none"),
                       "); every rank must see the same output_dir"));
    }
    return absl::OkStatus();
  }

  absl::Status Setup() {
    ASSIGN_OR_RETURN(stage_, MakeStage(spec_));
    const torch::Device device = RankDevice(env_.local_rank);
    if (device.is_cuda() && t_.has_tf32() && t_.tf32()) {
      at::globalContext().setAllowTF32CuBLAS(true);
      at::globalContext().setAllowTF32CuDNN(true);
    }
    zero::CommOptions comm_options = zero::RankCommOptions(env_);
    comm_options.timeout = std::chrono::seconds(t_.ddp_timeout());
    comm_options.device = device;
    const std::string host = HostName();
    std::optional<NcclLogPlan> nccl_log;
    if (device.is_cuda() && NcclLogEnabled(spec_)) {
      ASSIGN_OR_RETURN(nccl_log, PrepareNcclLog(spec_, env_, host));
    }
    ASSIGN_OR_RETURN(comm_, zero::Comm::Create(comm_options));
    RETURN_IF_ERROR(RunDiagnostics(nccl_log, device, host));
    // The model a stage names (stages/loop.h Stage::EngineModel); none for a teacher endpoint.
    const std::string model_ref = stage_->EngineModel(spec_);
    model::AttentionImpl attention = model::AttentionImpl::kAuto;
    if (!model_ref.empty()) {
      ASSIGN_OR_RETURN(attention, BuildEngine(model_ref, device));
    } else if (stage_->trains()) {
      return absl::InternalError("a training stage named no model to build its engine from");
    }
    if (!engine_) groups_.mesh = MeshOf(spec_, comm_->world_size());
    // A model without tokenizer files (a registry config): the tokenizer the data was prepared
    // with, so that every checkpoint this job saves is a whole model (serve, eval, a next stage).
    if (tokenizer_dir_.empty()) tokenizer_dir_ = PreparedWithTokenizer(spec_.data_path());
    ctx_.emplace(StageContext{spec_, t_, device, *comm_, engine_.get(), options_, config_,
                              tokenizer_dir_, *events_, env_, groups_.mesh, groups_.sequence.get(),
                              groups_.sequence_parallel});
    for (const std::string& w : warnings_) ctx_->Warn(w);
    if (ctx_->lead()) {
      nlohmann::json setup = {
          {"device", device.str()},
          {"backend", comm_->backend()},
          {"kind", JobKindName(spec_.kind())},
          {"mesh",
           {{"data", groups_.mesh.data},
            {"sequence", groups_.mesh.sequence},
            {"tensor", groups_.mesh.tensor}}},
          {"attention",
           engine_ ? model::AttentionImplName(model::ResolveAttentionImpl(attention, device))
                   : "none"}};
      // What only the trainer could decide: the DeepSpeed sizes taken from the model.
      if (!deepspeed_filled_.empty()) {
        setup["hidden_size"] = config_.hidden_size;
        setup["deepspeed_filled"] = deepspeed_filled_;
      }
      events_->Emit("setup", std::move(setup));
    }

    ASSIGN_OR_RETURN(steps_per_epoch_, stage_->Setup(*ctx_));
    if (!stage_->trains()) return absl::OkStatus();
    steps_per_epoch_ = std::max<int64_t>(1, steps_per_epoch_);
    total_steps_ = t_.max_steps() > 0
                       ? t_.max_steps()
                       : static_cast<int64_t>(std::ceil(t_.num_train_epochs() * steps_per_epoch_));
    ASSIGN_OR_RETURN(schedule_, LrSchedule::Create(
                                    t_.lr_scheduler_type(),
                                    WarmupSteps(t_.warmup_steps(), t_.warmup_ratio(), total_steps_),
                                    total_steps_));
    base_lr_ = options_.lr;
    if (spec_.has_remedies() && spec_.remedies().has_loss_spike()) {
      const trainctl::v1::LossSpikeRemedy& remedy = spec_.remedies().loss_spike();
      spike_.emplace(remedy.spike_factor(), remedy.window());
      rewarm_steps_ = WarmupSteps(t_.warmup_steps(), t_.warmup_ratio(), total_steps_);
    }
    logging_every_ = Interval(t_.logging_steps(), total_steps_);
    save_every_ = Interval(t_.save_steps(), total_steps_);
    shape_ = ModelShape{engine_->Memory().parameters, config_.vocab_size, config_.hidden_size,
                        config_.num_hidden_layers};
    const ComputePrecision precision = options_.compute_dtype != torch::kFloat32
                                           ? ComputePrecision::kHalf
                                       : (device.is_cuda() && t_.tf32()) ? ComputePrecision::kTf32
                                                                         : ComputePrecision::kFp32;
    std::string peak_error;
    peak_flops_ = PeakFlops(env_.peak_flops.empty() ? nullptr : env_.peak_flops.c_str(),
                            DeviceName(device), precision, &peak_error);
    if (!peak_error.empty()) ctx_->Warn(peak_error);
    return absl::OkStatus();
  }

  // What NCCL did (each rank's `topology` event) and, when the job asks, the bandwidth probe
  // (rank 0's `bandwidth` event), before any model exists.
  absl::Status RunDiagnostics(const std::optional<NcclLogPlan>& nccl_log,
                              const torch::Device& device, const std::string& host) {
    if (nccl_log && comm_->backend() == "nccl") {
      // NCCL creates its communicator at the first collective, and logs it then.
      RETURN_IF_ERROR(comm_->AllReduceSum(torch::ones({1}), "nccl init"));
      ReportNcclTopology(*nccl_log, comm_->rank(), host, events_);
    }
    if (!RunsBandwidthProbe(spec_)) return absl::OkStatus();
    ASSIGN_OR_RETURN(
        const trainctl::v1::BandwidthReport report,
        RunBandwidthProbe(*comm_, device,
                          BandwidthProbeOptionsFor(spec_.diagnostics(), comm_->backend(), host)));
    if (comm_->rank() == 0) EmitBandwidthReport(report, events_);
    return absl::OkStatus();
  }

  // The model `model_ref`, its DeepSpeed-resolved options and its engine (frozen when the stage
  // does not train). Returns the attention implementation asked for.
  absl::StatusOr<model::AttentionImpl> BuildEngine(const std::string& model_ref,
                                                   const torch::Device& device) {
    ASSIGN_OR_RETURN(auto resolved_model, ResolveModel(model_ref, env_.model_registry));
    config_ = std::move(resolved_model.first);
    if (!resolved_model.second.empty()) {
      tokenizer_dir_ = resolved_model.second;
    } else if (fs::is_directory(model_ref)) {
      tokenizer_dir_ = model_ref;
    }

    // The coordinator's resolved DeepSpeed config; only the values that need the model are
    // filled here, and reported in the `setup` event.
    std::optional<DeepSpeedConfig> ds;
    if (!deepspeed_config_.empty()) {
      ASSIGN_OR_RETURN(
          nlohmann::json doc,
          ParseDeepSpeedJson(deepspeed_config_, "the launch's resolved DeepSpeed config"));
      deepspeed_filled_ = FillModelAutos(config_.hidden_size, &doc);
      ASSIGN_OR_RETURN(ds, ReadResolvedDeepSpeedConfig(doc, DeepSpeedInputsFor(spec_, t_)));
    }
    options_ = zero::EngineOptionsFrom(ds, t_, &warnings_);
    options_.device = device;
    // The mesh's groups (stages/internal/mesh_groups.h): ZeRO shards over the ranks holding the
    // same weights, the model exchanges over its sequence- and tensor-parallel groups.
    ASSIGN_OR_RETURN(groups_, internal::OpenMeshGroups(spec_, *comm_, config_));
    groups_.ApplyTo(&options_);
    gather_on_save_ = options_.stage < 3 || (ds && ds->stage3_gather_16bit_weights_on_model_save);
    baseline_rss_ = CurrentRssBytes();  // before any model or training state exists
    if (stage_->trains()) {
      ASSIGN_OR_RETURN(engine_, zero::Engine::Create(config_, options_, comm_.get(), t_.seed(),
                                                     resolved_model.second));
      groups_.ApplyTo(&engine_->model());
      model::GradientCheckpointing checkpointing;
      checkpointing.decoder_layers = checkpointing.vision_blocks = t_.gradient_checkpointing();
      engine_->model().SetGradientCheckpointing(checkpointing);
    } else {
      ASSIGN_OR_RETURN(engine_, zero::Engine::CreateFrozen(config_, options_, comm_.get(),
                                                           t_.seed(), resolved_model.second));
    }
    // TRAINCTL_ATTENTION=eager|sdpa overrides the default (fused on CUDA in LibTorch 2.x builds).
    model::AttentionImpl attention = model::AttentionImpl::kAuto;
    if (!env_.attention.empty()) {
      auto parsed = model::ParseAttentionImpl(env_.attention);
      if (!parsed.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("TRAINCTL_ATTENTION: ", parsed.status().message()));
      }
      attention = *parsed;
    }
    engine_->model().SetAttentionImpl(attention);
    return attention;
  }

  // One optimizer step: the stage's micro-batches, then the update. Returns the step's loss.
  absl::StatusOr<double> Step() {
    const absl::Time start = absl::Now();
    const int64_t step = state_.global_step + 1;
    auto out = stage_->Step(*ctx_, step);
    if (!out.ok()) {
      return absl::Status(out.status().code(),
                          absl::StrCat("step ", step, ": ", out.status().message()));
    }
    // A spike stops the run before its update and before any save (spec.remedies.loss_spike): the
    // coordinator rolls back to the newest checkpoint (common/trainer_exit_codes.h).
    if (spike_) {
      if (std::optional<std::string> evidence = spike_->Observe(step, out->loss)) {
        events_->Emit("warning", {{"kind", "loss_spike"},
                                  {"rank", comm_->rank()},
                                  {"step", step},
                                  {"loss", out->loss},
                                  {"median", spike_->Median()},
                                  {"message", *evidence}});
        return LossSpikeError(*evidence);
      }
    }
    auto result = engine_->Step(LearningRate(state_.global_step));
    if (!result.ok()) {
      return absl::Status(result.status().code(),
                          absl::StrCat("step ", step, ": ", result.status().message()));
    }
    if (result->skipped) {
      ctx_->Warn(absl::StrCat("step ", step, ": gradient overflow, update skipped; loss scale now ",
                              engine_->loss_scale()));
    }
    ++state_.global_step;
    if (state_.global_step == 1 || state_.global_step == total_steps_) EmitMemory();
    state_.loader = stage_->DataState();
    state_.epoch = static_cast<double>(state_.global_step) / steps_per_epoch_;
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    Log(*out, result->grad_norm, seconds);
    return out->loss;
  }

  // Every rank's training-state bytes (the ZeRO accounting) and its measured peak, after the
  // first step (when every buffer exists) and the last: the CUDA allocator's peak on a GPU, else
  // the peak resident set above the one before the model was built (what the memory plan counts,
  // common/memory_plan.h).
  void EmitMemory() {
    const zero::MemoryStats m = engine_->Memory();
    const int64_t peak_rss = PeakRssBytes();
    int64_t peak = std::max<int64_t>(0, peak_rss - baseline_rss_);
    std::string source = "rss_above_baseline";
#ifdef TRAINCTL_CUDA_BUILD
    if (options_.device.is_cuda()) {
      peak = c10::cuda::CUDACachingAllocator::getDeviceStats(options_.device.index())
                 .allocated_bytes[0]  // StatType::AGGREGATE
                 .peak;
      source = "cuda_allocator";
    }
#endif
    events_->Emit("memory", {{"step", state_.global_step},
                             {"rank", comm_->rank()},
                             {"world_size", comm_->world_size()},
                             {"zero_stage", engine_->options().stage},
                             {"parameters", m.parameters},
                             {"master_bytes", m.master_bytes},
                             {"optimizer_bytes", m.optimizer_bytes},
                             {"gradient_bytes", m.gradient_bytes},
                             {"working_bytes", m.working_bytes},
                             {"peak_working_bytes", m.peak_working_bytes},
                             {"peak_rss_bytes", peak_rss},
                             {"baseline_rss_bytes", baseline_rss_},
                             {"peak_bytes", peak},
                             {"peak_source", source},
                             {"comm_bytes_sent", comm_->bytes_sent()},
                             {"sequence_comm_bytes_sent",
                              groups_.sequence ? groups_.sequence->bytes_sent() : uint64_t{0}},
                             {"tensor_comm_bytes_sent",
                              groups_.tensor ? groups_.tensor->bytes_sent() : uint64_t{0}}});
  }

  // Accumulates the window and emits its means every logging_steps and at the last step.
  void Log(const StageStep& out, double grad_norm, double seconds) {
    window_loss_ += out.loss;
    ++window_steps_;
    window_tokens_ += out.tokens;
    window_samples_ += out.samples;
    window_seconds_ += seconds;
    for (const auto& [name, value] : out.metrics.items()) {
      if (value.is_number()) window_metrics_[name] += value.get<double>();
    }
    if (state_.global_step % logging_every_ != 0 && state_.global_step != total_steps_) return;
    nlohmann::json values = {
        {"loss", window_loss_ / window_steps_},
        {"learning_rate", LearningRate(state_.global_step - 1)},
        {"grad_norm", grad_norm},
        {"epoch", state_.epoch},
        {"total_steps", total_steps_},
        {"step_time", seconds},
        {"tokens_per_second", window_tokens_ / std::max(1e-9, window_seconds_)},
        {"samples_per_second", window_samples_ / std::max(1e-9, window_seconds_)}};
    // Model FLOPs per device (this rank's tokens), and MFU where the device's peak is known.
    if (window_samples_ > 0) {
      const double seq_len = static_cast<double>(window_tokens_) / window_samples_;
      const double flops =
          values["tokens_per_second"].get<double>() * TrainingFlopsPerToken(shape_, seq_len);
      values["flops_per_second"] = flops;
      if (peak_flops_) values["mfu"] = flops / *peak_flops_;
    }
    for (const auto& [name, sum] : window_metrics_) values[name] = sum / window_steps_;
    if (ctx_->lead()) events_->Emit("metric", {{"step", state_.global_step}, {"values", values}});
    window_loss_ = window_seconds_ = 0;
    window_steps_ = window_tokens_ = window_samples_ = 0;
    window_metrics_.clear();
  }

  // The learning rate of the step after `done` steps. With the loss-spike remedy on, a resumed run
  // (a rollback) warms up again from where it resumed over the warm-up steps, linearly.
  double LearningRate(int64_t done) const {
    double factor = schedule_->Factor(done);
    if (spike_ && rewarm_from_ > 0 && rewarm_steps_ > 0) {
      factor *= std::min(1.0, static_cast<double>(done - rewarm_from_ + 1) / rewarm_steps_);
    }
    return base_lr_ * factor;
  }

  bool ShouldSave() const {
    if (t_.save_strategy() == "steps") return state_.global_step % save_every_ == 0;
    if (t_.save_strategy() == "epoch") return state_.global_step % steps_per_epoch_ == 0;
    return false;
  }

  absl::StatusOr<std::string> Save() {
    SaveOptions options;
    options.write_hf_weights = gather_on_save_;
    options.tokenizer_dir = tokenizer_dir_;
    options.data_ranks = groups_.mesh.data;
    ASSIGN_OR_RETURN(const std::string dir,
                     model::Guarded(absl::StrCat("saving checkpoint ", state_.global_step), [&] {
                       return SaveCheckpoint(spec_.output_dir(), state_, *engine_, options);
                     }));
    last_saved_step_ = state_.global_step;
    if (ctx_->lead()) {
      events_->Emit("checkpoint",
                    {{"step", state_.global_step}, {"path", fs::absolute(dir).string()}});
    }
    return dir;
  }

  const trainctl::v1::JobSpec& spec_;
  const trainctl::v1::TrainingArguments& t_;
  const std::string& deepspeed_config_;  // the coordinator's resolved config (TrainRun)
  const RankEnv& env_;
  EventSink* events_;
  std::unique_ptr<zero::Comm> comm_;
  internal::MeshGroups groups_;  // the mesh's sub-groups of comm_ (one-rank mesh: none)
  model::Qwen2VLConfig config_;
  zero::EngineOptions options_;
  std::unique_ptr<zero::Engine> engine_;
  std::optional<StageContext> ctx_;
  std::unique_ptr<Stage> stage_;
  std::optional<LrSchedule> schedule_;
  TrainerState state_;
  std::string tokenizer_dir_;
  std::vector<std::string> warnings_;                // of the engine's options
  std::map<std::string, int64_t> deepspeed_filled_;  // hidden-size "auto"s filled on this rank
  bool gather_on_save_ = true;
  double base_lr_ = 0;
  int64_t total_steps_ = 0, steps_per_epoch_ = 1, logging_every_ = 1, save_every_ = 1;
  int64_t last_saved_step_ = -1;
  double window_loss_ = 0, window_seconds_ = 0;
  int64_t window_steps_ = 0, window_tokens_ = 0, window_samples_ = 0;
  int64_t baseline_rss_ = 0;  // resident bytes before the model was built
  std::map<std::string, double> window_metrics_;
  ModelShape shape_;
  std::optional<double> peak_flops_;        // per device, FLOP/s
  std::optional<LossSpikeDetector> spike_;  // spec.remedies.loss_spike set
  int64_t rewarm_from_ = 0;                 // the step resumed from
  int64_t rewarm_steps_ = 0;
};

}  // namespace

absl::Status StageContext::SumOverRanks(torch::Tensor& t, const std::string& what) const {
  RETURN_IF_ERROR(comm.AllReduceSum(t, what));
  if (mesh.tensor > 1) t.div_(mesh.tensor);
  return absl::OkStatus();
}

absl::Status StageContext::SplitSequences(zero::Engine& frozen, const std::string& what) const {
  if (sequence_parallel == nullptr) return absl::OkStatus();
  const bool split = options.tensor_parallel != nullptr && options.tensor_parallel->attention;
  RETURN_IF_ERROR(internal::CheckSequenceSplitsHeads(frozen.model().config(), mesh, split, what));
  frozen.model().SetSequenceParallel(sequence_parallel);
  return absl::OkStatus();
}

void StageContext::Warn(const std::string& message) const {
  if (lead()) events.Emit("warning", {{"message", message}});
}

torch::Device RankDevice(int local_rank) {
  if (!torch::cuda::is_available()) return torch::Device(torch::kCPU);
  // The worker makes one GPU visible to each rank (CUDA_VISIBLE_DEVICES): it is device 0 whatever
  // the local rank. Ranks started by hand on a node that shows them all pick theirs by local rank.
  const int64_t visible = static_cast<int64_t>(torch::cuda::device_count());
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(visible == 1 ? 0 : local_rank));
}

absl::StatusOr<std::pair<model::Qwen2VLConfig, std::string>> ResolveModel(
    const std::string& ref, const std::string& registry) {
  // A training job's output directory (what a pipeline stage hands the next one): its newest
  // complete checkpoint, which holds HF weights unless ZeRO-3 saved them sharded only.
  if (fs::is_directory(ref) && !HasWeights(ref) && !fs::exists(fs::path(ref) / "config.json")) {
    std::vector<std::string> skipped;
    if (std::optional<std::string> latest = FindLatestCheckpoint(ref, &skipped)) {
      if (!HasWeights(*latest)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "model '", ref, "': its newest checkpoint ", *latest,
            " has no model.safetensors (ZeRO-3 without stage3_gather_16bit_weights_on_model_save);"
            " write one with `trainctl-trainer export`"));
      }
      return ResolveModel(*latest, registry);
    }
  }
  if (fs::is_directory(ref) && HasWeights(ref)) {
    ASSIGN_OR_RETURN(model::Qwen2VLConfig config, model::LoadQwen2VLConfig(ref));
    return std::make_pair(std::move(config), ref);
  }
  ASSIGN_OR_RETURN(const std::string config_path, model::FindModelConfig(ref, registry));
  ASSIGN_OR_RETURN(model::Qwen2VLConfig config, model::LoadQwen2VLConfig(config_path));
  return std::make_pair(std::move(config), std::string());
}

absl::StatusOr<TrainResult> RunTraining(const TrainRun& run, EventSink* events) {
  Loop loop(run, events);
  return loop.Run(run.resume);
}

}  // namespace trainctl::trainer
