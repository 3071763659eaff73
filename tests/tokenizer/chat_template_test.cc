#include "common/tokenizer/chat_template.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/tokenizer/tiny_tokenizer.h"

namespace trainctl::tokenizer {
namespace {

using ::testing::HasSubstr;

ChatMessage Msg(std::string role, std::vector<ChatPart> parts) {
  return {std::move(role), std::move(parts)};
}
ChatMessage Msg(std::string role, std::string text) {
  return {std::move(role), {ChatPart::Text(std::move(text))}};
}

std::string Render(const std::vector<ChatMessage>& messages, bool generation_prompt = false) {
  ChatTemplateOptions options;
  options.add_generation_prompt = generation_prompt;
  auto rendered = RenderChat(messages, options);
  EXPECT_TRUE(rendered.ok()) << rendered.status();
  return rendered.ok() ? rendered->text : "";
}

TEST(ChatTemplateTest, AddsTheDefaultSystemPromptWhenTheFirstTurnIsNotSystem) {
  EXPECT_EQ(Render({Msg("user", "Hi"), Msg("assistant", "Hello!")}),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n");
}

TEST(ChatTemplateTest, KeepsAGivenSystemPrompt) {
  EXPECT_EQ(Render({Msg("system", "Be brief."), Msg("user", "Hi")}, /*generation_prompt=*/true),
            "<|im_start|>system\nBe brief.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, ImagesBecomeOnePadPerMergedPatchBetweenVisionMarkers) {
  EXPECT_EQ(
      Render({Msg("system", "S"), Msg("user", {ChatPart::Image(3), ChatPart::Text("What is it?"),
                                               ChatPart::Image(1)})}),
      "<|im_start|>system\nS<|im_end|>\n"
      "<|im_start|>user\n<|vision_start|><|image_pad|><|image_pad|><|image_pad|><|vision_end|>"
      "What is it?<|vision_start|><|image_pad|><|vision_end|><|im_end|>\n");
}

TEST(ChatTemplateTest, NoMessagesRenderNothingButTheGenerationPrompt) {
  EXPECT_EQ(Render({}), "");
  EXPECT_EQ(Render({}, /*generation_prompt=*/true), "<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, AssistantSpansCoverContentAndClosingImEnd) {
  auto rendered = RenderChat(
      {Msg("user", "Q"), Msg("assistant", "A1"), Msg("user", "Q2"), Msg("assistant", "")});
  ASSERT_TRUE(rendered.ok());
  ASSERT_EQ(rendered->assistant_spans.size(), 2u);
  const auto& [b0, e0] = rendered->assistant_spans[0];
  const auto& [b1, e1] = rendered->assistant_spans[1];
  EXPECT_EQ(rendered->text.substr(b0, e0 - b0), "A1<|im_end|>");
  EXPECT_EQ(rendered->text.substr(b1, e1 - b1), "<|im_end|>");
}

TEST(ChatTemplateTest, RejectsUnknownRolesAndEmptyImages) {
  auto rendered = RenderChat({Msg("user", "x"), Msg("tool", "y")});
  EXPECT_EQ(rendered.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(rendered.status().message(), HasSubstr("messages[1]: role 'tool'"));
  rendered = RenderChat({Msg("user", {ChatPart::Text("x"), ChatPart::Image(0)})});
  EXPECT_THAT(rendered.status().message(), HasSubstr("messages[0].content[1]: an image needs"));
}

class TrainingExampleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tokenizer = BpeTokenizer::FromJson(testing::TinyTokenizerJson().dump(), "tiny.json");
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = std::move(*tokenizer);
  }

  // The text of the labelled tokens, one string per contiguous run.
  std::vector<std::string> LabelledRuns(const TrainingExample& example) {
    std::vector<std::string> runs;
    std::vector<int32_t> run;
    for (size_t i = 0; i <= example.labels.size(); ++i) {
      if (i < example.labels.size() && example.labels[i] != kIgnoreLabel) {
        EXPECT_EQ(example.labels[i], example.input_ids[i]);
        run.push_back(example.labels[i]);
      } else if (!run.empty()) {
        runs.push_back(tokenizer_->Decode(run).value());
        run.clear();
      }
    }
    return runs;
  }

  std::unique_ptr<BpeTokenizer> tokenizer_;
};

TEST_F(TrainingExampleTest, TrainsOnAssistantRepliesAndTheirImEndOnly) {
  const std::vector<ChatMessage> messages = {
      Msg("user", {ChatPart::Image(4), ChatPart::Text("hello?")}), Msg("assistant", "hello world"),
      Msg("user", "and?"), Msg("assistant", "aaa\n\nabc")};
  auto example = BuildTrainingExample(messages, *tokenizer_);
  ASSERT_TRUE(example.ok()) << example.status();
  EXPECT_EQ(example->input_ids, tokenizer_->Encode(RenderChat(messages)->text).value());
  EXPECT_EQ(example->labels.size(), example->input_ids.size());
  EXPECT_THAT(LabelledRuns(*example),
              ::testing::ElementsAre("hello world<|im_end|>", "aaa\n\nabc<|im_end|>"));
  EXPECT_EQ(std::count(example->input_ids.begin(), example->input_ids.end(), testing::kImagePad),
            4);
}

TEST_F(TrainingExampleTest, UsesNormalizedTextSoLabelsStayExact) {
  auto example =
      BuildTrainingExample({Msg("user", "q"), Msg("assistant", "cafe\u0301 e\u0301")}, *tokenizer_);
  ASSERT_TRUE(example.ok()) << example.status();
  EXPECT_THAT(LabelledRuns(*example), ::testing::ElementsAre("caf\u00e9 \u00e9<|im_end|>"));
}

TEST_F(TrainingExampleTest, NeedsAnAssistantTurnAndTheTemplateTokens) {
  auto example = BuildTrainingExample({Msg("user", "q")}, *tokenizer_);
  EXPECT_EQ(example.status().code(), absl::StatusCode::kInvalidArgument);
  nlohmann::json json = testing::TinyTokenizerJson();
  json["added_tokens"].erase(0);  // <|im_start|>
  auto bare = BpeTokenizer::FromJson(json.dump(), "bare.json");
  ASSERT_TRUE(bare.ok()) << bare.status();
  example = BuildTrainingExample({Msg("user", "q"), Msg("assistant", "a")}, **bare);
  EXPECT_EQ(example.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(example.status().message(), HasSubstr("<|im_start|>"));
}

}  // namespace
}  // namespace trainctl::tokenizer
