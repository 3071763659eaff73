// `trainctl tokenize`, the real binary, on the real Qwen tokenizer.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/tokenizer/qwen_fixture.h"

namespace trainctl::tokenizer {
namespace {

using ::testing::HasSubstr;

trainctl::testing::RunResult Tokenize(const std::string& stdin_text, const std::string& flags) {
  const std::string command = "printf '%s' \"$INPUT\" | \"$CLI\" tokenize " + flags;
  return trainctl::testing::Run({"/bin/sh", "-c", command},
                                {{"INPUT", stdin_text}, {"CLI", TRAINCTL_CLI_BIN}});
}

TEST(TokenizeCliTest, EncodesLinesAndDecodesThemBack) {
  ASSERT_TRUE(testing::QwenFixturePresent());
  const std::string dir = "--tokenizer " + testing::QwenTokenizerDir();
  auto run = Tokenize("Hello world\n<|im_start|>user\n\n", dir);
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.out, "[9707,1879]\n[151644,872]\n[]\n");
  run = Tokenize("[9707,1879]\n[151644,872]\n", dir + " --decode");
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.out, "Hello world\n<|im_start|>user\n");
}

TEST(TokenizeCliTest, ReportsBadInputAndAMissingTokenizer) {
  ASSERT_TRUE(testing::QwenFixturePresent());
  auto run = Tokenize("[1]\nnot json\n", "--decode --tokenizer " + testing::QwenTokenizerDir());
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_THAT(run.err, HasSubstr("stdin line 2: expected a JSON array of token ids"));
  run = Tokenize("x\n", "--tokenizer /nonexistent");
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_THAT(run.err, HasSubstr("cannot read /nonexistent"));
  run = Tokenize("x\n", "");
  EXPECT_THAT(run.err, HasSubstr("tokenize needs --tokenizer DIR"));
}

}  // namespace
}  // namespace trainctl::tokenizer
