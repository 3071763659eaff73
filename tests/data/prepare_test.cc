// prepare -> shards -> reader on the real Qwen tokenizer: what comes back is exactly what the
// chat template and the image processor make of each record; bad records are named by file and
// line, or skipped and counted.
#include "common/data/prepare.h"

#include <filesystem>
#include <fstream>

#include "common/data/internal/shard_layout.h"
#include "common/data/shard_reader.h"
#include "common/tokenizer/chat_template.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/data/qwen_tokenizer.h"
#include "tests/testing/temp_dir.h"

namespace trainctl::data {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using tokenizer::ChatMessage;
using tokenizer::ChatPart;

RgbImage Gradient(int32_t width, int32_t height, int seed) {
  RgbImage image{width, height, {}};
  for (int32_t y = 0; y < height; ++y) {
    for (int32_t x = 0; x < width; ++x) {
      image.pixels.insert(image.pixels.end(),
                          {static_cast<uint8_t>(x * 3 + seed), static_cast<uint8_t>(y * 5),
                           static_cast<uint8_t>((x * y + seed * 11) % 256)});
    }
  }
  return image;
}

class PrepareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    tokenizer_ = testing::QwenTokenizer(&error);
    ASSERT_NE(tokenizer_, nullptr) << error;
    WritePng("images/a.png", Gradient(60, 40, 1));
    WritePng("images/b.png", Gradient(30, 90, 2));
  }

  void WritePng(const std::string& relative, const RgbImage& image) {
    dir_.Write(relative, EncodePng(image).value());
  }

  PrepareOptions Options(const std::string& jsonl) {
    PrepareOptions options;
    options.inputs = {dir_.Write("data.jsonl", jsonl)};
    options.out_dir = dir_.path() + "/out";
    options.tokenizer_path = testing::QwenTokenizerPath();
    options.num_threads = 2;
    return options;
  }

  // What the image processor makes of images/NAME.
  ProcessedImage Image(const std::string& name) {
    auto image = ReadImageFile(dir_.path() + "/images/" + name);
    EXPECT_TRUE(image.ok()) << image.status();
    return PreprocessImage(*image).value();
  }

  // The sample BuildTrainingExample and the image processor make of `messages` and `images`.
  Sample Expected(std::vector<ChatMessage> messages, const std::vector<std::string>& images) {
    Sample s;
    std::vector<int64_t> tokens;
    for (const std::string& name : images) {
      const ProcessedImage p = Image(name);
      tokens.push_back(p.num_merged_tokens());
      s.image_grid_thw.push_back(p.grid_thw);
      s.pixel_values.insert(s.pixel_values.end(), p.pixel_values.begin(), p.pixel_values.end());
    }
    size_t k = 0;
    for (ChatMessage& m : messages) {
      for (ChatPart& part : m.content) {
        if (part.kind == ChatPart::Kind::kImage) part.image_tokens = tokens[k++];
      }
    }
    auto example = tokenizer::BuildTrainingExample(messages, *tokenizer_);
    EXPECT_TRUE(example.ok()) << example.status();
    s.input_ids = example->input_ids;
    s.labels = example->labels;
    return s;
  }

  std::unique_ptr<ShardReader> Open(const std::string& dir) {
    auto reader = ShardReader::Open(dir);
    EXPECT_TRUE(reader.ok()) << reader.status();
    return reader.ok() ? std::move(*reader) : nullptr;
  }

  static void ExpectSame(const Sample& got, const Sample& want) {
    EXPECT_EQ(got.input_ids, want.input_ids);
    EXPECT_EQ(got.labels, want.labels);
    EXPECT_EQ(got.image_grid_thw, want.image_grid_thw);
    EXPECT_EQ(got.pixel_values, want.pixel_values);
  }

  // Nothing but the inputs is left next to out/ (no temporary directory).
  void ExpectNoLeftovers() {
    for (const auto& entry : fs::directory_iterator(dir_.path())) {
      const std::string name = entry.path().filename().string();
      EXPECT_TRUE(name == "out" || name.find("out") == std::string::npos) << name;
    }
  }

  trainctl::testing::TempDir dir_;
  const tokenizer::BpeTokenizer* tokenizer_ = nullptr;
};

