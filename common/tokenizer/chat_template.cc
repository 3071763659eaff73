#include "common/tokenizer/chat_template.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace trainctl::tokenizer {
namespace {

constexpr char kImStart[] = "<|im_start|>";
constexpr char kImEnd[] = "<|im_end|>";
constexpr char kVisionStart[] = "<|vision_start|>";
constexpr char kImagePad[] = "<|image_pad|>";
constexpr char kVisionEnd[] = "<|vision_end|>";

absl::Status CheckMessage(const ChatMessage& message, size_t index) {
  if (message.role != "system" && message.role != "user" && message.role != "assistant") {
    return absl::InvalidArgumentError(absl::StrCat("messages[", index, "]: role '", message.role,
                                                   "' is not system, user or assistant"));
  }
  for (size_t i = 0; i < message.content.size(); ++i) {
    const ChatPart& part = message.content[i];
    if (part.kind == ChatPart::Kind::kImage && part.image_tokens < 1) {
      return absl::InvalidArgumentError(absl::StrCat("messages[", index, "].content[", i,
                                                     "]: an image needs at least one token, got ",
                                                     part.image_tokens));
    }
  }
  return absl::OkStatus();
}

void AppendContent(const ChatMessage& message, std::string* text) {
  for (const ChatPart& part : message.content) {
    if (part.kind == ChatPart::Kind::kText) {
      text->append(part.text);
      continue;
    }
    text->append(kVisionStart);
    for (int64_t i = 0; i < part.image_tokens; ++i) text->append(kImagePad);
    text->append(kVisionEnd);
  }
}

bool HasImage(const std::vector<ChatMessage>& messages) {
  return std::any_of(messages.begin(), messages.end(), [](const ChatMessage& m) {
    return std::any_of(m.content.begin(), m.content.end(),
                       [](const ChatPart& p) { return p.kind == ChatPart::Kind::kImage; });
  });
}

absl::Status CheckSpecialTokens(const BpeTokenizer& tokenizer, bool images) {
  std::vector<const char*> needed = {kImStart, kImEnd};
  if (images) needed.insert(needed.end(), {kVisionStart, kImagePad, kVisionEnd});
  for (const char* token : needed) {
    if (!tokenizer.TokenToId(token)) {
      return absl::FailedPreconditionError(absl::StrCat("the tokenizer lacks ", token));
    }
  }
  return absl::OkStatus();
}

// The messages with their text as the tokenizer normalizes it, so that spans found in the
// rendered text stay exact after tokenization.
std::vector<ChatMessage> Normalized(std::vector<ChatMessage> messages,
                                    const BpeTokenizer& tokenizer) {
  for (ChatMessage& m : messages) {
    for (ChatPart& part : m.content) {
      if (part.kind == ChatPart::Kind::kText) part.text = tokenizer.Normalize(part.text);
    }
  }
  return messages;
}

bool Overlaps(std::pair<size_t, size_t> a, std::pair<size_t, size_t> b) {
  return a.first < b.second && b.first < a.second;
}

}  // namespace

absl::StatusOr<RenderedChat> RenderChat(const std::vector<ChatMessage>& messages,
                                        const ChatTemplateOptions& options) {
  RenderedChat out;
  if (!messages.empty() && messages[0].role != "system") {
    absl::StrAppend(&out.text, kImStart, "system\n", options.default_system_prompt, kImEnd, "\n");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    if (auto status = CheckMessage(messages[i], i); !status.ok()) return status;
    absl::StrAppend(&out.text, kImStart, messages[i].role, "\n");
    const size_t content_begin = out.text.size();
    AppendContent(messages[i], &out.text);
    out.text.append(kImEnd);
    if (messages[i].role == "assistant")
      out.assistant_spans.emplace_back(content_begin, out.text.size());
    out.text.append("\n");
  }
  if (options.add_generation_prompt) absl::StrAppend(&out.text, kImStart, "assistant\n");
  return out;
}

absl::StatusOr<TrainingExample> BuildTrainingExample(const std::vector<ChatMessage>& messages,
                                                     const BpeTokenizer& tokenizer) {
  if (auto status = CheckSpecialTokens(tokenizer, HasImage(messages)); !status.ok()) return status;
  auto rendered = RenderChat(Normalized(messages, tokenizer));
  if (!rendered.ok()) return rendered.status();
  if (rendered->assistant_spans.empty()) {
    return absl::InvalidArgumentError("no assistant turn to train on");
  }
  auto encoding = tokenizer.EncodeWithSpans(rendered->text);
  if (!encoding.ok()) return encoding.status();
  TrainingExample example;
  example.input_ids = std::move(encoding->ids);
  example.labels.assign(example.input_ids.size(), kIgnoreLabel);
  auto span = rendered->assistant_spans.begin();
  for (size_t i = 0; i < example.input_ids.size(); ++i) {
    const auto token_span = encoding->spans[i];
    while (span != rendered->assistant_spans.end() && span->second <= token_span.first) ++span;
    if (span != rendered->assistant_spans.end() && Overlaps(token_span, *span)) {
      example.labels[i] = example.input_ids[i];
    }
  }
  return example;
}

}  // namespace trainctl::tokenizer
