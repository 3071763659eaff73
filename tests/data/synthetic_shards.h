// Shard directories of synthetic samples whose every value says where it came from, for reader
// and loader tests that need no tokenizer and no image.
#ifndef TRAINCTL_TESTS_DATA_SYNTHETIC_SHARDS_H_
#define TRAINCTL_TESTS_DATA_SYNTHETIC_SHARDS_H_

#include <string>
#include <vector>

#include "common/data/batch.h"
#include "common/data/manifest.h"
#include "common/data/shard_writer.h"
#include "gtest/gtest.h"

namespace trainctl::data::testing {

inline constexpr int32_t kSyntheticPad = 7;

// Sample i: 3 + (7i mod 6) tokens with ids 1000i + j; labels trained on odd positions; every
// third sample has one 2x2-patch image whose values are i + (k mod 7) / 4 (exact in bfloat16);
// every sample but each fourth has a solution of varying length naming i ("<answer>i</answer>"
// plus i mod 5 "é"s, so records of every padding occur).
inline Sample SyntheticSample(int64_t i) {
  Sample s;
  const int64_t len = 3 + (7 * i) % 6;
  for (int64_t j = 0; j < len; ++j) {
    s.input_ids.push_back(static_cast<int32_t>(1000 * i + j));
    s.labels.push_back(j % 2 == 1 ? static_cast<int32_t>(1000 * i + j) : -100);
  }
  if (i % 3 == 0) {
    s.image_grid_thw.push_back({1, 2, 2});
    for (int64_t k = 0; k < 4 * kPatchDim; ++k) {
      s.pixel_values.push_back(static_cast<float>(i) + static_cast<float>(k % 7) / 4);
    }
  }
  if (i % 4 != 3) {
    s.solution = "<answer>" + std::to_string(i) + "</answer>";
    for (int64_t k = 0; k < i % 5; ++k) s.solution += "\xC3\xA9";  // é
  }
  return s;
}

// Writes samples 0..n-1 to `dir` (which must exist).
inline DatasetManifest WriteSyntheticShards(const std::string& dir, int64_t n,
                                            ShardWriterOptions options = {}) {
  ShardWriter writer(dir, options);
  for (int64_t i = 0; i < n; ++i) {
    const absl::Status s = writer.Add(SyntheticSample(i));
    EXPECT_TRUE(s.ok()) << s;
  }
  DatasetManifest manifest;
  manifest.pad_token_id = kSyntheticPad;
  auto written = writer.Finish(manifest);
  EXPECT_TRUE(written.ok()) << written.status();
  return written.ok() ? *written : DatasetManifest{};
}

// The sample a row segment came from, read off its first id.
inline int64_t SampleOf(int32_t first_id) { return first_id / 1000; }

}  // namespace trainctl::data::testing

#endif  // TRAINCTL_TESTS_DATA_SYNTHETIC_SHARDS_H_
