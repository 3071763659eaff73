// The body of an OpenAI `POST /v1/chat/completions`, checked field by field, and the prompt it
// becomes: the same steps `trainctl prepare` takes for a record (data/prepare.cc BuildSample) —
// each image decoded and preprocessed (data/image_processor.h), its part given the image's merged
// token count, the chat rendered by tokenizer/chat_template.h (here with the generation prompt)
// and tokenized whole, the vision tokens counted against the images.
//
// Accepted: model, messages (role system/developer/user/assistant; content a string, null for
// an assistant, or parts {"type": "text", "text"} / {"type": "image_url", "image_url": {"url"}
// or "url"}), n, temperature, top_p, max_tokens (or max_completion_tokens), stop (a string or a
// list), seed, stream (false only), user and the other sampling fields OpenAI defines and this
// server ignores (presence/frequency penalties of 0, logprobs false...). Image URLs are
// `data:<mime>;base64,...` (PNG, JPEG, anything DecodeImage reads) or `file://` paths inside the
// server's image root.
#ifndef TRAINCTL_WORKER_TRAINER_SERVE_CHAT_REQUEST_H_
#define TRAINCTL_WORKER_TRAINER_SERVE_CHAT_REQUEST_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/data/chat_prompt.h"
#include "common/data/image_processor.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "common/tokenizer/chat_template.h"

namespace trainctl::serve {

struct RequestLimits {
  int64_t max_n = 16;
  int64_t max_tokens_default = 256;  // when the request names none
  int64_t max_context = 32768;       // prompt + max_tokens
  int64_t max_images = 16;
  int64_t max_stop_sequences = 4;
  // Where file:// image URLs may point (a directory); empty: file:// URLs are refused.
  std::string image_root;
  data::ImageProcessorOptions image;
};

// Temperatures below this (inside OpenAI's [0, 2]) are taken as 0, greedy.
inline constexpr double kGreedyTemperature = 1e-5;

struct SamplingParams {
  int64_t n = 1;
  double temperature = 1.0;  // OpenAI's default; 0 (or below kGreedyTemperature) is greedy
  double top_p = 1.0;
  int64_t max_tokens = 0;
  std::vector<std::string> stop;
  std::optional<uint64_t> seed;
};

struct ChatRequest {
  std::string model;  // empty when the request names none
  // Image parts have image_tokens 0 until the prompt is built; the k-th is image_urls[k].
  std::vector<tokenizer::ChatMessage> messages;
  std::vector<std::string> image_urls;
  std::vector<std::string> image_params;  // "messages[i].content[j]" of each image, for errors
  SamplingParams sampling;
};

// The request's prompt, ready for LeftPadPrompts (data/chat_prompt.h).
using ChatPrompt = data::ChatPrompt;

// The OpenAI field an INVALID_ARGUMENT from this file is about ("messages[1].role"), carried as
// the status payload kParamPayload; empty when none.
inline constexpr char kParamPayload[] = "trainctl.serve/param";
std::string ErrorParam(const absl::Status& status);
// INVALID_ARGUMENT "param: message" carrying `param` as that payload. A message that already
// starts with "param: " (ReadImageHeader's and DecodeImage's, given the part's path) names it
// once; an empty `param` gives the message alone and no payload.
absl::Status InvalidParam(const std::string& param, absl::string_view message);

// INVALID_ARGUMENT (with the param payload) for a body that is not a JSON object, a field of the
// wrong type or out of range, an unknown role, no messages, or an unsupported option (stream).
// max_tokens is limits.max_tokens_default when absent.
absl::StatusOr<ChatRequest> ParseChatRequest(absl::string_view body, const RequestLimits& limits);

// Checks before work first (request_budget.h: the images' tokens from their headers and the
// text's fewest tokens from its bytes against the context), then decodes, preprocesses and
// tokenizes as the file comment says. INVALID_ARGUMENT (with the param payload) for an image that
// cannot be fetched or decoded, text with vision tokens of its own, or a prompt that with
// max_tokens exceeds limits.max_context; FAILED_PRECONDITION when the tokenizer
// lacks the chat template's special tokens. Thread-safe.
absl::StatusOr<ChatPrompt> BuildChatPrompt(const ChatRequest& request,
                                           const tokenizer::BpeTokenizer& tokenizer,
                                           const RequestLimits& limits);

}  // namespace trainctl::serve

#endif  // TRAINCTL_WORKER_TRAINER_SERVE_CHAT_REQUEST_H_
