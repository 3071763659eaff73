// KV-cached generation from a saved model on a JSON request, writing the new tokens:
// `trainctl-trainer generate --model DIR --request REQ.json --max_new_tokens N [--temperature T]
// [--top_p P] [--top_k K] [--seed S] [--device ..] [--dtype ..] [--attention ..] --out OUT.json`.
//
// The request is the file worker/trainer/tool_request.h describes, the forward verb's too. Rows may
// differ in length (the tool left-pads them); attention_mask's 0s drop tokens.
//
// Eos ids are the model directory's generation_config.json `eos_token_id` (an id or a list), else
// config.json's, else Qwen2-VL's <|im_end|> and <|endoftext|>; the pad id likewise from
// `pad_token_id`, else <|endoftext|>.
//
// OUT: {"generated": [[new ids...], ...], "stopped": [true if the row ended with eos, ...]}.
#ifndef TRAINCTL_WORKER_TRAINER_GENERATE_TOOL_H_
#define TRAINCTL_WORKER_TRAINER_GENERATE_TOOL_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/trainer/model/forward_tool.h"
#include "worker/trainer/model/generation.h"
#include "worker/trainer/tool_request.h"

namespace trainctl::trainer {

struct GenerateToolOptions {
  model::ForwardOptions forward;  // device, dtype, attention
  // eos_token_ids and pad_token_id are filled from the model directory by RunGenerate.
  // The tool's default temperature is 0 (greedy), as HF's generate without do_sample.
  model::GenerationOptions generation;
};

// From the verb's flags (`max_new_tokens` required, positive; `temperature` default 0, `top_p`,
// `top_k`, `seed`, `device`, `dtype`, `attention`): INVALID_ARGUMENT naming the flag.
absl::StatusOr<GenerateToolOptions> ParseGenerateToolOptions(
    const std::map<std::string, std::string>& flags);

// The eos ids and pad id for the model in `model_dir`, as the file comment says.
struct SpecialTokens {
  std::vector<int64_t> eos_token_ids;
  int64_t pad_token_id = model::kEndOfTextTokenId;
};
SpecialTokens ReadSpecialTokens(const std::string& model_dir);

// Loads the model (options.forward's dtype and device, eval mode), generates for the request at
// `request_path` and writes OUT. INVALID_ARGUMENT naming the field for a malformed request, or
// with the model's message; NOT_FOUND for unreadable files; the loader's errors otherwise.
absl::Status RunGenerate(const std::string& model_dir, const std::string& request_path,
                         const std::string& out_path, const GenerateToolOptions& options);

}  // namespace trainctl::trainer

#endif  // TRAINCTL_WORKER_TRAINER_GENERATE_TOOL_H_
