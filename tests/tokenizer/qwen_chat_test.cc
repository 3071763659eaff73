// The chat template and label mask on the real Qwen tokenizer.
#include "common/tokenizer/chat_template.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/tokenizer/qwen_fixture.h"

namespace trainctl::tokenizer {
namespace {

constexpr int32_t kImStart = 151644, kImEnd = 151645, kVisionStart = 151652, kVisionEnd = 151653,
                  kImagePad = 151655, kSystem = 8948, kUser = 872, kAssistant = 77091,
                  kNewline = 198;

TEST(QwenChatTest, TrainingExampleOfAnImageQuestion) {
  ASSERT_TRUE(testing::QwenFixturePresent());
  auto tokenizer = BpeTokenizer::Load(testing::QwenTokenizerDir());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::vector<ChatMessage> messages = {
      {"user", {ChatPart::Image(4), ChatPart::Text("Which shape is red?")}},
      {"assistant", {ChatPart::Text("The circle.")}}};
  auto example = BuildTrainingExample(messages, **tokenizer);
  ASSERT_TRUE(example.ok()) << example.status();
  const std::vector<int32_t>& ids = example->input_ids;
  EXPECT_EQ(ids, (*tokenizer)->Encode(RenderChat(messages)->text).value());
  ASSERT_GE(ids.size(), 16u);
  EXPECT_THAT(std::vector<int32_t>(ids.begin(), ids.begin() + 3),
              ::testing::ElementsAre(kImStart, kSystem, kNewline));
  const auto user = std::find(ids.begin() + 1, ids.end(), kImStart);
  ASSERT_NE(user, ids.end());
  EXPECT_THAT(std::vector<int32_t>(user, user + 9),
              ::testing::ElementsAre(kImStart, kUser, kNewline, kVisionStart, kImagePad, kImagePad,
                                     kImagePad, kImagePad, kVisionEnd));
  std::vector<int32_t> trained;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (example->labels[i] != kIgnoreLabel) trained.push_back(ids[i]);
  }
  EXPECT_EQ((*tokenizer)->Decode(trained).value(), "The circle.<|im_end|>");
  EXPECT_EQ(ids[ids.size() - 1], kNewline);
  EXPECT_EQ(ids[ids.size() - 2], kImEnd);
  const auto assistant = std::find(ids.begin(), ids.end(), kAssistant);
  ASSERT_NE(assistant, ids.end());
  EXPECT_EQ(example->labels[assistant - ids.begin()], kIgnoreLabel);
}

}  // namespace
}  // namespace trainctl::tokenizer
