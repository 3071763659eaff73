// Each input format becomes the chat messages it means.
#include "common/data/record_parser.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainctl::data {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using tokenizer::ChatMessage;
using tokenizer::ChatPart;

// "user: [img] text" style rendering, for compact expectations.
std::string Show(const std::vector<ChatMessage>& messages) {
  std::string out;
  for (const ChatMessage& m : messages) {
    out += m.role + ":";
    for (const ChatPart& p : m.content) {
      out += p.kind == ChatPart::Kind::kImage ? std::string("[img]") : "{" + p.text + "}";
    }
    out += "\n";
  }
  return out;
}

ParsedRecord Parse(const std::string& line) {
  auto record = ParseRecord(line);
  EXPECT_TRUE(record.ok()) << record.status();
  return record.ok() ? *record : ParsedRecord{};
}

TEST(RecordParserTest, OpenR1) {
  const ParsedRecord r =
      Parse(R"({"image": "img/a.png", "problem": "How many?", "solution": "<answer>2</answer>"})");
  EXPECT_EQ(r.format, RecordFormat::kOpenR1);
  EXPECT_THAT(r.images, ElementsAre("img/a.png"));
  EXPECT_EQ(Show(r.messages), "user:[img]{How many?}\nassistant:{<answer>2</answer>}\n");
  EXPECT_EQ(r.messages[0].content[0].image_tokens, 0);
}

TEST(RecordParserTest, OpenR1WithoutImageOrWithSeveral) {
  EXPECT_EQ(Show(Parse(R"({"problem": "1+1?", "solution": 2})").messages),
            "user:{1+1?}\nassistant:{2}\n");
  const ParsedRecord r = Parse(R"({"image": ["a.png", "b.png"], "problem": "Same?",
                                   "solution": "yes"})");
  EXPECT_THAT(r.images, ElementsAre("a.png", "b.png"));
  EXPECT_EQ(Show(r.messages), "user:[img][img]{Same?}\nassistant:{yes}\n");
}

TEST(RecordParserTest, VlmR1WithImageMarks) {
  const ParsedRecord r = Parse(
      R"({"id": 1, "image": "coco/1.jpg", "conversations": [
          {"from": "human", "value": "<image>What number of balls are there?"},
          {"from": "gpt", "value": "3"}]})");
  EXPECT_EQ(r.format, RecordFormat::kVlmR1);
  EXPECT_THAT(r.images, ElementsAre("coco/1.jpg"));
  EXPECT_EQ(Show(r.messages), "user:[img]{What number of balls are there?}\nassistant:{3}\n");
}

TEST(RecordParserTest, VlmR1MultiImageAndMultiTurn) {
  const ParsedRecord r = Parse(
      R"({"image": ["a.png", "b.png"], "conversations": [
          {"from": "system", "value": "Be brief."},
          {"from": "human", "value": "Left <image> right <image>. Same?"},
          {"from": "gpt", "value": "No."},
          {"from": "human", "value": "Sure?"},
          {"from": "gpt", "value": 1.5}]})");
  EXPECT_EQ(Show(r.messages),
            "system:{Be brief.}\nuser:{Left }[img]{ right }[img]{. Same?}\nassistant:{No.}\n"
            "user:{Sure?}\nassistant:{1.5}\n");
}

TEST(RecordParserTest, VlmR1WithoutMarksPutsImagesFirst) {
  const ParsedRecord r = Parse(R"({"image": "a.png", "conversations": [
      {"from": "human", "value": "What is it?"}, {"from": "gpt", "value": "A cat."}]})");
  EXPECT_EQ(Show(r.messages), "user:[img]{What is it?}\nassistant:{A cat.}\n");
}

TEST(RecordParserTest, MessagesWithStringContent) {
  const ParsedRecord r = Parse(R"({"messages": [
      {"role": "user", "content": "<image>Describe."},
      {"role": "assistant", "content": "A red square."}], "images": ["x.png"]})");
  EXPECT_EQ(r.format, RecordFormat::kMessages);
  EXPECT_THAT(r.images, ElementsAre("x.png"));
  EXPECT_EQ(Show(r.messages), "user:[img]{Describe.}\nassistant:{A red square.}\n");
}

