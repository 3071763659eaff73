// Qwen2-VL's chat template, written natively (no Jinja), and the training example built from it.
// The text is what HF's apply_chat_template renders with Qwen2-VL's chat_template (add_vision_id
// off), with each image's single <|image_pad|> already expanded to the image's merged patch count,
// as Qwen2VLProcessor does:
//
//   <|im_start|>system\nYou are a helpful assistant.<|im_end|>\n      (only when no system turn
//   first)
//   <|im_start|>user\n<|vision_start|><|image_pad|>×N<|vision_end|>What is it?<|im_end|>\n
//   <|im_start|>assistant\nA cat.<|im_end|>\n
//   <|im_start|>assistant\n                                          (add_generation_prompt)
#ifndef TRAINCTL_COMMON_TOKENIZER_CHAT_TEMPLATE_H_
#define TRAINCTL_COMMON_TOKENIZER_CHAT_TEMPLATE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/bpe_tokenizer.h"

namespace trainctl::tokenizer {

// One part of a message: text, or an image that becomes `image_tokens` <|image_pad|>s (its merged
// patch count: grid_t * grid_h * grid_w / spatial_merge_size²).
struct ChatPart {
  enum class Kind { kText, kImage };
  Kind kind = Kind::kText;
  std::string text;
  int64_t image_tokens = 0;

  static ChatPart Text(std::string text) { return {Kind::kText, std::move(text), 0}; }
  static ChatPart Image(int64_t image_tokens) { return {Kind::kImage, "", image_tokens}; }
};

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::vector<ChatPart> content;
};

struct ChatTemplateOptions {
  bool add_generation_prompt = false;  // end with "<|im_start|>assistant\n"
  std::string default_system_prompt = "You are a helpful assistant.";
};

struct RenderedChat {
  std::string text;
  // Byte ranges of what an assistant turn says: its content and its closing <|im_end|>.
  std::vector<std::pair<size_t, size_t>> assistant_spans;
};

// INVALID_ARGUMENT naming the message when a role is not system/user/assistant or an image has
// fewer than one token.
absl::StatusOr<RenderedChat> RenderChat(const std::vector<ChatMessage>& messages,
                                        const ChatTemplateOptions& options = {});

inline constexpr int32_t kIgnoreLabel = -100;  // PyTorch cross-entropy's ignore_index

struct TrainingExample {
  std::vector<int32_t> input_ids;
  // Same length as input_ids, not shifted: labels[i] = input_ids[i] for tokens of assistant turns
  // (content and <|im_end|>), kIgnoreLabel elsewhere.
  std::vector<int32_t> labels;
};

// Renders `messages` (no generation prompt) and tokenizes the whole text at once, so input_ids
// are exactly HF's tokenizer(apply_chat_template(messages)). A token that overlaps an assistant
// span is trained on. INVALID_ARGUMENT as RenderChat, or when there is no assistant turn, or for
// text that is not UTF-8; FAILED_PRECONDITION when the tokenizer lacks the template's special
// tokens.
absl::StatusOr<TrainingExample> BuildTrainingExample(const std::vector<ChatMessage>& messages,
                                                     const BpeTokenizer& tokenizer);

}  // namespace trainctl::tokenizer

#endif  // TRAINCTL_COMMON_TOKENIZER_CHAT_TEMPLATE_H_
