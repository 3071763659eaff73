#include "worker/trainer/serve/request_budget.h"

#include <algorithm>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/data/image_header.h"

namespace trainctl::serve {
int64_t MinTextTokens(int64_t text_bytes, int64_t ascii_bytes,
                      const tokenizer::BpeTokenizer& tokenizer) {
  const int64_t normalized_bytes = ascii_bytes + (text_bytes - ascii_bytes) / 3;
  return normalized_bytes / std::max<int64_t>(1, tokenizer.max_token_bytes());
}

absl::StatusOr<std::vector<int64_t>> CheckPromptBudget(const ChatRequest& request,
                                                       const std::vector<std::string>& image_bytes,
                                                       const tokenizer::BpeTokenizer& tokenizer,
                                                       const RequestLimits& limits) {
  std::vector<int64_t> counts;
  int64_t image_tokens = 0;
  for (size_t k = 0; k < image_bytes.size(); ++k) {
    const std::string& param = request.image_params[k];
    absl::StatusOr<data::ImageHeader> header = data::ReadImageHeader(image_bytes[k], param);
    if (!header.ok()) return InvalidParam(param, header.status().message());
    absl::StatusOr<int64_t> tokens =
        data::ImageTokenCount(header->height, header->width, limits.image);
    if (!tokens.ok()) return InvalidParam(param, tokens.status().message());
    counts.push_back(*tokens);
    image_tokens += *tokens;
  }
  int64_t text_bytes = 0, ascii_bytes = 0;
  for (const tokenizer::ChatMessage& message : request.messages) {
    for (const tokenizer::ChatPart& part : message.content) {
      text_bytes += static_cast<int64_t>(part.text.size());
      ascii_bytes += std::count_if(part.text.begin(), part.text.end(),
                                   [](char c) { return static_cast<unsigned char>(c) < 0x80; });
    }
  }
  const int64_t text_tokens = MinTextTokens(text_bytes, ascii_bytes, tokenizer);
  const int64_t least = image_tokens + text_tokens + request.sampling.max_tokens;
  if (least > limits.max_context) {
    return InvalidParam(
        "messages",
        absl::StrCat("the prompt is at least ", image_tokens + text_tokens, " tokens (",
                     image_tokens, " for ", image_bytes.size(),
                     " images by their headers, at least ", text_tokens, " for ", text_bytes,
                     " bytes of text) and with ", request.sampling.max_tokens,
                     " new ones exceeds the ", limits.max_context,
                     "-token context; refused before decoding or tokenizing"));
  }
  return counts;
}

}  // namespace trainctl::serve