TEST(RecordParserTest, MessagesWithTypedParts) {
  const ParsedRecord r = Parse(R"({"messages": [
      {"role": "system", "content": [{"type": "text", "text": "You see."}]},
      {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "and"},
                                   {"type": "image", "image": "inline.png"}, {"type": "image"}]},
      {"role": "assistant", "content": [{"type": "text", "text": "Three."}]}],
      "images": ["first.png", "third.png"]})");
  EXPECT_THAT(r.images, ElementsAre("first.png", "inline.png", "third.png"));
  EXPECT_EQ(Show(r.messages), "system:{You see.}\nuser:[img]{and}[img][img]\nassistant:{Three.}\n");
}

TEST(RecordParserTest, SolutionIsTheSolutionFieldInAnyFormat) {
  EXPECT_EQ(Parse(R"({"problem": "p", "solution": "<answer>2</answer>"})").solution,
            "<answer>2</answer>");
  EXPECT_EQ(Parse(R"({"problem": "p", "solution": 42})").solution, "42");
  // VLM-R1 REC: a conversation plus a box as the solution.
  EXPECT_EQ(Parse(R"({"image": "a.png", "solution": [10, 20.5, 30, 40],
                      "conversations": [{"from": "human", "value": "<image>Where?"},
                                        {"from": "gpt", "value": "<answer>[1,2,3,4]</answer>"}]})")
                .solution,
            "[10,20.5,30,40]");
  EXPECT_EQ(Parse(R"({"messages": [{"role": "user", "content": "q"},
                                   {"role": "assistant", "content": "long"}],
                      "solution": {"box": [1, 2]}})")
                .solution,
            R"({"box":[1,2]})");
}

TEST(RecordParserTest, SolutionIsElseTheLastAssistantTurnsText) {
  EXPECT_EQ(Parse(R"({"conversations": [{"from": "human", "value": "a"},
                                        {"from": "gpt", "value": "first"},
                                        {"from": "human", "value": "b"},
                                        {"from": "gpt", "value": "<answer>B</answer>"}]})")
                .solution,
            "<answer>B</answer>");
  EXPECT_EQ(Parse(R"({"messages": [{"role": "user", "content": "q"},
                                   {"role": "assistant", "content": [
                                     {"type": "text", "text": "see "}, {"type": "image"},
                                     {"type": "text", "text": "this"}]},
                                   {"role": "user", "content": "thanks"}],
                      "images": ["x.png"], "solution": null})")
                .solution,
            "see this");
}

TEST(RecordParserTest, BadRecordsSayWhatIsWrong) {
  auto message = [](const std::string& line) {
    return std::string(ParseRecord(line).status().message());
  };
  EXPECT_THAT(message("{not json"), HasSubstr("not valid JSON"));
  EXPECT_THAT(message("[1, 2]"), HasSubstr("JSON object"));
  EXPECT_THAT(message(R"({"question": "?"})"), HasSubstr("unrecognised record"));
  EXPECT_THAT(message(R"({"problem": "?", "solution": {"a": 1}})"), HasSubstr("'solution'"));
  EXPECT_THAT(message(R"({"image": ["a.png"], "conversations": [
                  {"from": "human", "value": "<image><image>?"}, {"from": "gpt", "value": "x"}]})"),
              HasSubstr("2 <image> mark(s) but the record lists 1"));
  EXPECT_THAT(message(R"({"conversations": [{"from": "robot", "value": "hi"},
                                            {"from": "gpt", "value": "x"}]})"),
              HasSubstr("role 'robot'"));
  EXPECT_THAT(message(R"({"conversations": [{"from": "human", "value": "hi"}]})"),
              HasSubstr("no assistant turn"));
  EXPECT_THAT(message(R"({"messages": [{"role": "user", "content": [{"type": "image"}]},
                                       {"role": "assistant", "content": "x"}]})"),
              HasSubstr("1 image part(s) without a path but 'images' lists 0"));
  EXPECT_THAT(message(R"({"messages": [{"role": "user", "content": [{"type": "audio"}]},
                                       {"role": "assistant", "content": "x"}]})"),
              HasSubstr("type 'audio'"));
  EXPECT_THAT(message(R"({"messages": [{"role": "user"}]})"), HasSubstr("'role' and 'content'"));
}

}  // namespace
}  // namespace trainctl::data
