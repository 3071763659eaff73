#include "worker/trainer/stages/sft.h"

#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/job_spec.h"
#include "common/process_stats.h"
#include "common/status_macros.h"
#include "worker/trainer/checkpoint/trainer_checkpoint.h"
#include "worker/trainer/data/loader.h"
#include "worker/trainer/data/shard_reader.h"
#include "worker/trainer/model/qwen2vl.h"
#include "worker/trainer/model/state_dict_adapter.h"
#include "worker/trainer/stages/batch_inputs.h"
#include "worker/trainer/stages/internal/autocast.h"
#include "worker/trainer/stages/lr_schedule.h"
#include "worker/trainer/zero/comm.h"
#include "worker/trainer/zero/engine.h"

namespace trainctl::trainer {
namespace {

namespace fs = std::filesystem;
using trainctl::v1::TrainingArguments;

bool HasWeights(const fs::path& dir) {
  return fs::exists(dir / "model.safetensors") || fs::exists(dir / "model.safetensors.index.json");
}

// The model's config and, when `ref` is a directory with weights, that directory to load them
// from; otherwise a registry name or config path and "" (initialise from the seed).
absl::StatusOr<std::pair<model::Qwen2VLConfig, std::string>> ResolveModel(const std::string& ref) {
  if (fs::is_directory(ref) && HasWeights(ref)) {
    ASSIGN_OR_RETURN(model::Qwen2VLConfig config, model::LoadQwen2VLConfig(ref));
    return std::make_pair(std::move(config), ref);
  }
  ASSIGN_OR_RETURN(const std::string config_path, model::FindModelConfig(ref));
  ASSIGN_OR_RETURN(model::Qwen2VLConfig config, model::LoadQwen2VLConfig(config_path));
  return std::make_pair(std::move(config), std::string());
}

// Optimizer steps between events/saves: HF's `*_steps` may be a ratio of the total when < 1.
int64_t Interval(double steps, int64_t total) {
  if (steps < 1) return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(steps * total)));
  return static_cast<int64_t>(steps);
}

class SftLoop {
 public:
  SftLoop(const SftRun& run, EventSink* events)
      : spec_(run.spec), t_(run.spec.training()), events_(events) {}
  ~SftLoop() {
    if (comm_failed_) {
      // A failed collective can leave the process group's threads waiting on a dead peer, and
      // its destructor would wait for them: the process is about to exit, so leave it.
      (void)engine_.release();
      (void)comm_.release();
    }
  }

