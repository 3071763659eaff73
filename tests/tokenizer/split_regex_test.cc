#include "common/tokenizer/internal/split_regex.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/tokenizer/tiny_tokenizer.h"

namespace trainctl::tokenizer::internal {
namespace {

using ::testing::ElementsAre;

std::vector<std::string> Pieces(absl::string_view pattern, absl::string_view text) {
  auto regex = SplitRegex::Compile(pattern);
  EXPECT_TRUE(regex.ok()) << regex.status();
  std::vector<std::pair<size_t, size_t>> ranges;
  EXPECT_TRUE((*regex)->Split(text, &ranges).ok());
  std::vector<std::string> pieces;
  for (const auto& [begin, end] : ranges) pieces.emplace_back(text.substr(begin, end - begin));
  return pieces;
}

TEST(SplitRegexTest, QwenPatternSplitsWordsNumbersPunctuationAndWhitespace) {
  EXPECT_THAT(
      Pieces(testing::kQwenSplitRegex, "Hello  world's 2024!\n\n  x"),
      ElementsAre("Hello", " ", " world", "'s", " ", "2", "0", "2", "4", "!\n\n", " ", " x"));
  EXPECT_THAT(Pieces(testing::kQwenSplitRegex, "IT'S"), ElementsAre("IT", "'S"));
}

TEST(SplitRegexTest, WhiteSpaceIsUnicodeWhiteSpaceAsInOniguruma) {
  // U+0085 (NEL) is White_Space; PCRE2's own \s would not match it.
  EXPECT_THAT(Pieces(R"(\s+|\S+)", "a\u0085b\u3000c"),
              ElementsAre("a", "\u0085", "b", "\u3000", "c"));
  EXPECT_THAT(Pieces(R"([^\s]+)", "a\u0085b"), ElementsAre("a", "\u0085", "b"));
}

TEST(SplitRegexTest, GapsBetweenMatchesArePiecesToo) {
  EXPECT_THAT(Pieces("[0-9]+", "ab12cd3"), ElementsAre("ab", "12", "cd", "3"));
  EXPECT_THAT(Pieces("x*", "abx"), ElementsAre("ab", "x"));  // empty matches split nothing
}

TEST(SplitRegexTest, TranslatesOnlyWhiteSpaceShorthands) {
  EXPECT_EQ(TranslateOnigurumaPattern(R"(\p{L}+\d\\s)"), R"(\p{L}+\d\\s)");
  EXPECT_THAT(TranslateOnigurumaPattern(R"(\s)"), ::testing::StartsWith(R"([\t-\r\x{20}\x{85})"));
  EXPECT_THAT(TranslateOnigurumaPattern(R"([^\s\p{L}])"), ::testing::StartsWith(R"([^\t-\r)"));
  EXPECT_THAT(TranslateOnigurumaPattern(R"(\S)"), ::testing::StartsWith(R"([^\t-\r)"));
}

TEST(SplitRegexTest, LongRunsDoNotExhaustTheMatcher) {
  const std::string spaces(1 << 20, ' ');
  EXPECT_THAT(Pieces(testing::kQwenSplitRegex, spaces + "x"),
              ElementsAre(std::string((1 << 20) - 1, ' '), " x"));
}

}  // namespace
}  // namespace trainctl::tokenizer::internal
