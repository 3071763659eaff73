// A reward model: a Qwen2-VL checkpoint with HF's *ForSequenceClassification head (`score.weight`
// [1, hidden], a Linear without bias, in place of lm_head) that scores prompt + completion by the
// head's output at each row's last token, as TRL's GRPOTrainer scores with
// AutoModelForSequenceClassification(num_labels=1): logits[:, 0] at the last non-padding token.
//
// The model runs in a frozen (forward-only) ZeRO engine sharded like the policy, so loading and
// scoring are collective at stage 3: every rank calls them the same number of times.
//
// Not thread-safe.
#ifndef TRAINCTL_WORKER_TRAINER_REWARDS_REWARD_MODEL_H_
#define TRAINCTL_WORKER_TRAINER_REWARDS_REWARD_MODEL_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/trainer/model/qwen2vl.h"
#include "worker/trainer/zero/comm.h"
#include "worker/trainer/zero/engine.h"

namespace trainctl::rewards {

class RewardModel {
 public:
  // Loads the HF checkpoint directory `dir` (config.json + safetensors) into a frozen engine
  // built with `options` (its sharding and compute dtype; optimizer fields are unused). `comm`
  // must outlive the model. NOT_FOUND when `dir` has no config.json; FAILED_PRECONDITION naming
  // what the directory holds instead when it has no `score.weight` (e.g. a causal LM's lm_head)
  // or when score.weight is not [1, hidden]; other load errors as zero::Engine::CreateFrozen.
  static absl::StatusOr<std::unique_ptr<RewardModel>> Load(const std::string& dir,
                                                           const zero::EngineOptions& options,
                                                           zero::Comm* comm);

  // One score per row of `inputs` (input_ids [B, T], attention_mask [B, T] with 1 on tokens; any
  // padding layout: right, left, or a left-padded prompt before a right-padded completion;
  // images allowed): the head's output after the final norm at the row's LAST position whose
  // attention_mask is 1 (the last position when attention_mask is undefined). INVALID_ARGUMENT
  // for a row without tokens or for inputs the model refuses. Collective at stage 3.
  absl::StatusOr<std::vector<double>> Score(const model::ModelInputs& inputs);

  zero::Engine& engine() { return *engine_; }

 private:
  explicit RewardModel(std::unique_ptr<zero::Engine> engine) : engine_(std::move(engine)) {}

  std::unique_ptr<zero::Engine> engine_;
};

}  // namespace trainctl::rewards

#endif  // TRAINCTL_WORKER_TRAINER_REWARDS_REWARD_MODEL_H_