  absl::StatusOr<SftResult> Run(bool resume) {
    RETURN_IF_ERROR(Setup());
    SftResult result;
    if (resume) {
      std::vector<std::string> skipped;
      auto latest = FindLatestCheckpoint(spec_.output_dir(), &skipped);
      for (const std::string& why : skipped) Warn("skipped checkpoint: " + why);
      RETURN_IF_ERROR(AgreeOnCheckpoint(latest));
      if (latest) {
        ASSIGN_OR_RETURN(state_, LoadCheckpoint(*latest, *engine_));
        RETURN_IF_ERROR(loader_->SetState(state_.loader));
        result.resumed_from = state_.global_step;
        if (lead()) {
          events_->Emit(
              "status",
              {{"state", "resumed"}, {"step", state_.global_step}, {"checkpoint", *latest}});
        }
      }
    }
    while (state_.global_step < total_steps_) {
      ASSIGN_OR_RETURN(result.last_loss, Step());
      MaybeLog(result.last_loss);
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
    try {
      torch::Tensor sums = torch::tensor({step, step * step}, torch::kFloat64);
      comm_->AllReduce(sums, "checkpoint choice").Wait();
      const double n = comm_->world_size();
      const double mean = sums[0].item<double>() / n;
      if (sums[1].item<double>() / n - mean * mean > 0.25) {
        return absl::FailedPreconditionError(
            absl::StrCat("the ranks found different newest checkpoints under ", spec_.output_dir(),
                         " (rank ", comm_->rank(), ": ", latest ? *latest : std::string("none"),
                         "); every rank must see the same output_dir"));
      }
    } catch (const zero::CollectiveError& e) {
      comm_failed_ = true;
      return absl::UnavailableError(e.what());
    }
    return absl::OkStatus();
  }

  // Rank 0 speaks for the job: metrics, checkpoints and warnings come once, not once per rank.
  bool lead() const { return comm_->rank() == 0; }

  void Warn(const std::string& message) {
    if (lead()) events_->Emit("warning", {{"message", message}});
  }

  absl::Status Setup() {
    torch::Device device(torch::kCPU);
    if (torch::cuda::is_available()) {
      const char* local_rank = std::getenv("LOCAL_RANK");
      device = torch::Device(torch::kCUDA, local_rank ? std::atoi(local_rank) : 0);
      if (t_.has_tf32() && t_.tf32()) {
        at::globalContext().setAllowTF32CuBLAS(true);
        at::globalContext().setAllowTF32CuDNN(true);
      }
    }
    ASSIGN_OR_RETURN(zero::CommOptions comm_options, zero::CommOptionsFromEnv());
    comm_options.timeout = std::chrono::seconds(t_.ddp_timeout());
    comm_options.device = device;
    ASSIGN_OR_RETURN(comm_, zero::Comm::Create(comm_options));

    ASSIGN_OR_RETURN(auto resolved_model, ResolveModel(spec_.model_name_or_path()));
    const model::Qwen2VLConfig& config = resolved_model.first;
    if (fs::is_directory(spec_.model_name_or_path())) tokenizer_dir_ = spec_.model_name_or_path();

    // The DeepSpeed config, resolved again here against what the control plane could not know:
    // the launched world size and the model's hidden size.
    std::optional<DeepSpeedConfig> ds;
    if (!spec_.deepspeed_config_json().empty()) {
      ASSIGN_OR_RETURN(
          nlohmann::json doc,
          ParseDeepSpeedJson(spec_.deepspeed_config_json(),
                             spec_.deepspeed().empty() ? "deepspeed config" : spec_.deepspeed()));
      DeepSpeedInputs in = DeepSpeedInputsFor(spec_, t_);
      in.world_size = comm_->world_size();
      in.hidden_size = config.hidden_size;
      auto resolved = ResolveDeepSpeedConfig(doc, in);
      if (!resolved.ok()) return resolved.status();
      ds = resolved->config;
    }
    std::vector<std::string> warnings;
    zero::EngineOptions options = zero::EngineOptionsFrom(ds, t_, config.hidden_size, &warnings);
    options.device = device;
    for (const std::string& w : warnings) Warn(w);
    gather_on_save_ = options.stage < 3 || (ds && ds->stage3_gather_16bit_weights_on_model_save);
    ASSIGN_OR_RETURN(engine_, zero::Engine::Create(config, options, comm_.get(), t_.seed(),
                                                   resolved_model.second));
    model::GradientCheckpointing checkpointing;
    checkpointing.decoder_layers = checkpointing.vision_blocks = t_.gradient_checkpointing();
    engine_->model().SetGradientCheckpointing(checkpointing);
    // TRAINCTL_ATTENTION=eager|sdpa overrides the default (fused on CUDA in LibTorch 2.x builds).
    model::AttentionImpl attention = model::AttentionImpl::kAuto;
    if (const char* name = std::getenv("TRAINCTL_ATTENTION"); name != nullptr && *name) {
      auto parsed = model::ParseAttentionImpl(name);
      if (!parsed.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("TRAINCTL_ATTENTION: ", parsed.status().message()));
      }
      attention = *parsed;
    }
    engine_->model().SetAttentionImpl(attention);
    if (lead()) {
      events_->Emit("setup", {{"device", device.str()},
                              {"backend", comm_->backend()},
                              {"attention", model::AttentionImplName(
                                                model::ResolveAttentionImpl(attention, device))}});
    }
    device_ = device;

    ASSIGN_OR_RETURN(std::shared_ptr<const data::ShardReader> reader,
                     data::ShardReader::Open(spec_.data_path()));
    data::LoaderOptions loader_options;
    loader_options.batch_size = t_.per_device_train_batch_size();
    loader_options.seed = static_cast<uint64_t>(t_.seed());
    loader_options.rank = comm_->rank();
    loader_options.world_size = comm_->world_size();
    ASSIGN_OR_RETURN(loader_, data::Loader::Create(reader, loader_options));

    const int64_t per_epoch =
        std::max<int64_t>(1, loader_->BatchesInEpoch(0) / t_.gradient_accumulation_steps());
    steps_per_epoch_ = per_epoch;
    total_steps_ = t_.max_steps() > 0
                       ? t_.max_steps()
                       : static_cast<int64_t>(std::ceil(t_.num_train_epochs() * per_epoch));
    ASSIGN_OR_RETURN(schedule_, LrSchedule::Create(
                                    t_.lr_scheduler_type(),
                                    WarmupSteps(t_.warmup_steps(), t_.warmup_ratio(), total_steps_),
                                    total_steps_));
    base_lr_ = options.lr;
    logging_every_ = Interval(t_.logging_steps(), total_steps_);
    save_every_ = Interval(t_.save_steps(), total_steps_);
    return absl::OkStatus();
  }

