// The loader on synthetic shards: seeded order, rank partition, resumable position, padding and
// masks, packing, prefetch.
#include "common/data/loader.h"

#include <algorithm>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/data/synthetic_shards.h"
#include "tests/testing/temp_dir.h"

namespace trainctl::data {
namespace {

using ::testing::HasSubstr;
using testing::kSyntheticPad;
using testing::SampleOf;
using testing::SyntheticSample;

class LoaderTest : public ::testing::Test {
 protected:
  std::shared_ptr<const ShardReader> Data(int64_t n) {
    dirs_.push_back(std::make_unique<trainctl::testing::TempDir>());
    testing::WriteSyntheticShards(dirs_.back()->path(), n, {PatchDtype::kFloat32, 512});
    auto reader = ShardReader::Open(dirs_.back()->path());
    EXPECT_TRUE(reader.ok()) << reader.status();
    return std::shared_ptr<const ShardReader>(std::move(*reader));
  }

  static std::unique_ptr<Loader> Make(std::shared_ptr<const ShardReader> data,
                                      const LoaderOptions& options) {
    auto loader = Loader::Create(std::move(data), options);
    EXPECT_TRUE(loader.ok()) << loader.status();
    return loader.ok() ? std::move(*loader) : nullptr;
  }

  // The samples of each of the next `batches` batches, in order (padded mode).
  static std::vector<std::vector<int64_t>> Take(Loader& loader, int batches) {
    std::vector<std::vector<int64_t>> out;
    for (int b = 0; b < batches; ++b) {
      auto batch = loader.Next();
      EXPECT_TRUE(batch.ok()) << batch.status();
      if (!batch.ok()) break;
      std::vector<int64_t> samples;
      for (int64_t r = 0; r < batch->batch_size; ++r) {
        samples.push_back(SampleOf(batch->input_ids[r * batch->seq_len]));
      }
      out.push_back(samples);
    }
    return out;
  }

  static std::vector<int64_t> Flatten(const std::vector<std::vector<int64_t>>& batches) {
    std::vector<int64_t> out;
    for (const auto& b : batches) out.insert(out.end(), b.begin(), b.end());
    return out;
  }

  std::vector<std::unique_ptr<trainctl::testing::TempDir>> dirs_;
};

TEST_F(LoaderTest, OrderIsSeededAndDiffersByEpoch) {
  auto data = Data(10);
  LoaderOptions options;
  options.batch_size = 5;
  options.seed = 42;
  auto a = Make(data, options);
  auto b = Make(data, options);
  const auto epochs_a = Take(*a, 4), epochs_b = Take(*b, 4);
  EXPECT_EQ(epochs_a, epochs_b);
  const std::vector<int64_t> all = Flatten(epochs_a);
  const std::vector<int64_t> epoch0(all.begin(), all.begin() + 10),
      epoch1(all.begin() + 10, all.end());
  EXPECT_NE(epoch0, epoch1);
  for (const auto& epoch : {epoch0, epoch1}) {
    std::vector<int64_t> sorted = epoch;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_THAT(sorted, ::testing::ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 9));
  }
  options.seed = 43;
  EXPECT_NE(Flatten(Take(*Make(data, options), 2)), epoch0);
  options.shuffle = false;
  EXPECT_THAT(Flatten(Take(*Make(data, options), 2)),
              ::testing::ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 9));
}

TEST_F(LoaderTest, RanksGetDisjointEqualSlices) {
  auto data = Data(10);
  for (const auto remainder : {LoaderOptions::Remainder::kDrop, LoaderOptions::Remainder::kPad}) {
    std::multiset<int64_t> seen;
    for (int32_t rank = 0; rank < 3; ++rank) {
      LoaderOptions options;
      options.seed = 7;
      options.rank = rank;
      options.world_size = 3;
      options.remainder = remainder;
      options.batch_size = 2;
      auto loader = Make(data, options);
      const int64_t units = loader->UnitsInEpoch(0);
      EXPECT_EQ(units, remainder == LoaderOptions::Remainder::kDrop ? 3 : 4);
      EXPECT_EQ(loader->BatchesInEpoch(0), 2);
      const std::vector<int64_t> mine = Flatten(Take(*loader, 2));
      EXPECT_EQ(static_cast<int64_t>(mine.size()), units);
      seen.insert(mine.begin(), mine.end());
      EXPECT_EQ(loader->state(), (LoaderState{1, 0}));
    }
    if (remainder == LoaderOptions::Remainder::kDrop) {
      EXPECT_EQ(seen.size(), 9u);
      EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 9u);  // disjoint
    } else {
      EXPECT_EQ(seen.size(), 12u);  // two samples twice, to fill the last round
      EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 10u);  // complete
    }
  }
}

