// Trace distillation (stages/loop.h runs it): kind distill without training.distill_loss. A
// teacher answers every prompt of data_path num_generations times under distill_system_prompt;
// the rule rewards verify each completion against the record's solution; the first
// keep_per_prompt that pass become a dataset an SFT job trains on directly (open-r1's recipe).
//
//   data      spec.data_path: raw JSONL records (a file or a directory of *.jsonl; the
//             data/record_parser.h formats), each a prompt: its turns without the assistant's,
//             the system prompt first, images resolved beside the JSONL file. Prompt i is the
//             i-th record across the files.
//   teacher   teacher_model_name_or_path: the loop builds it as the frozen engine
//             (Stage::EngineModel) and it generates on the job's ranks, KV-cached, prompts x
//             num_generations rows per batch of per_device_train_batch_size prompts, completion j
//             of prompt i seeded from (seed, i, j) so runs agree on any world size; a prompt of
//             more than max_prompt_length text tokens gets no completions (counted);
//             teacher_endpoint: an OpenAI-compatible server (stages/internal/endpoint_teacher.h;
//             teacher_concurrency, teacher_timeout, teacher_max_retries; OPENAI_API_KEY), no
//             model loaded.
//   verdict   accuracy == 1 and format == 1 (rewards/rule_rewards.h) passes.
//   work      the prompts not yet done are dealt round-robin to the ranks; each rank appends a
//             line per finished prompt to output_dir/progress/rank-<k>.jsonl and fsyncs it after
//             every batch; a restarted job (any world size) reads every rank's file and skips
//             what is done (stages/internal/trace_records.h). progress/settings.json records
//             what the lines depend on (data, teacher model, sampling, system prompt, cap): a
//             restart with other settings fails (FAILED_PRECONDITION) rather than mix them.
//   outputs   rank 0, at the end: output_dir/traces.jsonl (one `messages` record per kept
//             trace, by prompt then completion), output_dir/dataset (shards prepared with the
//             student's tokenizer, model_name_or_path's, else the teacher's: an SFT data_path),
//             output_dir/distill_manifest.json (teacher, sampling, system prompt, counts, pass
//             rate, tokens, seconds, tokens/s).
//   events    `metric` after every batch: prompts_done, prompts_total, completions, passed,
//             kept, pass_rate, tokens_per_second (this run's completion tokens, all ranks).
#ifndef TRAINCTL_WORKER_TRAINER_STAGES_TRACE_DISTILL_H_
#define TRAINCTL_WORKER_TRAINER_STAGES_TRACE_DISTILL_H_

#include <memory>

#include "worker/trainer/stages/loop.h"

namespace trainctl::trainer {

std::unique_ptr<Stage> MakeTraceDistillStage();

}  // namespace trainctl::trainer

#endif  // TRAINCTL_WORKER_TRAINER_STAGES_TRACE_DISTILL_H_
