#include "common/tokenizer/bpe_tokenizer.h"

#include <thread>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"
#include "tests/tokenizer/tiny_tokenizer.h"

namespace trainctl::tokenizer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::TinyTokenizerJson;

std::unique_ptr<BpeTokenizer> Tiny() {
  auto tokenizer = BpeTokenizer::FromJson(TinyTokenizerJson().dump(), "tiny.json");
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return std::move(*tokenizer);
}

int32_t Id(const BpeTokenizer& t, const std::string& raw_bytes) {
  auto id = t.TokenToId(testing::Symbols(raw_bytes));
  EXPECT_TRUE(id.has_value()) << raw_bytes;
  return id.value_or(-1);
}

std::vector<int32_t> Encode(const BpeTokenizer& t, const std::string& text) {
  auto ids = t.Encode(text);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

std::string Decode(const BpeTokenizer& t, const std::vector<int32_t>& ids, bool skip = false) {
  auto text = t.Decode(ids, skip);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.value_or("<error>");
}

TEST(BpeTokenizerTest, MergesWholeWordsAndKeepsTheSpaceWithTheNextWord) {
  auto t = Tiny();
  EXPECT_THAT(Encode(*t, "hello world"), ElementsAre(Id(*t, "hello"), Id(*t, " world")));
  EXPECT_THAT(Encode(*t, "hell"), ElementsAre(Id(*t, "hell")));
  EXPECT_THAT(Encode(*t, "help"), ElementsAre(Id(*t, "he"), 'l', 'p'));
}

TEST(BpeTokenizerTest, LowestRankMergesFirstAndLeftmostAmongEqualRanks) {
  auto t = Tiny();
  // (b, c) ranks before (a, b), so "abc" is a + bc, not ab + c.
  EXPECT_THAT(Encode(*t, "abc"), ElementsAre('a', Id(*t, "bc")));
  EXPECT_THAT(Encode(*t, "aaa"), ElementsAre(Id(*t, "aa"), 'a'));
  EXPECT_THAT(Encode(*t, "aaaa"), ElementsAre(Id(*t, "aa"), Id(*t, "aa")));
}

TEST(BpeTokenizerTest, MultiByteCharactersMergeFromTheirBytes) {
  auto t = Tiny();
  EXPECT_THAT(Encode(*t, "한"), ElementsAre(Id(*t, "한")));
  EXPECT_THAT(Encode(*t, "한국"), ElementsAre(Id(*t, "한"), 0xEA, 0xB5, 0xAD));
}

TEST(BpeTokenizerTest, EmojiWithoutAVocabularyEntryFallsBackToItsBytes) {
  auto t = Tiny();
  EXPECT_THAT(Encode(*t, "😀"), ElementsAre(0xF0, 0x9F, 0x98, 0x80));
  EXPECT_EQ(Decode(*t, {0xF0, 0x9F, 0x98, 0x80}), "😀");
}

TEST(BpeTokenizerTest, DecodeOfEncodeGivesTheTextBack) {
  auto t = Tiny();
  for (const std::string& text : std::vector<std::string>{
           "hello world", "", " ", "a  b\t\tc\n\n\nd\r\n", "한국어 토크나이저", "你好，世界！",
           "👨‍👩‍👧‍👦 🇰🇷 1️⃣", "<|im_start|>user\nhi<|im_end|>\n",
           "x<think>y</think>", "1234567890", "it's 'LL 'Ve", std::string("nul\0byte", 8),
           "\u0085\u00a0\u3000\u2028"}) {
    EXPECT_EQ(Decode(*t, Encode(*t, text)), text);
  }
}

TEST(BpeTokenizerTest, AddedTokensAreCutOutBeforeSplittingLongestFirst) {
  auto t = Tiny();
  using testing::kA;
  using testing::kAB;
  EXPECT_THAT(Encode(*t, "a<|im_start|>b"), ElementsAre('a', testing::kImStart, 'b'));
  EXPECT_THAT(Encode(*t, "<|im_start|><|im_end|>"),
              ElementsAre(testing::kImStart, testing::kImEnd));
  EXPECT_THAT(Encode(*t, "<a><b>"), ElementsAre(kAB));
  EXPECT_THAT(Encode(*t, "<a><c>"), ElementsAre(kA, '<', 'c', '>'));
  EXPECT_THAT(Encode(*t, "<|im_start"),
              ElementsAre('<', '|', 'i', 'm', '_', 's', 't', 'a', 'r', 't'));
}

TEST(BpeTokenizerTest, LstripAndRstripSwallowTheWhitespaceAround) {
  auto t = Tiny();
  EXPECT_THAT(Encode(*t, "a  <mask>\t b"), ElementsAre('a', testing::kMask, 'b'));
  // <think> has neither flag: the space before it stays text.
  EXPECT_THAT(Encode(*t, "a <think> b"), ElementsAre('a', ' ', testing::kThink, ' ', 'b'));
}

TEST(BpeTokenizerTest, SingleWordTokensMatchOnlyBetweenNonWordCharacters) {
  auto t = Tiny();
  EXPECT_THAT(Encode(*t, "x [W] y"), ElementsAre('x', ' ', testing::kSingleWord, ' ', 'y'));
  EXPECT_THAT(Encode(*t, "x[W]"), ElementsAre('x', '[', 'W', ']'));
}

TEST(BpeTokenizerTest, NormalizesToNfcAndMatchesNormalizedAddedTokensAfterwards) {
  auto t = Tiny();
  EXPECT_EQ(Encode(*t, "e\u0301"), Encode(*t, "\u00e9"));
  EXPECT_THAT(Encode(*t, "cafe\u0301"), ElementsAre(testing::kCafe));
  EXPECT_EQ(t->Normalize("A\u030a"), "\u00c5");
}

TEST(BpeTokenizerTest, SpansPointIntoTheInput) {
  auto t = Tiny();
  auto encoding = t->EncodeWithSpans("hello world<|im_end|>😀");
  ASSERT_TRUE(encoding.ok()) << encoding.status();
  using Span = std::pair<size_t, size_t>;
  EXPECT_THAT(encoding->spans, ElementsAre(Span{0, 5}, Span{5, 11}, Span{11, 21}, Span{21, 22},
                                           Span{22, 23}, Span{23, 24}, Span{24, 25}));
  // Text that NFC changed maps every token to the whole run it came from.
  encoding = t->EncodeWithSpans("<|im_end|>e\u0301!");
  ASSERT_TRUE(encoding.ok()) << encoding.status();
  EXPECT_THAT(encoding->spans, ElementsAre(Span{0, 10}, Span{10, 14}, Span{10, 14}, Span{10, 14}));
}

TEST(BpeTokenizerTest, DecodeSkipsOnlySpecialTokensWhenAsked) {
  auto t = Tiny();
  const std::vector<int32_t> ids = {testing::kImStart, Id(*t, "hello"), testing::kThink,
                                    testing::kImEnd};
  EXPECT_EQ(Decode(*t, ids), "<|im_start|>hello<think><|im_end|>");
  EXPECT_EQ(Decode(*t, ids, /*skip=*/true), "hello<think>");
}

TEST(BpeTokenizerTest, DecodeReplacesBrokenUtf8AsBrowsersDo) {
  auto t = Tiny();
  EXPECT_EQ(Decode(*t, {0xF0, 0x9F}), "\uFFFD");
  EXPECT_EQ(Decode(*t, {0xF0, 0x9F, 'a', 0xFF}), "\uFFFDa\uFFFD");
  // Added tokens end a run of bytes: its broken tail is replaced before the token.
  EXPECT_EQ(Decode(*t, {0xED, testing::kImEnd, 0x95, 0x9C}), "\uFFFD<|im_end|>\uFFFD\uFFFD");
}

TEST(BpeTokenizerTest, RejectsIdsOutsideTheVocabularyAndTextThatIsNotUtf8) {
  auto t = Tiny();
  EXPECT_EQ(t->vocab_size(), testing::kCafe + 1);
  for (int32_t id : {-1, 999, t->vocab_size()}) {
    auto text = t->Decode({id});
    EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument) << id;
    EXPECT_THAT(text.status().message(), HasSubstr(std::to_string(id)));
  }
  auto ids = t->Encode("ok \xC3\x28");
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ids.status().message(), HasSubstr("byte 3"));
}

