// GRPO (stages/loop.h runs it), as TRL's GRPOTrainer, on the ZeRO engine:
//
//   prompts   spec.data_path: prepared shards whose records carry their solution; a record's
//             prompt is its tokens before the first trained (assistant) token, with its images.
//             One optimizer step takes per_device_train_batch_size x world x
//             gradient_accumulation_steps completions: that many / num_generations prompts, the
//             same on every rank (a seeded permutation per epoch), each repeated num_generations
//             times in a row; rank r generates and trains completions [r B, (r + 1) B) of that
//             list, so a prompt's group may span ranks.
//   rollout   the policy samples (model/generation.h: temperature, top_p, top_k, each completion
//             seeded from training.seed, the step's generation and its place in it, so a run
//             draws the same rollouts on any number of ranks and after a resume) up to
//             max_completion_length tokens. Under ZeRO-3 with gather_for_generation the weights
//             are gathered once for the rollout and freed after; without, each unit is gathered
//             on every decoding step and the ranks decode in lock-step.
//   scoring   reward_funcs (rewards/rule_rewards.h) on the decoded completion against the
//             record's solution and the reward model (rewards/reward_model.h) on prompt +
//             completion, weighted by reward_weights and summed; advantages normalised per group
//             (or batch) over every rank's rewards (stages/grpo_loss.h).
//   loss      the clipped surrogate of each loss_type with beta x k3 KL to a frozen reference
//             model (the starting policy, built like the policy, no optimizer state; none when
//             beta == 0). With num_iterations (mu) > 1 one rollout serves mu optimizer steps, the
//             ratio taken to the policy that generated it.
//   events    TRL's metric names: reward, reward_std, rewards/<name>/mean, kl,
//             clip_ratio/{low_mean,high_mean,region_mean}, completions/mean_length,
//             completions/clipped_ratio, frac_reward_zero_std, plus generation tokens/s and the
//             step's seconds in generation, scoring and training; a `generation` event says how
//             the weights were held for the rollout and what that cost.
#ifndef TRAINCTL_WORKER_TRAINER_STAGES_GRPO_H_
#define TRAINCTL_WORKER_TRAINER_STAGES_GRPO_H_

#include <memory>

#include "worker/trainer/stages/loop.h"

namespace trainctl::trainer {

std::unique_ptr<Stage> MakeGrpoStage();

}  // namespace trainctl::trainer

#endif  // TRAINCTL_WORKER_TRAINER_STAGES_GRPO_H_
