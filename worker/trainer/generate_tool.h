// KV-cached generation from a saved model on a JSON request, writing the new tokens:
// `trainctl-trainer generate --model DIR --request REQ.json --max_new_tokens N [--temperature T]
// [--top_p P] [--top_k K] [--seed S] [--device ..] [--dtype ..] [--attention ..] --out OUT.json`.
//
// The request is the forward tool's (model/forward_tool.h) with two additions:
//   {"input_ids": [[...], ...]          rows may differ in length (the tool left-pads them),
//    "attention_mask"?: [[...], ...]    per row as long as its input_ids row; 0 drops a token,
//    "pixel_values_file"?: "x.safetensors"   pixel_values + image_grid_thw (working directory), or
//    "images"?: ["a.png", ...]          files relative to the request's folder, run through the
//                                       data pipeline's image processor (data/image_processor.h)}
// Images are matched in order, across rows, to the <|image_pad|> runs of input_ids. A run is
// either already as long as the image's merged patch count, or a single <|image_pad|>, which is
// expanded to that count (as `trainctl prepare` does), so a request may hold one pad per image.
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

// Expands image pads in `rows` (see the file comment): `merged_tokens[i]` is image i's count of
// <|image_pad|> tokens. INVALID_ARGUMENT when a run matches neither 1 nor the count, or runs and
// images differ in number.
absl::StatusOr<std::vector<std::vector<int64_t>>> ExpandImagePads(
    const std::vector<std::vector<int64_t>>& rows, const std::vector<int64_t>& merged_tokens,
    int64_t image_pad_id);

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
