// Parity with Hugging Face's tokenizers on the real Qwen tokenizer: every line of
// parity_corpus.txt (a JSON string per line) must encode to the same ids as @huggingface/tokenizers
// (npm, pure JS) gives, and those ids must decode to the same text.
#include <chrono>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/tokenizer/qwen_fixture.h"

namespace trainctl::tokenizer {
namespace {

using testing::kSetupHint;

const std::string kCorpus = TRAINCTL_SOURCE_DIR "/tests/tokenizer/parity_corpus.txt";
const std::string kReferenceScript = TRAINCTL_SOURCE_DIR "/tests/tokenizer/hf_tokenize.cjs";

struct Reference {
  std::vector<int32_t> ids;
  std::string text;
};

std::vector<std::string> ReadCorpus() {
  std::ifstream in(kCorpus);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line).get<std::string>());
  }
  return lines;
}

// Runs the npm reference over the corpus; fails the test (with the hint) if it cannot.
std::vector<Reference> RunReference() {
  const std::string node = TRAINCTL_NODE_BIN;
  EXPECT_FALSE(node.empty()) << "node was not found when CMake configured; " << kSetupHint;
  if (node.empty()) return {};
  const trainctl::testing::RunResult run = trainctl::testing::Run(
      {node, kReferenceScript, testing::NodeModulesDir(), testing::QwenTokenizerDir(), kCorpus}, {},
      absl::Seconds(240));
  EXPECT_EQ(run.exit_code, 0) << run.err << "\n" << kSetupHint;
  std::cout << run.err;  // its timing line
  std::vector<Reference> out;
  std::istringstream lines(run.out);
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    out.push_back({j["ids"].get<std::vector<int32_t>>(), j["text"].get<std::string>()});
  }
  return out;
}

std::string Quoted(const std::string& text) { return nlohmann::json(text).dump(); }

// "id(text)" for each id, so a mismatch shows which pieces differ.
std::string Describe(const BpeTokenizer& tokenizer, const std::vector<int32_t>& ids) {
  std::vector<std::string> parts;
  for (const int32_t id : ids) {
    auto text = tokenizer.Decode({id});
    parts.push_back(absl::StrCat(id, Quoted(text.ok() ? *text : "?")));
  }
  return absl::StrJoin(parts, " ");
}

TEST(TokenizerParityTest, EveryCorpusLineEncodesAndDecodesAsHuggingFaceTokenizersJs) {
  ASSERT_TRUE(testing::QwenFixturePresent());
  const std::vector<std::string> corpus = ReadCorpus();
  ASSERT_GE(corpus.size(), 500u) << kCorpus;
  const std::vector<Reference> reference = RunReference();
  ASSERT_EQ(reference.size(), corpus.size()) << "the reference printed a different number of lines";
  auto tokenizer = BpeTokenizer::Load(testing::QwenTokenizerDir());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();

  const auto start = std::chrono::steady_clock::now();
  std::vector<std::vector<int32_t>> ours;
  size_t bytes = 0;
  for (const std::string& text : corpus) {
    ours.push_back((*tokenizer)->Encode(text).value());
    bytes += text.size();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "trainctl: " << corpus.size() << " lines, " << bytes << " bytes encoded in "
            << seconds << " s (" << bytes / seconds / 1e6 << " MB/s, cold cache)\n";

  size_t identical = 0;
  int reported = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    const std::string decoded = (*tokenizer)->Decode(ours[i]).value();
    if (ours[i] == reference[i].ids && decoded == reference[i].text) {
      ++identical;
    } else if (++reported <= 3) {  // the first few mismatches tell the story
      ADD_FAILURE() << "corpus line " << i + 1 << ": " << Quoted(corpus[i])
                    << "\n  ours:      " << Describe(**tokenizer, ours[i])
                    << "\n  reference: " << Describe(**tokenizer, reference[i].ids)
                    << "\n  our decode:       " << Quoted(decoded)
                    << "\n  reference decode: " << Quoted(reference[i].text);
    }
  }
  std::cout << "parity: " << identical << " of " << corpus.size() << " lines identical\n";
  EXPECT_EQ(identical, corpus.size());
}

TEST(TokenizerParityTest, KnownIdsOfTheRealQwenTokenizer) {
  ASSERT_TRUE(testing::QwenFixturePresent());
  auto tokenizer = BpeTokenizer::Load(testing::QwenTokenizerDir());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->vocab_size(), 151669);
  EXPECT_EQ((*tokenizer)->TokenToId("<|im_start|>"), 151644);
  EXPECT_EQ((*tokenizer)->TokenToId("<|image_pad|>"), 151655);
  EXPECT_EQ((*tokenizer)->Encode("Hello world").value(), (std::vector<int32_t>{9707, 1879}));
}

}  // namespace
}  // namespace trainctl::tokenizer
