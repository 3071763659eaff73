// The `prepare` and `datagen` verbs end to end: shapes -> shards -> batches.
#include "common/data/data_cli.h"

#include <algorithm>
#include <sstream>

#include "common/data/loader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/data/qwen_tokenizer.h"
#include "tests/testing/temp_dir.h"

namespace trainctl::data {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

struct VerbRun {
  int code;
  std::string out;
  std::string err;
};

VerbRun Prepare(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  const int code = RunPrepareVerb(args, out, err);
  return {code, out.str(), err.str()};
}

VerbRun Datagen(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  const int code = RunDatagenVerb(args, out, err);
  return {code, out.str(), err.str()};
}

int Lines(const std::string& text) {
  return static_cast<int>(std::count(text.begin(), text.end(), '\n'));
}

TEST(DataCliTest, ShapesPrepareAndLoad) {
  trainctl::testing::TempDir dir;
  const std::string data = dir.path() + "/shapes";
  const VerbRun gen = Datagen({"shapes", "--out", data, "--n=8", "--seed", "3"});
  ASSERT_EQ(gen.code, 0) << gen.err;
  EXPECT_THAT(gen.out, HasSubstr("wrote 8 shapes items"));
  const std::string shards = dir.path() + "/shards";
  const VerbRun prep = Prepare({"--input", data + "/shapes.jsonl", "--out=" + shards, "--tokenizer",
                                testing::QwenTokenizerPath(), "--max_seq_len", "4096"});
  ASSERT_EQ(prep.code, 0) << prep.err;
  EXPECT_THAT(prep.out, StartsWith("prepared 8 samples"));
  EXPECT_THAT(prep.out, HasSubstr("8 images"));

  auto reader = ShardReader::Open(shards);
  ASSERT_TRUE(reader.ok()) << reader.status();
  LoaderOptions options;
  options.batch_size = 4;
  options.seed = 1;
  auto loader = Loader::Create(std::shared_ptr<const ShardReader>(std::move(*reader)), options);
  ASSERT_TRUE(loader.ok()) << loader.status();
  for (int b = 0; b < 2; ++b) {
    auto batch = (*loader)->Next();
    ASSERT_TRUE(batch.ok()) << batch.status();
    EXPECT_EQ(batch->batch_size, 4);
    EXPECT_EQ(batch->image_grid_thw.size(), 12u);
    int64_t patches = 0;
    for (size_t i = 0; i < batch->image_grid_thw.size(); i += 3) {
      patches += int64_t{batch->image_grid_thw[i]} * batch->image_grid_thw[i + 1] *
                 batch->image_grid_thw[i + 2];
    }
    EXPECT_EQ(static_cast<int64_t>(batch->pixel_values.size()), patches * kPatchDim);
    EXPECT_GT(batch->num_label_tokens, 0);
  }
  EXPECT_EQ((*loader)->state(), (LoaderState{1, 0}));
}

TEST(DataCliTest, UsageErrorsExitTwoWithOneLine) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--out", "x", "--tokenizer", "t"},
        {"--input", "a.jsonl", "--out", "x", "--tokenizer", "t", "--bogus"},
        {"--input", "a.jsonl", "--out", "x", "--tokenizer", "t", "--max_seq_len", "-3"},
        {"--input", "a.jsonl", "--out", "x", "--tokenizer", "t", "--truncate"},
        {"--input", "a.jsonl", "--out", "x", "--tokenizer"}}) {
    const VerbRun run = Prepare(args);
    EXPECT_EQ(run.code, 2) << run.err;
    EXPECT_THAT(run.err, StartsWith("trainctl prepare: "));
    EXPECT_EQ(Lines(run.err), 1) << run.err;
  }
  EXPECT_EQ(Datagen({}).code, 2);
  EXPECT_EQ(Datagen({"circles", "--out", "x", "--n", "1"}).code, 2);
  const VerbRun no_n = Datagen({"shapes", "--out", "x"});
  EXPECT_EQ(no_n.code, 2);
  EXPECT_THAT(no_n.err, StartsWith("trainctl datagen: --n is required"));
  EXPECT_EQ(Prepare({"--help"}).code, 0);
}

TEST(DataCliTest, FailuresExitOneNamingTheProblem) {
  trainctl::testing::TempDir dir;
  const VerbRun missing =
      Prepare({"--input", dir.path() + "/none.jsonl", "--out", dir.path() + "/out", "--tokenizer",
               testing::QwenTokenizerPath()});
  EXPECT_EQ(missing.code, 1);
  EXPECT_THAT(missing.err, StartsWith("trainctl prepare: input "));
  EXPECT_THAT(missing.err, HasSubstr("none.jsonl"));

  const std::string jsonl = dir.Write("d.jsonl",
                                      "{\"problem\": \"?\", \"solution\": \"x\"}\n"
                                      "{\"image\": \"gone.png\", \"problem\": \"?\", "
                                      "\"solution\": \"x\"}\n");
  const VerbRun bad = Prepare({"--input", jsonl, "--out", dir.path() + "/out", "--tokenizer",
                               testing::QwenTokenizerPath()});
  EXPECT_EQ(bad.code, 1);
  EXPECT_THAT(bad.err, HasSubstr("d.jsonl:2: image 'gone.png' not found"));
  const VerbRun skipped = Prepare({"--input", jsonl, "--out", dir.path() + "/out", "--tokenizer",
                                   testing::QwenTokenizerPath(), "--skip_bad"});
  EXPECT_EQ(skipped.code, 0) << skipped.err;
  EXPECT_THAT(skipped.out, HasSubstr("skipped 1"));
  EXPECT_THAT(skipped.err, HasSubstr("skipped " + jsonl + ":2: image 'gone.png'"));
}

}  // namespace
}  // namespace trainctl::data
