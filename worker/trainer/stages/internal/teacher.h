// The teacher of trace distillation (kind distill without distill_loss): something that answers
// chat prompts with sampled completions. Two implementations: a checkpoint generating in-process
// on the job's ranks (the KV-cached generator), and any OpenAI-compatible endpoint (vLLM, SGLang,
// `trainctl-trainer serve`) reached over HTTP with bounded concurrency and retries. The stage
// verifies the completions with the rule rewards and keeps the ones that pass.
//
// No LibTorch here: the endpoint side compiles without it.
#ifndef TRAINCTL_WORKER_TRAINER_STAGES_INTERNAL_TEACHER_H_
#define TRAINCTL_WORKER_TRAINER_STAGES_INTERNAL_TEACHER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/chat_template.h"

namespace trainctl::trainer::internal {

// One prompt: a record of data_path without its assistant turn, the reasoning system prompt first.
struct TeacherPrompt {
  int64_t index = 0;  // the record's position in data_path, counted across its files from 0
  // Image parts in order (image_tokens 0: each teacher counts its own); the k-th is images[k].
  std::vector<tokenizer::ChatMessage> messages;
  std::vector<std::string> images;  // absolute paths
};

struct TeacherSampling {
  int64_t n = 1;             // completions per prompt (num_generations)
  double temperature = 1.0;  // 0: greedy
  double top_p = 1.0;
  int64_t top_k = 0;         // 0: off (an endpoint that has no top_k ignores it)
  int64_t max_tokens = 256;  // max_completion_length
  // Runs repeat: prompt `index` is sampled with a seed derived from (seed, index) wherever it
  // runs (any rank, any restart), when the teacher honours seeds.
  uint64_t seed = 0;
};

struct TeacherCompletion {
  std::string text;
  std::string finish_reason;  // "stop" or "length"
  int64_t completion_tokens = 0;
};

struct TeacherAnswer {
  int64_t index = 0;                           // TeacherPrompt::index
  std::vector<TeacherCompletion> completions;  // sampling.n of them
  int64_t prompt_tokens = 0;
};

class Teacher {
 public:
  virtual ~Teacher() = default;
  // For the dataset manifest and events: {"kind": "model"|"endpoint", "model": ..., "url": ...}
  // as a JSON object's text.
  virtual std::string DescribeJson() const = 0;
  // Answers for `prompts`, in their order. An error names the prompt (its index) and why: a
  // request that still fails after the retries, a malformed answer, a generation error.
  virtual absl::StatusOr<std::vector<TeacherAnswer>> Complete(
      const std::vector<TeacherPrompt>& prompts, const TeacherSampling& sampling) = 0;
};

}  // namespace trainctl::trainer::internal

#endif  // TRAINCTL_WORKER_TRAINER_STAGES_INTERNAL_TEACHER_H_