// Text a model generated: ids of embedding rows the tokenizer lacks are left out, as HF tokenizers'
// decode does (@huggingface/tokenizers decodes [9707, 151922, 1879] of Qwen's tokenizer to
// "Hello world"); everything else decodes as without the flag.
TEST(BpeTokenizerTest, DecodeOfGeneratedIdsDropsIdsOutsideTheVocabulary) {
  auto t = Tiny();
  const std::vector<int32_t> ids = Encode(*t, "ok");
  std::vector<int32_t> with_unknown = {t->vocab_size() + 5};
  with_unknown.insert(with_unknown.end(), ids.begin(), ids.end());
  with_unknown.push_back(-1);
  with_unknown.push_back(999);
  auto text = t->Decode(with_unknown, /*skip_special_tokens=*/false, /*drop_unknown_ids=*/true);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "ok");
  EXPECT_EQ(t->Decode(with_unknown).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BpeTokenizerTest, TokenToIdKnowsVocabularyAndAddedTokens) {
  auto t = Tiny();
  EXPECT_EQ(t->TokenToId("<|image_pad|>"), testing::kImagePad);
  EXPECT_EQ(t->TokenToId(testing::Symbols(" world")), Id(*t, " world"));
  EXPECT_EQ(t->TokenToId("nope"), std::nullopt);
}

TEST(BpeTokenizerTest, ConcurrentEncodesAgree) {
  auto t = Tiny();
  const std::string text = "hello world 한국어 <|im_start|>abc aaa 😀\n\n";
  const std::vector<int32_t> expected = Encode(*t, text);
  std::vector<std::thread> threads;
  std::vector<bool> same(4, false);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      bool ok = true;
      for (int n = 0; n < 200; ++n) ok = ok && t->Encode(text).value() == expected;
      same[i] = ok;
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_THAT(same, ::testing::Each(true));
}