TEST_F(LoaderTest, ResumingFromAStateGivesTheSameBatches) {
  auto data = Data(10);
  for (const int32_t prefetch : {0, 3}) {
    LoaderOptions options;
    options.batch_size = 3;  // 4 batches per epoch, the last one of 1
    options.seed = 9;
    options.prefetch_batches = prefetch;
    auto first = Make(data, options);
    Take(*first, 3);
    const LoaderState saved = first->state();
    EXPECT_EQ(saved, (LoaderState{0, 9}));
    const auto rest = Take(*first, 6);  // crosses into epoch 1
    EXPECT_EQ(rest[0].size(), 1u);
    auto resumed = Make(data, options);
    ASSERT_TRUE(resumed->SetState(saved).ok());
    EXPECT_EQ(Take(*resumed, 6), rest);
    // Back to the start of a later epoch.
    ASSERT_TRUE(resumed->SetState({1, 0}).ok());
    EXPECT_EQ(Take(*resumed, 1)[0], rest[1]);
  }
  auto loader = Make(data, {});
  EXPECT_EQ(loader->SetState({0, 11}).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(loader->SetState({-1, 0}).code(), absl::StatusCode::kOutOfRange);
}

TEST_F(LoaderTest, PrefetchGivesTheSameBatchesAsInline) {
  auto data = Data(13);
  LoaderOptions options;
  options.batch_size = 4;
  options.prefetch_batches = 0;
  const auto inline_batches = Take(*Make(data, options), 9);
  options.prefetch_batches = 2;
  EXPECT_EQ(Take(*Make(data, options), 9), inline_batches);
  // A loader whose queue is full is destroyed without hanging.
  auto idle = Make(data, options);
  ASSERT_TRUE(idle->Next().ok());
}

TEST_F(LoaderTest, PadsToTheLongestWithMasks) {
  auto data = Data(6);
  LoaderOptions options;
  options.shuffle = false;
  options.batch_size = 4;
  auto loader = Make(data, options);
  auto batch = loader->Next();
  ASSERT_TRUE(batch.ok()) << batch.status();
  // Lengths of samples 0..3: 3, 4, 5, 6.
  ASSERT_EQ(batch->batch_size, 4);
  ASSERT_EQ(batch->seq_len, 6);
  int64_t labelled = 0;
  for (int64_t r = 0; r < 4; ++r) {
    const Sample want = SyntheticSample(r);
    for (int64_t j = 0; j < 6; ++j) {
      const size_t at = static_cast<size_t>(r * 6 + j);
      const bool token = j < static_cast<int64_t>(want.input_ids.size());
      EXPECT_EQ(batch->input_ids[at], token ? want.input_ids[j] : kSyntheticPad) << r << j;
      EXPECT_EQ(batch->labels[at], token ? want.labels[j] : -100) << r << j;
      EXPECT_EQ(batch->attention_mask[at], token ? 1 : 0) << r << j;
      EXPECT_EQ(batch->segment_ids[at], token ? 1 : 0) << r << j;
      labelled += token && want.labels[j] != -100;
    }
  }
  EXPECT_EQ(batch->num_label_tokens, labelled);
  // Sample 0 and 3 have an image each; their patches in order.
  EXPECT_THAT(batch->image_grid_thw, ::testing::ElementsAre(1, 2, 2, 1, 2, 2));
  std::vector<float> patches = SyntheticSample(0).pixel_values;
  const std::vector<float> third = SyntheticSample(3).pixel_values;
  patches.insert(patches.end(), third.begin(), third.end());
  EXPECT_EQ(batch->pixel_values, patches);
  EXPECT_THAT(batch->solutions,
              ::testing::ElementsAre(SyntheticSample(0).solution, SyntheticSample(1).solution,
                                     SyntheticSample(2).solution, ""));

  options.pad_to_multiple_of = 8;
  EXPECT_EQ(Make(data, options)->Next()->seq_len, 8);
}

TEST_F(LoaderTest, PackedRowsHoldWholeSamplesWithSegments) {
  auto data = Data(20);
  std::multiset<int64_t> seen;
  for (int32_t rank = 0; rank < 2; ++rank) {
    LoaderOptions options;
    options.pack_length = 12;
    options.batch_size = 2;
    options.rank = rank;
    options.world_size = 2;
    options.remainder = LoaderOptions::Remainder::kPad;
    options.seed = 3;
    auto loader = Make(data, options);
    const int64_t batches = loader->BatchesInEpoch(0);
    ASSERT_GT(batches, 0);
    for (int64_t b = 0; b < batches; ++b) {
      auto batch = loader->Next();
      ASSERT_TRUE(batch.ok()) << batch.status();
      EXPECT_EQ(batch->seq_len, 12);
      int64_t images = 0;
      std::vector<std::string> solutions;  // of the samples in order
      for (int64_t r = 0; r < batch->batch_size; ++r) {
        int64_t j = 0;
        int32_t segment = 0;
        while (j < 12 && batch->segment_ids[r * 12 + j] != 0) {
          const int32_t id = batch->input_ids[r * 12 + j];
          const Sample want = SyntheticSample(SampleOf(id));
          ++segment;
          seen.insert(SampleOf(id));
          images += static_cast<int64_t>(want.image_grid_thw.size());
          solutions.push_back(want.solution);
          for (size_t k = 0; k < want.input_ids.size(); ++k, ++j) {
            ASSERT_LT(j, 12);
            EXPECT_EQ(batch->input_ids[r * 12 + j], want.input_ids[k]);
            EXPECT_EQ(batch->segment_ids[r * 12 + j], segment);
            EXPECT_EQ(batch->attention_mask[r * 12 + j], 1);
            EXPECT_EQ(batch->labels[r * 12 + j], k == 0 ? -100 : want.labels[k]);
          }
        }
        EXPECT_GE(segment, 1);
        for (; j < 12; ++j) {
          EXPECT_EQ(batch->input_ids[r * 12 + j], kSyntheticPad);
          EXPECT_EQ(batch->attention_mask[r * 12 + j], 0);
          EXPECT_EQ(batch->labels[r * 12 + j], -100);
        }
      }
      EXPECT_EQ(static_cast<int64_t>(batch->image_grid_thw.size()), images * 3);
      EXPECT_EQ(batch->solutions, solutions);
    }
    EXPECT_EQ(loader->state(), (LoaderState{1, 0}));
  }
  EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 20u);  // every sample packed
}

