// A chat to be answered made into the prompt a generator decodes from, the steps `trainctl
// prepare` takes for a record (prepare.h BuildSample) with the generation prompt at the end: each
// image part given its image's merged token count, the chat rendered by
// tokenizer/chat_template.h and tokenized whole, the vision tokens counted against the images.
// What `trainctl-trainer serve` (serve/chat_request.h) and trace distillation's in-process
// teacher (stages/internal/model_teacher.h) share.
#ifndef TRAINCTL_COMMON_DATA_CHAT_PROMPT_H_
#define TRAINCTL_COMMON_DATA_CHAT_PROMPT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/data/image_processor.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "common/tokenizer/chat_template.h"

namespace trainctl::data {

// Token ids (image pads expanded) and the images' patches [patches, kPatchDim] with their
// (t, h, w) grids, in order: ready for model::LeftPadPrompts.
struct ChatPrompt {
  std::vector<int64_t> ids;
  std::vector<float> pixel_values;
  std::vector<int64_t> grid_thw;  // 3 per image
};

// `images` are the processed images of the messages' image parts, in order (their image_tokens
// are ignored and set from the images). INVALID_ARGUMENT when parts and images differ in number,
// the chat does not render or tokenize, or the text holds vision special tokens of its own;
// FAILED_PRECONDITION when the tokenizer lacks Qwen2-VL's chat special tokens. Thread-safe.
absl::StatusOr<ChatPrompt> BuildChatPrompt(std::vector<tokenizer::ChatMessage> messages,
                                           const std::vector<ProcessedImage>& images,
                                           const tokenizer::BpeTokenizer& tokenizer);

}  // namespace trainctl::data

#endif  // TRAINCTL_COMMON_DATA_CHAT_PROMPT_H_