  // One optimizer step over gradient_accumulation_steps micro-batches on every rank. Returns the
  // loss of the whole global batch: summed over every rank's trained tokens, divided by their
  // global count, so N ranks compute what one rank would on the same samples.
  absl::StatusOr<double> Step() {
    const absl::Time start = absl::Now();
    std::vector<data::Batch> micro;
    int64_t label_tokens = 0, tokens = 0, samples = 0;
    for (int i = 0; i < t_.gradient_accumulation_steps(); ++i) {
      ASSIGN_OR_RETURN(data::Batch batch, loader_->Next());
      label_tokens += ShiftedLabels(batch, torch::kCPU).ne(-100).sum().item<int64_t>();
      for (int32_t m : batch.attention_mask) tokens += m;
      samples += batch.batch_size;
      micro.push_back(std::move(batch));
    }
    double loss_value = 0;
    zero::StepResult step;
    try {
      torch::Tensor counts =
          torch::tensor({static_cast<double>(label_tokens), static_cast<double>(tokens),
                         static_cast<double>(samples)},
                        torch::kFloat64);
      comm_->AllReduce(counts, "token counts").Wait();
      const double denominator = std::max(1.0, counts[0].item<double>());
      tokens = static_cast<int64_t>(counts[1].item<double>());
      samples = static_cast<int64_t>(counts[2].item<double>());
      for (const data::Batch& batch : micro) {
        auto loss = MicroBatchLossSum(batch) / denominator;
        engine_->Backward(loss);
        loss_value += loss.item<double>();
      }
      step = engine_->Step(base_lr_ * schedule_->Factor(state_.global_step));
      torch::Tensor total = torch::tensor({loss_value}, torch::kFloat64);
      comm_->AllReduce(total, "loss").Wait();
      loss_value = total.item<double>();
    } catch (const c10::Error& e) {
      return absl::InternalError(
          absl::StrCat("step ", state_.global_step + 1, ": ", e.what_without_backtrace()));
    } catch (const zero::CollectiveError& e) {
      comm_failed_ = true;
      return absl::UnavailableError(absl::StrCat("step ", state_.global_step + 1, ": ", e.what()));
    }
    grad_norm_ = step.grad_norm;
    if (step.skipped) {
      Warn(absl::StrCat("step ", state_.global_step + 1,
                        ": gradient overflow, update skipped; loss scale now ",
                        engine_->loss_scale()));
    }
    ++state_.global_step;
    if (state_.global_step == 1 || state_.global_step == total_steps_) EmitMemory();
    state_.loader = loader_->state();
    state_.epoch = static_cast<double>(state_.global_step) / steps_per_epoch_;
    step_seconds_ = absl::ToDoubleSeconds(absl::Now() - start);
    window_tokens_ += tokens;
    window_samples_ += samples;
    window_seconds_ += step_seconds_;
    return loss_value;
  }

