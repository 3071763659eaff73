#include "worker/trainer/rewards/rule_rewards.h"

#include <array>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/trainer/rewards/answer_match.h"

namespace trainctl::rewards {
namespace {

using ::testing::HasSubstr;

std::string Answer(const std::string& text) {
  return "<think>x</think><answer>" + text + "</answer>";
}

// ---- registry ----

TEST(RuleRewardRegistryTest, KnowsExactlyTheSpecsNames) {
  EXPECT_EQ(RuleRewardNames(), RewardFuncNames());
  for (const std::string& name : RewardFuncNames()) {
    EXPECT_TRUE(FindRuleReward(name).ok()) << name;
  }
  for (const std::string& name : DefaultRewardFuncs()) {
    EXPECT_TRUE(FindRuleReward(name).ok()) << name;
  }
}

TEST(RuleRewardRegistryTest, FindsEachFunction) {
  EXPECT_EQ(*FindRuleReward("accuracy"), &AccuracyReward);
  EXPECT_EQ(*FindRuleReward("format"), &FormatReward);
  EXPECT_EQ(*FindRuleReward("iou"), &IouReward);
}

TEST(RuleRewardRegistryTest, UnknownNameListsTheKnownOnes) {
  absl::StatusOr<RuleReward> r = FindRuleReward("Accuracy");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "unknown reward function 'Accuracy', known: accuracy|format|iou");
  EXPECT_FALSE(FindRuleReward("").ok());
}

// ---- format ----

TEST(FormatRewardTest, WholeStringMustMatch) {
  EXPECT_EQ(FormatReward("<think>a</think><answer>b</answer>", ""), 1.0f);
  EXPECT_EQ(FormatReward("<think></think><answer></answer>", ""), 1.0f);
  EXPECT_EQ(FormatReward("<think>line 1\nline 2</think>\n\n <answer>\n42\n</answer>", ""), 1.0f);
  EXPECT_EQ(FormatReward("<think>a</think> \t\r\n<answer>b</answer>", ""), 1.0f);
  // Anything before or after the tags fails the full match.
  EXPECT_EQ(FormatReward(" <think>a</think><answer>b</answer>", ""), 0.0f);
  EXPECT_EQ(FormatReward("<think>a</think><answer>b</answer>\n", ""), 0.0f);
  EXPECT_EQ(FormatReward("<think>a</think><answer>b</answer> done", ""), 0.0f);
  // Text between </think> and <answer> that is not whitespace.
  EXPECT_EQ(FormatReward("<think>a</think>so<answer>b</answer>", ""), 0.0f);
  // Missing or misspelled tags.
  EXPECT_EQ(FormatReward("<answer>b</answer>", ""), 0.0f);
  EXPECT_EQ(FormatReward("<think>a</think>", ""), 0.0f);
  EXPECT_EQ(FormatReward("<think>a<answer>b</answer>", ""), 0.0f);
  EXPECT_EQ(FormatReward("<think>a</think><answer>b", ""), 0.0f);
  EXPECT_EQ(FormatReward("", ""), 0.0f);
  EXPECT_EQ(FormatReward("<think></answer>", ""), 0.0f);
}

TEST(FormatRewardTest, LazyQuantifiersStillBacktrack) {
  // The first </think> is followed by text, a later one by <answer>: fullmatch finds the later.
  EXPECT_EQ(FormatReward("<think>a</think>b</think><answer>c</answer>", ""), 1.0f);
  // Tags inside the answer are part of .*?
  EXPECT_EQ(FormatReward("<think>a</think><answer>b</answer>c</answer>", ""), 1.0f);
  EXPECT_EQ(FormatReward("<think>a</think><answer><think></think></answer>", ""), 1.0f);
}

// ---- answer extraction ----

TEST(ExtractAnswerTest, FirstOpeningAndTheFirstClosingAfterIt) {
  EXPECT_EQ(ExtractAnswer("<answer> 5 </answer>"), " 5 ");
  EXPECT_EQ(ExtractAnswer("x<answer>a\nb</answer>y<answer>c</answer>"), "a\nb");
  EXPECT_EQ(ExtractAnswer("<answer></answer>"), "");
  EXPECT_EQ(ExtractAnswer("<answer>open"), std::nullopt);
  EXPECT_EQ(ExtractAnswer("</answer><answer>"), std::nullopt);
  EXPECT_EQ(ExtractAnswer("no tags"), std::nullopt);
}

// ---- accuracy ----

TEST(AccuracyRewardTest, NoAnswerTagScoresZero) {
  EXPECT_EQ(AccuracyReward("5", "5"), 0.0f);
  EXPECT_EQ(AccuracyReward("<think>5</think>", "5"), 0.0f);
  EXPECT_EQ(AccuracyReward("<answer>5", "5"), 0.0f);
}

TEST(AccuracyRewardTest, SolutionAnswerTagIsExtracted) {
  EXPECT_EQ(AccuracyReward(Answer("5"), "<think>because</think><answer>5</answer>"), 1.0f);
  EXPECT_EQ(AccuracyReward(Answer("5"), "<answer> 5 </answer>"), 1.0f);
  EXPECT_EQ(AccuracyReward(Answer("5"), "<answer>6</answer> 5"), 0.0f);
  EXPECT_EQ(AccuracyReward(Answer("5"), "5"), 1.0f);           // no tag: the whole solution
  EXPECT_EQ(AccuracyReward("<answer>5</answer>", "5"), 1.0f);  // format is format's business
}

TEST(AccuracyRewardTest, EmptySolutionScoresZero) {
  EXPECT_EQ(AccuracyReward(Answer(""), ""), 0.0f);
  EXPECT_EQ(AccuracyReward(Answer("5"), ""), 0.0f);
  EXPECT_EQ(AccuracyReward(Answer(""), "<answer> </answer>"), 0.0f);
}

struct MatchCase {
  const char* answer;
  const char* reference;
  bool match;
};

void ExpectMatches(const std::vector<MatchCase>& cases) {
  for (const MatchCase& c : cases) {
    EXPECT_EQ(AnswersMatch(c.answer, c.reference), c.match)
        << "'" << c.answer << "' vs '" << c.reference << "'";
    EXPECT_EQ(AccuracyReward(Answer(c.answer), c.reference), c.match ? 1.0f : 0.0f)
        << "'" << c.answer << "' vs '" << c.reference << "'";
  }
}

TEST(AccuracyRewardTest, Numbers) {
  ExpectMatches({
      {"5", "5", true},
      {"5", "6", false},
      {"5.0", "5", true},
      {"05", "5", true},
      {"-3", "-3", true},
      {"-3", "3", false},
      {"+3", "3", true},
      {"0.5", ".5", true},
      {"0.5", "1/2", true},
      {"2/4", "1/2", true},
      {"-1/2", "-0.5", true},
      {"1/3", "0.333", false},
      {"0.3333333", "1/3", true},
      {"1,234", "1234", true},
      {"1,234,567.5", "1234567.5", true},
      {"12,34", "1234", false},  // not a thousands separator
      {"1, 2", "12", false},
      {"50%", "50", true},
      {"50%", "0.5", true},
      {"50 %", "50%", true},
      {"25%", "0.5", false},
      {"5 cm", "5", true},
      {"5 apples", "5", true},
      {"12 square units", "12", true},
      {"5厘米", "5", true},
      {"45°", "45", true},
      {"45^\\circ", "45°", true},
      {"45^{\\circ}", "45", true},
      {"$5", "5", true},
      {"-$5", "-5", true},
      {"x = 5", "5", true},
      {"5.", "5", true},
      {"5 + 3", "8", false},
      {"2x", "2", false},
      {"about 5", "5", false},
      {"1e3", "1000", false},
      {"1/0", "1/0", true},  // not numbers: equal as text
      {"−7", "-7", true},    // Unicode minus
  });
}

TEST(AccuracyRewardTest, Latex) {
  ExpectMatches({
      {"\\boxed{5}", "5", true},
      {"The answer is \\boxed{12}", "12", true},
      {"\\boxed{\\frac{1}{2}}", "0.5", true},
      {"\\frac{3}{4}", "3/4", true},
      {"\\dfrac{3}{4}", "0.75", true},
      {"\\frac{-6}{4}", "-1.5", true},
      {"-\\frac{1}{2}", "-0.5", true},
      {"\\frac{1}{0}", "0", false},
      {"$\\frac{1}{2}$", "1/2", true},
      {"\\(42\\)", "42", true},
      {"\\[42\\]", "42", true},
      {"$$42$$", "42", true},
      {"5\\text{ cm}", "5", true},
      {"5\\,\\mathrm{cm}", "5", true},
      {"\\text{blue}", "Blue", true},
      {"\\boxed{\\text{B}}", "B", true},
      {"\\boxed{x+1}", "x+1", true},
      {"\\boxed{x+1}", "1+x", false},             // no algebra
      {"\\boxed{7", "7", true},                   // cut off: what is there
      {"\\boxed{1} then \\boxed{2}", "2", true},  // the last box
      {"\\left(1, 2\\right)", "(1, 2)", true},
      {"50\\%", "50%", true},
  });
}

TEST(AccuracyRewardTest, MultipleChoice) {
  ExpectMatches({
      {"B", "B", true},          {"(B)", "B", true},
      {"B.", "B", true},         {"B)", "(B)", true},
      {"B:", "B", true},         {"Option B", "B", true},
      {"option (b)", "B", true}, {"Choice: C", "C", true},
      {"Answer: D", "D", true},  {"The answer is (A)", "A", true},
      {"(B) 30°", "B", true},    {"B. 30°", "(B) 30 degrees", true},
      {"B", "C", false},         {"(B)", "(C) 45", false},
      {"Option A", "B", false},  {"b", "B", true},  // as text
      {"B and C", "B", false},   {"Because", "B", false},
      {"\\boxed{C}", "C", true},
  });
}

TEST(AccuracyRewardTest, Text) {
  ExpectMatches({
      {"Blue", "blue", true},
      {"  blue  ", "blue", true},
      {"blue.", "blue", true},
      {"blue!?", "Blue", true},
      {"light   blue", "Light blue", true},
      {"light\nblue", "light blue", true},
      {"\"blue\"", "blue", true},
      {"blue", "red", false},
      {"blue sky", "blue", false},
      {"", "blue", false},
      {"Yes", "yes", true},
      {"no", "yes", false},
  });
}

TEST(NormalizeTextTest, CaseSpaceAndTrailingPunctuation) {
  EXPECT_EQ(NormalizeText("  The  CAT. "), "the cat");
  EXPECT_EQ(NormalizeText("'x';"), "x");
  EXPECT_EQ(NormalizeText("a\t\nb"), "a b");
  EXPECT_EQ(NormalizeText("..."), "");
}

TEST(ParseNumberTest, ValuesAndPercent) {
  std::optional<ParsedNumber> n = ParseNumber("12.5%");
  ASSERT_TRUE(n.has_value());
  EXPECT_DOUBLE_EQ(n->value, 12.5);
  EXPECT_TRUE(n->percent);
  n = ParseNumber(StripLatex("\\frac{1}{4}"));
  ASSERT_TRUE(n.has_value());
  EXPECT_DOUBLE_EQ(n->value, 0.25);
  EXPECT_FALSE(ParseNumber("").has_value());
  EXPECT_FALSE(ParseNumber("-").has_value());
  EXPECT_FALSE(ParseNumber("five").has_value());
  EXPECT_FALSE(ParseNumber("50% 3").has_value());
}

// ---- iou ----

TEST(ParseBoxTest, FirstFourNumbersOfABracketedList) {
  using Box = std::array<double, 4>;
  EXPECT_EQ(ParseBox("[10, 20, 30, 40]"), (Box{10, 20, 30, 40}));
  EXPECT_EQ(ParseBox("[10,20,30.5,40]"), (Box{10, 20, 30.5, 40}));
  EXPECT_EQ(ParseBox("box: [ 1 2 3 4 ]"), (Box{1, 2, 3, 4}));
  EXPECT_EQ(ParseBox("[1, 2, 3, 4, 5, 6]"), (Box{1, 2, 3, 4}));
  EXPECT_EQ(ParseBox("[[1, 2, 3, 4], [5, 6, 7, 8]]"), (Box{1, 2, 3, 4}));
  EXPECT_EQ(ParseBox("{\"bbox_2d\": [-1, 2, 3, 4], \"label\": \"cat\"}"), (Box{-1, 2, 3, 4}));
  EXPECT_EQ(ParseBox("[\"cat\"] then [1, 2, 3, 4]"), (Box{1, 2, 3, 4}));
  EXPECT_EQ(ParseBox("[1, 2] and [1, 2, 3, 4]"), (Box{1, 2, 3, 4}));
  EXPECT_EQ(ParseBox("[1, 2, 3]"), std::nullopt);
  EXPECT_EQ(ParseBox("(1, 2, 3, 4)"), std::nullopt);
  EXPECT_EQ(ParseBox("[1, 2, 3, 4"), std::nullopt);
  EXPECT_EQ(ParseBox(""), std::nullopt);
}

TEST(BoxIouTest, OverlapAndDegenerateBoxes) {
  EXPECT_DOUBLE_EQ(BoxIou({0, 0, 10, 10}, {0, 0, 10, 10}), 1.0);
  EXPECT_DOUBLE_EQ(BoxIou({0, 0, 10, 10}, {5, 0, 15, 10}), 50.0 / 150.0);
  EXPECT_DOUBLE_EQ(BoxIou({0, 0, 10, 10}, {2, 2, 4, 4}), 4.0 / 100.0);
  EXPECT_DOUBLE_EQ(BoxIou({0, 0, 10, 10}, {10, 0, 20, 10}), 0.0);  // touching
  EXPECT_DOUBLE_EQ(BoxIou({0, 0, 10, 10}, {20, 20, 30, 30}), 0.0);
  EXPECT_DOUBLE_EQ(BoxIou({0, 0, 0, 10}, {0, 0, 10, 10}), 0.0);   // zero width
  EXPECT_DOUBLE_EQ(BoxIou({10, 0, 0, 10}, {0, 0, 10, 10}), 0.0);  // x2 < x1
  EXPECT_DOUBLE_EQ(BoxIou({0, 0, 10, 10}, {0, 10, 10, 5}), 0.0);  // y2 < y1
  const double nan = std::nan("");
  EXPECT_DOUBLE_EQ(BoxIou({0, 0, nan, 10}, {0, 0, 10, 10}), 0.0);
}

TEST(IouRewardTest, AnswerBoxAgainstSolutionBox) {
  EXPECT_FLOAT_EQ(IouReward(Answer("[0, 0, 10, 10]"), "[0, 0, 10, 10]"), 1.0f);
  EXPECT_FLOAT_EQ(IouReward(Answer("the cat: [5,0,15,10]"), "<answer>[0,0,10,10]</answer>"),
                  50.0f / 150.0f);
  EXPECT_FLOAT_EQ(
      IouReward(Answer("{\"bbox_2d\": [0, 0, 10, 10], \"label\": \"dog\"}"), "[[0, 0, 10, 10]]"),
      1.0f);
  // A box outside the answer tag does not count; no tag at all scores 0.
  EXPECT_EQ(IouReward("[0, 0, 10, 10] <answer>none</answer>", "[0, 0, 10, 10]"), 0.0f);
  EXPECT_EQ(IouReward("[0, 0, 10, 10]", "[0, 0, 10, 10]"), 0.0f);
  // Missing or degenerate on either side.
  EXPECT_EQ(IouReward(Answer("[0, 0, 10, 10]"), "no box"), 0.0f);
  EXPECT_EQ(IouReward(Answer("[0, 0, 10, 10]"), ""), 0.0f);
  EXPECT_EQ(IouReward(Answer("[0, 0, 10]"), "[0, 0, 10, 10]"), 0.0f);
  EXPECT_EQ(IouReward(Answer("[5, 5, 5, 5]"), "[5, 5, 5, 5]"), 0.0f);
}

TEST(RuleRewardsTest, LongCompletionsAreCheap) {
  // No regex backtracking: a long completion with many closing tags is linear-ish.
  std::string long_text = "<think>";
  for (int i = 0; i < 20000; ++i) long_text += "</think> x ";
  long_text += "</think><answer>7</answer>";
  EXPECT_EQ(FormatReward(long_text, ""), 1.0f);
  EXPECT_EQ(AccuracyReward(long_text, "7"), 1.0f);
}

}  // namespace
}  // namespace trainctl::rewards
