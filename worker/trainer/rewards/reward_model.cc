#include "worker/trainer/rewards/reward_model.h"

#include <torch/torch.h>

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/trainer/model/qwen2vl_config.h"
#include "worker/trainer/model/safetensors.h"
#include "worker/trainer/model/state_dict_adapter.h"
#include "worker/trainer/model/status_guard.h"

namespace trainctl::rewards {
namespace {

constexpr char kScore[] = "score.weight";

// FAILED_PRECONDITION unless the checkpoint in `dir` has score.weight [1, hidden], saying what it
// has instead.
absl::Status CheckScoreHead(const std::string& dir, int64_t hidden) {
  ASSIGN_OR_RETURN(auto ckpt, model::SafetensorsCheckpoint::Open(dir));
  const model::SafetensorInfo* score = nullptr;
  bool has_lm_head = false;
  for (const std::string& key : ckpt->names()) {
    const std::string name = model::ToModelKey(key);
    if (name == kScore) score = ckpt->Find(key);
    has_lm_head |= name == "lm_head.weight";
  }
  if (score == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("reward model ", dir, " has no ", kScore,
                     " (a *ForSequenceClassification head [1, ", hidden, "]); ",
                     has_lm_head ? "found lm_head.weight — this is a causal LM checkpoint"
                                 : "found no head at all (a causal LM with tied embeddings?)"));
  }
  if (score->shape != std::vector<int64_t>{1, hidden}) {
    return absl::FailedPreconditionError(
        absl::StrCat("reward model ", dir, ": ", kScore, " is [", absl::StrJoin(score->shape, ", "),
                     "], expected [1, ", hidden, "] (one label, as TRL loads reward models)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<RewardModel>> RewardModel::Load(const std::string& dir,
                                                               const zero::EngineOptions& options,
                                                               zero::Comm* comm) {
  ASSIGN_OR_RETURN(model::Qwen2VLConfig config, model::LoadQwen2VLConfig(dir));
  RETURN_IF_ERROR(CheckScoreHead(dir, config.hidden_size));
  config.num_labels = 1;  // TRL: AutoModelForSequenceClassification(..., num_labels=1)
  ASSIGN_OR_RETURN(std::unique_ptr<zero::Engine> engine,
                   zero::Engine::CreateFrozen(config, options, comm, /*seed=*/0, dir));
  return std::unique_ptr<RewardModel>(new RewardModel(std::move(engine)));
}

absl::StatusOr<std::vector<double>> RewardModel::Score(const model::ModelInputs& inputs) {
  const torch::Tensor& ids = inputs.input_ids;
  if (!ids.defined() || ids.dim() != 2 || ids.size(1) == 0) {
    return absl::InvalidArgumentError("RewardModel::Score: input_ids must be [B, T] with T > 0");
  }
  const int64_t rows = ids.size(0), width = ids.size(1);
  torch::NoGradGuard no_grad;
  torch::Tensor last;  // [B] int64: each row's last token
  if (inputs.attention_mask.defined()) {
    if (inputs.attention_mask.sizes() != ids.sizes()) {
      return absl::InvalidArgumentError("RewardModel::Score: attention_mask must match input_ids");
    }
    const torch::Tensor present = inputs.attention_mask.ne(0);
    if (!present.any(1).all().item<bool>()) {
      return absl::InvalidArgumentError(
          "RewardModel::Score: a row has no token (attention_mask 0)");
    }
    const torch::Tensor positions = torch::arange(width, ids.options().dtype(torch::kInt64));
    last = (positions.unsqueeze(0) * present.to(torch::kInt64)).argmax(1);
  } else {
    last = torch::full({rows}, width - 1, ids.options().dtype(torch::kInt64));
  }
  model::Qwen2VLForConditionalGeneration& net = engine_->model();
  torch::Tensor scores;
  RETURN_IF_ERROR(model::Guarded(
      "reward model forward",
      [&] {
        const torch::Tensor hidden = net.ForwardHidden(inputs);  // [B, T, hidden]
        const torch::Tensor at_last = hidden.index({torch::arange(rows, last.options()), last})
                                          .unsqueeze(1);  // [B, 1, hidden]
        // The head is per position, so normalising and scoring only the last tokens is HF's
        // logits[arange(B), last] without the [B, T, 1] intermediate.
        scores = net.Head(at_last).select(2, 0).select(1, 0);
      },
      absl::StatusCode::kInvalidArgument));
  const torch::Tensor cpu = scores.to(torch::kCPU, torch::kDouble).contiguous();
  return std::vector<double>(cpu.data_ptr<double>(), cpu.data_ptr<double>() + rows);
}

}  // namespace trainctl::rewards
