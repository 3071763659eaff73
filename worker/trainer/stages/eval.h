// Eval (stages/loop.h runs it as a stage that does not train): generation on spec.data_path's
// prompts, scored as GRPO scores rollouts, into a table per dataset and overall.
//
//   prompts   every record of the prepared shards (a record's prompt is its tokens before the
//             first trained token, with its images, and its solution; internal/grpo_rows.h). Rank
//             r of W takes prompts [r P, (r + 1) P), P = ceil(N / W), padded with rows that count
//             for nothing so that every rank makes the same collective calls.
//   decoding  greedy (temperature 0, one completion per prompt; the default) or num_generations
//             samples per prompt with temperature / top_p / top_k, completion j of prompt i
//             seeded from (training.seed, i, j): the same completions on any number of ranks.
//             per_device_eval_batch_size rows per model::Generate; max_completion_length tokens.
//   scoring   accuracy and format (rewards/rule_rewards.h) on the decoded completion; the reward
//             model's score (rewards/reward_model.h) when reward_model_name_or_path is set.
//   table     per dataset and overall (eval_metrics.h): accuracy, format_rate, pass@1 and
//             pass@<num_generations> (unbiased estimator), mean_completion_length,
//             reward_model_score. Datasets are the manifest's `inputs` when the shards' samples
//             can be attributed to them (one input, or inputs whose non-blank lines add up to the
//             samples), else one dataset named after data_path.
//   baseline  baseline_model_name_or_path: a second frozen model (sharded like the first) measured
//             the same way; its completions are decoded with the same tokenizer, so it must share
//             the model's vocabulary (as Qwen2-VL checkpoints do).
//   output    rank 0 writes output_dir/eval.json:
//               {"kind": "eval", "model": ..., "data_path": ..., "world_size": W,
//                "generation": {"temperature", "top_p", "top_k", "num_generations",
//                               "max_completion_length", "max_prompt_length", "seed"},
//                "datasets": [names...],
//                "overall": TABLE, "by_dataset": {name: TABLE, ...},
//                "baseline": {"model": ..., "overall": TABLE, "by_dataset": {...}}   (optional)}
//             TABLE = {"prompts", "completions", "accuracy", "format_rate", "pass@1", "pass@<k>"
//             (k > 1), "mean_completion_length", "reward_model_score" (with a reward model)};
//             and one `metric` event (step 0) with the tables flattened: "accuracy",
//             "<dataset>/accuracy", ..., the baseline's prefixed "baseline/".
#ifndef TRAINCTL_WORKER_TRAINER_STAGES_EVAL_H_
#define TRAINCTL_WORKER_TRAINER_STAGES_EVAL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "worker/trainer/stages/loop.h"

namespace trainctl::trainer {

std::unique_ptr<Stage> MakeEvalStage();

// The `metric` event's values for eval.json's document `doc` (see above).
nlohmann::json FlattenEvalMetrics(const nlohmann::json& doc);

}  // namespace trainctl::trainer

#endif  // TRAINCTL_WORKER_TRAINER_STAGES_EVAL_H_