TEST_F(LoaderTest, PackedPositionResumes) {
  auto data = Data(30);
  LoaderOptions options;
  options.pack_length = 16;
  options.batch_size = 2;
  options.seed = 5;
  auto a = Make(data, options);
  ASSERT_TRUE(a->Next().ok());
  const LoaderState saved = a->state();
  std::vector<std::vector<int32_t>> rest;
  for (int i = 0; i < 5; ++i) rest.push_back(a->Next()->input_ids);
  auto b = Make(data, options);
  ASSERT_TRUE(b->SetState(saved).ok());
  for (int i = 0; i < 5; ++i) EXPECT_EQ(b->Next()->input_ids, rest[i]) << i;
}

TEST_F(LoaderTest, BadOptionsAreRefused) {
  auto data = Data(4);
  LoaderOptions options;
  options.rank = 2;
  options.world_size = 2;
  EXPECT_EQ(Loader::Create(data, options).status().code(), absl::StatusCode::kInvalidArgument);
  options = {};
  options.pack_length = 5;  // sample 3 has 6 tokens
  EXPECT_THAT(Loader::Create(data, options).status().message(), HasSubstr("sample 3 of"));
  options = {};
  options.world_size = 5;
  options.rank = 4;
  EXPECT_EQ(Loader::Create(data, options).status().code(), absl::StatusCode::kFailedPrecondition);
  options = {};
  options.batch_size = 8;
  options.drop_last_batch = true;  // 4 samples never make a batch of 8
  auto loader = Make(data, options);
  EXPECT_EQ(loader->Next().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(loader->Next().status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace trainctl::data
