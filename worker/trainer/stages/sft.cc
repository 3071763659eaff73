#include "worker/trainer/stages/sft.h"

#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "worker/trainer/checkpoint/trainer_checkpoint.h"
#include "worker/trainer/data/loader.h"
#include "worker/trainer/data/shard_reader.h"
#include "worker/trainer/model/qwen2vl.h"
#include "worker/trainer/model/state_dict_adapter.h"
#include "worker/trainer/stages/batch_inputs.h"
#include "worker/trainer/stages/internal/autocast.h"
#include "worker/trainer/stages/lr_schedule.h"

namespace trainctl::trainer {
namespace {

namespace fs = std::filesystem;
using model::Qwen2VLForConditionalGeneration;
using trainctl::v1::TrainingArguments;

bool HasWeights(const fs::path& dir) {
  return fs::exists(dir / "model.safetensors") || fs::exists(dir / "model.safetensors.index.json");
}

absl::StatusOr<std::shared_ptr<Qwen2VLForConditionalGeneration>> BuildModel(const std::string& ref,
                                                                            int64_t seed) {
  if (fs::is_directory(ref) && HasWeights(ref)) return model::LoadHfModel(ref);
  ASSIGN_OR_RETURN(const std::string config_path, model::FindModelConfig(ref));
  ASSIGN_OR_RETURN(model::Qwen2VLConfig config, model::LoadQwen2VLConfig(config_path));
  torch::manual_seed(seed);
  return std::make_shared<Qwen2VLForConditionalGeneration>(config);
}

// HF's default split: no weight decay for biases and normalisation weights.
std::vector<torch::optim::OptimizerParamGroup> ParamGroups(Qwen2VLForConditionalGeneration& model,
                                                           const TrainingArguments& t) {
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& item : model.named_parameters()) {
    const std::string& name = item.key();
    const bool exempt = absl::EndsWith(name, ".bias") || absl::StrContains(name, "norm") ||
                        absl::StrContains(name, "ln_q");
    (exempt ? no_decay : decay).push_back(item.value());
  }
  auto options = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(t.learning_rate())
            .betas({t.adam_beta1(), t.adam_beta2()})
            .eps(t.adam_epsilon())
            .weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, options(t.weight_decay()));
  groups.emplace_back(no_decay, options(0.0));
  return groups;
}