// Load errors name the file and what is wrong with it.
class TokenizerLoadTest : public ::testing::Test {
 protected:
  absl::Status LoadWith(const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json json = TinyTokenizerJson();
    edit(json);
    return BpeTokenizer::Load(dir_.Write("broken/tokenizer.json", json.dump())).status();
  }

  trainctl::testing::TempDir dir_;
};

TEST_F(TokenizerLoadTest, LoadsAFileOrTheDirectoryHoldingIt) {
  const std::string file = dir_.Write("tiny/tokenizer.json", TinyTokenizerJson().dump());
  EXPECT_TRUE(BpeTokenizer::Load(file).ok());
  EXPECT_TRUE(BpeTokenizer::Load(dir_.path() + "/tiny").ok());
}

TEST_F(TokenizerLoadTest, MissingFileIsNotFound) {
  auto t = BpeTokenizer::Load(dir_.path() + "/nowhere/tokenizer.json");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(t.status().message(), HasSubstr("nowhere/tokenizer.json"));
}

TEST_F(TokenizerLoadTest, NotJson) {
  auto t = BpeTokenizer::Load(dir_.Write("bad/tokenizer.json", "{\"model\": [1, 2"));
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), HasSubstr("bad/tokenizer.json: not valid JSON"));
}

// A number that overflows a double throws out_of_range from the JSON parser, not parse_error:
// once uncaught (found by tokenizer_fuzz).
TEST_F(TokenizerLoadTest, NumberOverflowIsNotValidJson) {
  auto t =
      BpeTokenizer::Load(dir_.Write("big/tokenizer.json", "{\"added_tokens\": [{\"id\": 1e400}]}"));
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), HasSubstr("big/tokenizer.json: not valid JSON"));
  EXPECT_THAT(t.status().message(), HasSubstr("number overflow parsing '1e400'"));
}

TEST_F(TokenizerLoadTest, EachBrokenFieldIsNamed) {
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> cases = {
      {[](auto& j) {
         j["normalizer"] = {{"type", "Lowercase"}};
       },
       "normalizer: unsupported type 'Lowercase'"},
      {[](auto& j) { j["model"]["type"] = "WordPiece"; }, "model.type: 'WordPiece'"},
      {[](auto& j) { j["model"]["dropout"] = 0.1; }, "model.dropout"},
      {[](auto& j) { j["model"]["byte_fallback"] = true; }, "model.byte_fallback"},
      {[](auto& j) { j["model"]["vocab"] = 3; }, "model.vocab: must be an object"},
      {[](auto& j) { j["model"]["vocab"]["x"] = "seven"; }, "model.vocab['x']: id must be"},
      {[](auto& j) { j["model"]["merges"][2] = "one-part"; }, "model.merges[2]: expected"},
      {[](auto& j) {
         j["model"]["merges"][0] = {"h", "zzz"};
       },
       "model.merges[0] ('h zzz'): token 'zzz'"},
      {[](auto& j) { j["model"]["vocab"].erase(testing::Symbols(" ")); },
       "lacks 'Ġ', the byte-level symbol of byte 0x20"},
      {[](auto& j) { j["added_tokens"][3].erase("content"); }, "added_tokens[3]: needs"},
      // A stray id in the billions would size the id table in gigabytes (found by tokenizer_fuzz).
      {[](auto& j) { j["added_tokens"][1]["id"] = 866666666; },
       "added_tokens[1].id: id 866666666 is far past the"},
      {[](auto& j) { j["model"]["vocab"]["x"] = 2000000000; },
       "model.vocab['x']: id 2000000000 is far past the"},
      {[](auto& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed"; },
       "split regex does not compile"},
      {[](auto& j) {
         j["pre_tokenizer"] = {{"type", "Whitespace"}};
       },
       "pre_tokenizer: supported"},
      {[](auto& j) { j["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true; },
       "pre_tokenizer.pretokenizers[1]: add_prefix_space"},
      {[](auto& j) {
         j["decoder"] = {{"type", "WordPiece"}};
       },
       "decoder: unsupported type 'WordPiece'"},
  };
  for (const auto& [edit, message] : cases) {
    const absl::Status status = LoadWith(edit);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_THAT(status.message(), HasSubstr("broken/tokenizer.json: ")) << message;
    EXPECT_THAT(status.message(), HasSubstr(message));
  }
}

TEST_F(TokenizerLoadTest, AcceptsOlderMergeStringsAndGpt2ByteLevelPreTokenizer) {
  EXPECT_TRUE(LoadWith([](auto& j) {
                for (auto& m : j["model"]["merges"])
                  m = m[0].template get<std::string>() + " " + m[1].template get<std::string>();
                j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}};
                j["normalizer"] = nullptr;
              }).ok());
}

}  // namespace
}  // namespace trainctl::tokenizer
