// tokenizer.json (common/tokenizer/bpe_tokenizer.h): the input up to its first NUL byte is
// the file; what follows the NUL (or a fixed sentence) is encoded with the tokenizer it loads,
// and the ids decoded again.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/strings/string_view.h"
#include "common/tokenizer/bpe_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* bytes = reinterpret_cast<const char*>(data);
  const void* nul = std::memchr(bytes, '\0', size);
  const size_t json_size = nul == nullptr ? size : static_cast<const char*>(nul) - bytes;
  const absl::string_view json(bytes, json_size);
  const absl::string_view text =
      nul == nullptr ? absl::string_view("Hello <|im_start|>wörld 12345 \xF0\x9F\x98\x80 l'été\n")
                     : absl::string_view(bytes + json_size + 1, size - json_size - 1);
  auto tokenizer = trainctl::tokenizer::BpeTokenizer::FromJson(json, "fuzz/tokenizer.json");
  if (!tokenizer.ok()) return 0;
  auto ids = (*tokenizer)->Encode(text);
  if (!ids.ok()) return 0;
  (void)(*tokenizer)->Decode(*ids);
  (void)(*tokenizer)->Decode(*ids, /*skip_special_tokens=*/true);
  return 0;
}