TEST_F(PrepareTest, EveryFormatRoundTripsExactly) {
  const std::string jsonl =
      R"({"image": "images/a.png", "problem": "How many?", "solution": "<answer>2</answer>"})"
      "\n\n"
      R"({"image": ["images/a.png", "images/b.png"], "conversations": [)"
      R"({"from": "human", "value": "<image> and <image>: same?"}, {"from": "gpt", "value": "No."}]})"
      "\n"
      R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": )"
      R"([{"type": "image"}, {"type": "text", "text": "Colour?"}]}, {"role": "assistant", )"
      R"("content": "Blue."}], "images": ["images/b.png"]})"
      "\n"
      R"({"problem": "1+1?", "solution": "2"})"
      "\n";
  auto manifest = PrepareDataset(Options(jsonl));
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->records, 4);
  EXPECT_EQ(manifest->num_samples, 4);
  EXPECT_EQ(manifest->num_images, 4);
  EXPECT_EQ(manifest->pad_token_id, tokenizer_->TokenToId("<|endoftext|>").value());
  auto reader = Open(dir_.path() + "/out");
  ASSERT_NE(reader, nullptr);
  ASSERT_EQ(reader->size(), 4);
  ExpectSame(reader->Get(0).value(),
             Expected({{"user", {ChatPart::Image(0), ChatPart::Text("How many?")}},
                       {"assistant", {ChatPart::Text("<answer>2</answer>")}}},
                      {"a.png"}));
  ExpectSame(reader->Get(1).value(), Expected({{"user",
                                                {ChatPart::Image(0), ChatPart::Text(" and "),
                                                 ChatPart::Image(0), ChatPart::Text(": same?")}},
                                               {"assistant", {ChatPart::Text("No.")}}},
                                              {"a.png", "b.png"}));
  ExpectSame(reader->Get(2).value(),
             Expected({{"system", {ChatPart::Text("Be brief.")}},
                       {"user", {ChatPart::Image(0), ChatPart::Text("Colour?")}},
                       {"assistant", {ChatPart::Text("Blue.")}}},
                      {"b.png"}));
  ExpectSame(
      reader->Get(3).value(),
      Expected({{"user", {ChatPart::Text("1+1?")}}, {"assistant", {ChatPart::Text("2")}}}, {}));
  // Each record's solution rides along: the field, else the last assistant turn.
  EXPECT_EQ(reader->Get(0)->solution, "<answer>2</answer>");
  EXPECT_EQ(reader->View(1).solution, "No.");
  EXPECT_EQ(reader->View(2).solution, "Blue.");
  EXPECT_EQ(reader->View(3).solution, "2");
  ExpectNoLeftovers();
}

TEST_F(PrepareTest, ImageRootIsSearchedFirst) {
  WritePng("root/images/a.png", Gradient(56, 56, 9));
  PrepareOptions options = Options(R"({"image": "images/a.png", "problem": "?", "solution": "x"})");
  options.image_root = dir_.path() + "/root";
  ASSERT_TRUE(PrepareDataset(options, *tokenizer_).ok());
  auto reader = Open(options.out_dir);
  const Sample got = reader->Get(0).value();
  EXPECT_EQ(got.pixel_values, PreprocessImage(Gradient(56, 56, 9)).value().pixel_values);
}

TEST_F(PrepareTest, MissingImageIsAnErrorNamingFileAndLine) {
  PrepareOptions options =
      Options(R"({"image": "images/a.png", "problem": "?", "solution": "x"})"
              "\n"
              R"({"image": "images/missing.png", "problem": "?", "solution": "x"})"
              "\n");
  auto manifest = PrepareDataset(options, *tokenizer_);
  EXPECT_EQ(manifest.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(manifest.status().message()), StartsWith(options.inputs[0] + ":2: "));
  EXPECT_THAT(manifest.status().message(), HasSubstr("images/missing.png"));
  EXPECT_FALSE(fs::exists(options.out_dir));
  ExpectNoLeftovers();
}

TEST_F(PrepareTest, SkipBadCountsAndListsWhatItSkipped) {
  PrepareOptions options =
      Options(R"({"image": "images/a.png", "problem": "?", "solution": "x"})"
              "\n"
              R"({"image": "images/missing.png", "problem": "?", "solution": "x"})"
              "\n"
              "{broken\n"
              R"({"problem": "?", "solution": "y"})"
              "\n");
  options.skip_bad = true;
  auto manifest = PrepareDataset(options, *tokenizer_);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->records, 4);
  EXPECT_EQ(manifest->num_samples, 2);
  EXPECT_EQ(manifest->skipped, 2);
  ASSERT_EQ(manifest->skipped_records.size(), 2u);
  EXPECT_EQ(manifest->skipped_records[0].line, 2);
  EXPECT_THAT(manifest->skipped_records[0].error, HasSubstr("missing.png"));
  EXPECT_EQ(manifest->skipped_records[1].line, 3);
  // The manifest on disk says the same.
  auto reader = Open(options.out_dir);
  EXPECT_EQ(reader->manifest().skipped, 2);
  EXPECT_EQ(reader->manifest().skipped_records[1].file, options.inputs[0]);
  EXPECT_EQ(reader->size(), 2);
}

