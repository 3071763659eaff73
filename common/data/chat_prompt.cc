#include "common/data/chat_prompt.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace trainctl::data {

using tokenizer::ChatPart;

absl::StatusOr<ChatPrompt> BuildChatPrompt(std::vector<tokenizer::ChatMessage> messages,
                                           const std::vector<ProcessedImage>& images,
                                           const tokenizer::BpeTokenizer& tokenizer) {
  ChatPrompt prompt;
  size_t k = 0;
  int64_t expected = 0;
  for (tokenizer::ChatMessage& m : messages) {
    for (ChatPart& part : m.content) {
      if (part.kind != ChatPart::Kind::kImage) continue;
      if (k >= images.size()) return absl::InvalidArgumentError("more image parts than images");
      const ProcessedImage& image = images[k++];
      part.image_tokens = image.num_merged_tokens();
      expected += part.image_tokens;
      prompt.pixel_values.insert(prompt.pixel_values.end(), image.pixel_values.begin(),
                                 image.pixel_values.end());
      prompt.grid_thw.insert(prompt.grid_thw.end(), image.grid_thw.begin(), image.grid_thw.end());
    }
  }
  if (k != images.size()) return absl::InvalidArgumentError("more images than image parts");
  const auto vision_start = tokenizer.TokenToId("<|vision_start|>");
  const auto image_pad = tokenizer.TokenToId("<|image_pad|>");
  if (!tokenizer.TokenToId("<|im_start|>") || !tokenizer.TokenToId("<|im_end|>") || !vision_start ||
      !image_pad) {
    return absl::FailedPreconditionError("the tokenizer lacks Qwen2-VL's chat special tokens");
  }
  tokenizer::ChatTemplateOptions options;
  options.add_generation_prompt = true;
  absl::StatusOr<tokenizer::RenderedChat> rendered = tokenizer::RenderChat(messages, options);
  if (!rendered.ok()) return rendered.status();
  absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(rendered->text);
  if (!ids.ok()) return ids.status();
  int64_t starts = 0, pads = 0;
  prompt.ids.reserve(ids->size());
  for (const int32_t id : *ids) {
    starts += id == *vision_start;
    pads += id == *image_pad;
    prompt.ids.push_back(id);
  }
  if (starts != static_cast<int64_t>(k) || pads != expected) {
    return absl::InvalidArgumentError("the text holds vision special tokens of its own");
  }
  return prompt;
}

}  // namespace trainctl::data