  // Every rank's training-state bytes (the ZeRO accounting) and its peak resident set, after the
  // first step (when every buffer exists) and the last.
  void EmitMemory() {
    const zero::MemoryStats m = engine_->Memory();
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
                             {"peak_rss_bytes", PeakRssBytes()},
                             {"comm_bytes_sent", comm_->bytes_sent()}});
  }

  // Summed cross-entropy of one micro-batch over its trained (shifted) label positions. Only
  // those positions go through the vocabulary-wide head: with assistant-only labels that is a
  // small part of the sequence, and the [tokens, vocab] logits dominate time and memory.
  torch::Tensor MicroBatchLossSum(const data::Batch& batch) {
    model::Qwen2VLForConditionalGeneration& net = engine_->model();
    const bool bf16 = engine_->options().compute_dtype == torch::kBFloat16;
    torch::Tensor hidden;
    {
      internal::AutocastGuard autocast(bf16, device_.type(), torch::kBFloat16);
      hidden = net.ForwardHidden(ToModelInputs(batch, device_));
    }
    const int64_t width = hidden.size(-1);
    auto labels = ShiftedLabels(batch, device_).reshape({-1});
    auto positions = labels.ne(-100).nonzero().squeeze(1);
    auto trained =
        hidden.slice(1, 0, batch.seq_len - 1).reshape({-1, width}).index_select(0, positions);
    torch::Tensor logits;
    {
      internal::AutocastGuard autocast(bf16, device_.type(), torch::kBFloat16);
      logits = net.Head(trained);
    }
    return torch::nn::functional::cross_entropy(
        logits.to(torch::kFloat32), labels.index_select(0, positions),
        torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  }

  void MaybeLog(double loss) {
    window_loss_ += loss;
    ++window_steps_;
    if (state_.global_step % logging_every_ != 0 && state_.global_step != total_steps_) return;
    nlohmann::json values = {
        {"loss", window_loss_ / window_steps_},
        {"learning_rate", base_lr_ * schedule_->Factor(state_.global_step - 1)},
        {"grad_norm", grad_norm_},
        {"epoch", state_.epoch},
        {"total_steps", total_steps_},
        {"step_time", step_seconds_},
        {"tokens_per_second", window_tokens_ / std::max(1e-9, window_seconds_)},
        {"samples_per_second", window_samples_ / std::max(1e-9, window_seconds_)}};
    if (lead()) events_->Emit("metric", {{"step", state_.global_step}, {"values", values}});
    window_loss_ = window_seconds_ = 0;
    window_steps_ = window_tokens_ = window_samples_ = 0;
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
    std::string dir;
    try {
      ASSIGN_OR_RETURN(dir, SaveCheckpoint(spec_.output_dir(), state_, *engine_, options));
    } catch (const zero::CollectiveError& e) {
      comm_failed_ = true;
      return absl::UnavailableError(
          absl::StrCat("saving checkpoint ", state_.global_step, ": ", e.what()));
    }
    last_saved_step_ = state_.global_step;
    if (lead()) {
      events_->Emit("checkpoint",
                    {{"step", state_.global_step}, {"path", fs::absolute(dir).string()}});
    }
    return dir;
  }

  const trainctl::v1::JobSpec& spec_;
  const TrainingArguments& t_;
  EventSink* events_;
  torch::Device device_{torch::kCPU};
  std::unique_ptr<zero::Comm> comm_;
  std::unique_ptr<zero::Engine> engine_;
  std::unique_ptr<data::Loader> loader_;
  std::optional<LrSchedule> schedule_;
  TrainerState state_;
  std::string tokenizer_dir_;
  bool gather_on_save_ = true;
  bool comm_failed_ = false;
  double base_lr_ = 0;
  int64_t total_steps_ = 0, steps_per_epoch_ = 1, logging_every_ = 1, save_every_ = 1;
  int64_t last_saved_step_ = -1;
  double grad_norm_ = 0, step_seconds_ = 0;
  double window_loss_ = 0, window_seconds_ = 0;
  int64_t window_steps_ = 0, window_tokens_ = 0, window_samples_ = 0;
};

}  // namespace

absl::StatusOr<SftResult> RunSft(const SftRun& run, EventSink* events) {
  SftLoop loop(run, events);
  return loop.Run(run.resume);
}

}  // namespace trainctl::trainer