void SetLearningRate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
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

  absl::StatusOr<SftResult> Run(bool resume) {
    RETURN_IF_ERROR(Setup());
    SftResult result;
    if (resume) {
      std::vector<std::string> skipped;
      auto latest = FindLatestCheckpoint(spec_.output_dir(), &skipped);
      for (const std::string& why : skipped)
        events_->Emit("warning", {{"message", "skipped checkpoint: " + why}});
      if (latest) {
        ASSIGN_OR_RETURN(state_, LoadCheckpoint(*latest, *model_, *optimizer_));
        RETURN_IF_ERROR(loader_->SetState(state_.loader));
        result.resumed_from = state_.global_step;
        events_->Emit(
            "status",
            {{"state", "resumed"}, {"step", state_.global_step}, {"checkpoint", *latest}});
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
  absl::Status Setup() {
    if (torch::cuda::is_available()) {
      const char* local_rank = std::getenv("LOCAL_RANK");
      device_ = torch::Device(torch::kCUDA, local_rank ? std::atoi(local_rank) : 0);
      if (t_.has_tf32() && t_.tf32()) {
        at::globalContext().setAllowTF32CuBLAS(true);
        at::globalContext().setAllowTF32CuDNN(true);
      }
    }
    ASSIGN_OR_RETURN(model_, BuildModel(spec_.model_name_or_path(), t_.seed()));
    model_->to(device_);
    model_->train();
    model::GradientCheckpointing checkpointing;
    checkpointing.decoder_layers = checkpointing.vision_blocks = t_.gradient_checkpointing();
    model_->SetGradientCheckpointing(checkpointing);

    ASSIGN_OR_RETURN(std::shared_ptr<const data::ShardReader> reader,
                     data::ShardReader::Open(spec_.data_path()));
    data::LoaderOptions options;
    options.batch_size = t_.per_device_train_batch_size();
    options.seed = static_cast<uint64_t>(t_.seed());
    ASSIGN_OR_RETURN(loader_, data::Loader::Create(reader, options));

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
    optimizer_ = std::make_unique<torch::optim::AdamW>(
        ParamGroups(*model_, t_), torch::optim::AdamWOptions(t_.learning_rate()));
    logging_every_ = Interval(t_.logging_steps(), total_steps_);
    save_every_ = Interval(t_.save_steps(), total_steps_);
    return absl::OkStatus();
  }

  // One optimizer step over gradient_accumulation_steps micro-batches. Returns its loss.
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
    const double denominator = static_cast<double>(std::max<int64_t>(1, label_tokens));
    SetLearningRate(*optimizer_, t_.learning_rate() * schedule_->Factor(state_.global_step));
    optimizer_->zero_grad();
    double loss_value = 0;
    try {
      for (const data::Batch& batch : micro) {
        auto loss = MicroBatchLossSum(batch) / denominator;
        loss.backward();
        loss_value += loss.item<double>();
      }
      grad_norm_ = ClipGradients();
      optimizer_->step();
    } catch (const c10::Error& e) {
      return absl::InternalError(
          absl::StrCat("step ", state_.global_step + 1, ": ", e.what_without_backtrace()));
    }
    ++state_.global_step;
    state_.loader = loader_->state();
    state_.epoch = static_cast<double>(state_.global_step) / steps_per_epoch_;
    step_seconds_ = absl::ToDoubleSeconds(absl::Now() - start);
    window_tokens_ += tokens;
    window_samples_ += samples;
    window_seconds_ += step_seconds_;
    return loss_value;
  }

  // Summed cross-entropy of one micro-batch over its trained (shifted) label positions. Only
  // those positions go through the vocabulary-wide head: with assistant-only labels that is a
  // small part of the sequence, and the [tokens, vocab] logits dominate time and memory.
  torch::Tensor MicroBatchLossSum(const data::Batch& batch) {
    torch::Tensor hidden;
    {
      internal::AutocastGuard autocast(t_.bf16(), device_.type(), torch::kBFloat16);
      hidden = model_->ForwardHidden(ToModelInputs(batch, device_));
    }
    const int64_t width = hidden.size(-1);
    auto labels = ShiftedLabels(batch, device_).reshape({-1});
    auto positions = labels.ne(-100).nonzero().squeeze(1);
    auto trained =
        hidden.slice(1, 0, batch.seq_len - 1).reshape({-1, width}).index_select(0, positions);
    torch::Tensor logits;
    {
      internal::AutocastGuard autocast(t_.bf16(), device_.type(), torch::kBFloat16);
      logits = model_->Head(trained);
    }
    return torch::nn::functional::cross_entropy(
        logits.to(torch::kFloat32), labels.index_select(0, positions),
        torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  }

  double ClipGradients() {
    std::vector<torch::Tensor> params;
    for (auto& p : model_->parameters()) {
      if (p.grad().defined()) params.push_back(p);
    }
    const double max_norm =
        t_.max_grad_norm() > 0 ? t_.max_grad_norm() : std::numeric_limits<double>::infinity();
    return torch::nn::utils::clip_grad_norm_(params, max_norm);
  }

  void MaybeLog(double loss) {
    window_loss_ += loss;
    ++window_steps_;
    if (state_.global_step % logging_every_ != 0 && state_.global_step != total_steps_) return;
    nlohmann::json values = {
        {"loss", window_loss_ / window_steps_},
        {"learning_rate", t_.learning_rate() * schedule_->Factor(state_.global_step - 1)},
        {"grad_norm", grad_norm_},
        {"epoch", state_.epoch},
        {"total_steps", total_steps_},
        {"step_time", step_seconds_},
        {"tokens_per_second", window_tokens_ / std::max(1e-9, window_seconds_)},
        {"samples_per_second", window_samples_ / std::max(1e-9, window_seconds_)}};
    events_->Emit("metric", {{"step", state_.global_step}, {"values", values}});
    window_loss_ = window_seconds_ = 0;
    window_steps_ = window_tokens_ = window_samples_ = 0;
  }

  bool ShouldSave() const {
    if (t_.save_strategy() == "steps") return state_.global_step % save_every_ == 0;
    if (t_.save_strategy() == "epoch") return state_.global_step % steps_per_epoch_ == 0;
    return false;
  }

  absl::StatusOr<std::string> Save() {
    ASSIGN_OR_RETURN(std::string dir,
                     SaveCheckpoint(spec_.output_dir(), state_, *model_, *optimizer_));
    last_saved_step_ = state_.global_step;
    events_->Emit("checkpoint",
                  {{"step", state_.global_step}, {"path", fs::absolute(dir).string()}});
    return dir;
  }

  const trainctl::v1::JobSpec& spec_;
  const TrainingArguments& t_;
  EventSink* events_;
  torch::Device device_{torch::kCPU};
  std::shared_ptr<Qwen2VLForConditionalGeneration> model_;
  std::unique_ptr<data::Loader> loader_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  std::optional<LrSchedule> schedule_;
  TrainerState state_;
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