TEST_F(PrepareTest, ExistingOutputNeedsOverwrite) {
  PrepareOptions options = Options(R"({"problem": "?", "solution": "x"})");
  ASSERT_TRUE(PrepareDataset(options, *tokenizer_).ok());
  EXPECT_EQ(PrepareDataset(options, *tokenizer_).status().code(),
            absl::StatusCode::kFailedPrecondition);
  options.overwrite = true;
  options.inputs = {dir_.Write("two.jsonl",
                               "{\"problem\": \"a\", \"solution\": \"b\"}\n"
                               "{\"problem\": \"c\", \"solution\": \"d\"}\n")};
  ASSERT_TRUE(PrepareDataset(options, *tokenizer_).ok());
  EXPECT_EQ(Open(options.out_dir)->size(), 2);
  ExpectNoLeftovers();
}

TEST_F(PrepareTest, Bfloat16PatchesAndSmallShards) {
  std::string jsonl;
  for (int i = 0; i < 5; ++i) {
    jsonl += R"({"image": "images/a.png", "problem": "Q)" + std::to_string(i) +
             R"(", "solution": "A"})" + "\n";
  }
  PrepareOptions options = Options(jsonl);
  options.patch_dtype = PatchDtype::kBfloat16;
  options.shard_size_bytes = 1;
  auto manifest = PrepareDataset(options, *tokenizer_);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->shards.size(), 5u);
  auto reader = Open(options.out_dir);
  const ProcessedImage a = Image("a.png");
  for (int i = 0; i < 5; ++i) {
    const Sample got = reader->Get(i).value();
    EXPECT_EQ(tokenizer_->Decode(got.input_ids).value().find("Q" + std::to_string(i)) !=
                  std::string::npos,
              true);
    ASSERT_EQ(got.pixel_values.size(), a.pixel_values.size());
    for (size_t k = 0; k < a.pixel_values.size(); k += 97) {
      EXPECT_EQ(got.pixel_values[k],
                internal::Bf16ToFloat(internal::FloatToBf16(a.pixel_values[k])));
    }
  }
}

TEST_F(PrepareTest, OverlongSamplesAreDroppedOrTruncated) {
  const std::string jsonl =
      R"({"image": "images/a.png", "problem": "Count.", "solution": "one two three four five"})"
      "\n";
  PrepareOptions options = Options(jsonl);
  ASSERT_TRUE(PrepareDataset(options, *tokenizer_).ok());
  const Sample full = Open(options.out_dir)->Get(0).value();
  const int64_t len = static_cast<int64_t>(full.input_ids.size());

  options.out_dir = dir_.path() + "/dropped";
  options.max_seq_len = len - 2;
  auto dropped = PrepareDataset(options, *tokenizer_);
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  EXPECT_EQ(dropped->num_samples, 0);
  EXPECT_EQ(dropped->dropped, 1);

  options.out_dir = dir_.path() + "/truncated";
  options.overflow = Overflow::kTruncate;
  auto truncated = PrepareDataset(options, *tokenizer_);
  ASSERT_TRUE(truncated.ok()) << truncated.status();
  EXPECT_EQ(truncated->truncated, 1);
  const Sample cut = Open(options.out_dir)->Get(0).value();
  EXPECT_EQ(cut.input_ids,
            std::vector<int32_t>(full.input_ids.begin(), full.input_ids.begin() + len - 2));
  EXPECT_EQ(cut.pixel_values, full.pixel_values);
}

TEST_F(PrepareTest, TruncationNeverSplitsAnImage) {
  Sample sample = Expected({{"user", {ChatPart::Text("Look:"), ChatPart::Image(0)}},
                            {"assistant", {ChatPart::Text("Fine.")}}},
                           {"a.png"});
  const int32_t vision_start = tokenizer_->TokenToId("<|vision_start|>").value();
  const auto start = std::find(sample.input_ids.begin(), sample.input_ids.end(), vision_start);
  ASSERT_NE(start, sample.input_ids.end());
  const int64_t at = start - sample.input_ids.begin();
  Sample cut = sample;
  auto kept = TruncateSample(at + 3, *tokenizer_, &cut);  // inside the image's pads
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_FALSE(*kept);  // only the prompt is left: nothing to train on
  EXPECT_EQ(static_cast<int64_t>(cut.input_ids.size()), at);
  EXPECT_TRUE(cut.image_grid_thw.empty());
  EXPECT_TRUE(cut.pixel_values.empty());
}

}  // namespace
}  // namespace trainctl::data
