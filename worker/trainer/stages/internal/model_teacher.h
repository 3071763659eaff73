// Trace distillation's in-process teacher: a checkpoint, built by the loop as the frozen engine,
// generating on the job's ranks with the KV-cached generator (stages/internal/rollout.h).
//
// A batch of prompts is generated together, each prompt's num_generations rows side by side,
// left-padded; completion j of prompt i draws from its own generator seeded
// SamplingSeed(seed, i, j), so what a prompt gets does not depend on its batch, rank or run.
// Prompts are built as `trainctl-trainer serve` builds them (data/chat_prompt.h): images read
// from their paths and preprocessed with the job's min/max_pixels. A prompt longer than
// max_prompt_length text tokens (its images' tokens not counted, as GRPO keeps images whole)
// gets no completions: its answer's list is empty, and the manifest counts it.
#ifndef TRAINCTL_WORKER_TRAINER_STAGES_INTERNAL_MODEL_TEACHER_H_
#define TRAINCTL_WORKER_TRAINER_STAGES_INTERNAL_MODEL_TEACHER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "common/data/image_processor.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "worker/trainer/stages/internal/teacher.h"
#include "worker/trainer/stages/loop.h"

namespace trainctl::trainer::internal {

struct ModelTeacherOptions {
  std::string model;  // the reference it was built from, for DescribeJson
  int64_t max_prompt_length = 0;
  data::ImageProcessorOptions image;
};

// A teacher over `engine` (which, like `ctx`, must outlive it), decoding with `tokenizer`. When
// `engine` is sharded across ranks (ZeRO-3, world > 1) Complete is collective: every rank must
// call it equally often, with an empty list when it has no prompt left (it then decodes a
// placeholder row in lock-step with the others). Not thread-safe.
std::unique_ptr<Teacher> MakeModelTeacher(StageContext& ctx, zero::Engine& engine,
                                          std::unique_ptr<tokenizer::BpeTokenizer> tokenizer,
                                          ModelTeacherOptions options);

// Whether MakeModelTeacher's Complete over `engine` is collective (see above).
bool ModelTeacherIsCollective(const StageContext& ctx, const zero::Engine& engine);

}  // namespace trainctl::trainer::internal

#endif  // TRAINCTL_WORKER_TRAINER_STAGES_INTERNAL_MODEL_TEACHER_H_
