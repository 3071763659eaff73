// Checks before work: whether a chat request can fit the context, decided from its images'
// headers and its text's length before any image is decoded or any text tokenized. The images'
// tokens are exact (data/image_header.h: the header's size through smart_resize with the server's
// min/max pixels); the text's are a lower bound from its bytes, so a request this refuses could
// never have fitted, and one it passes is still checked against its real token count afterwards.
#ifndef TRAINCTL_WORKER_TRAINER_SERVE_REQUEST_BUDGET_H_
#define TRAINCTL_WORKER_TRAINER_SERVE_REQUEST_BUDGET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "worker/trainer/serve/chat_request.h"

namespace trainctl::serve {

// The fewest ids `text_bytes` of UTF-8 (of which `ascii_bytes` ASCII) can tokenize into: NFC
// leaves ASCII alone and shrinks other text at most threefold (Hangul jamo to a syllable), and
// one id stands for at most tokenizer.max_token_bytes() bytes.
int64_t MinTextTokens(int64_t text_bytes, int64_t ascii_bytes,
                      const tokenizer::BpeTokenizer& tokenizer);

// The images' merged tokens from their headers, one count per image (`image_bytes[k]` is
// request.image_urls[k]'s bytes). INVALID_ARGUMENT naming the image's part when its header cannot
// be read or its size is one the processor refuses (a side under 28 pixels, aspect ratio above
// 200, more pixels than the decoder opens); INVALID_ARGUMENT naming "messages" when those tokens,
// the text's least tokens and max_tokens exceed limits.max_context.
absl::StatusOr<std::vector<int64_t>> CheckPromptBudget(const ChatRequest& request,
                                                       const std::vector<std::string>& image_bytes,
                                                       const tokenizer::BpeTokenizer& tokenizer,
                                                       const RequestLimits& limits);

}  // namespace trainctl::serve

#endif  // TRAINCTL_WORKER_TRAINER_SERVE_REQUEST_BUDGET_H_
