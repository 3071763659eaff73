// Shards written, memory-mapped and read back; truncated and corrupted shards refused by name.
#include "worker/trainer/data/shard_reader.h"

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/data/synthetic_shards.h"
#include "tests/testing/temp_dir.h"
#include "worker/trainer/data/internal/crc32c.h"

namespace trainctl::data {
namespace {

using ::testing::HasSubstr;
using testing::SyntheticSample;
using testing::WriteSyntheticShards;

void ExpectSameSample(const Sample& got, const Sample& want) {
  EXPECT_EQ(got.input_ids, want.input_ids);
  EXPECT_EQ(got.labels, want.labels);
  EXPECT_EQ(got.image_grid_thw, want.image_grid_thw);
  EXPECT_EQ(got.pixel_values, want.pixel_values);
}

TEST(Crc32cTest, KnownValueAndBothPathsAgree) {
  // The standard check value of CRC-32C.
  EXPECT_EQ(internal::Crc32c("123456789", 9), 0xE3069283u);
  std::string data;
  for (int i = 0; i < 1000; ++i) data.push_back(static_cast<char>(i * 37));
  for (size_t len : {0u, 1u, 7u, 8u, 9u, 63u, 1000u}) {
    EXPECT_EQ(internal::Crc32c(data.data(), len),
              internal::Crc32cExtendPortable(0, data.data(), len));
  }
  EXPECT_EQ(internal::Crc32cExtend(internal::Crc32c(data.data(), 300), data.data() + 300, 700),
            internal::Crc32c(data.data(), 1000));
}

TEST(ShardReaderTest, ReadsBackWhatWasWrittenAcrossShards) {
  trainctl::testing::TempDir dir;
  const DatasetManifest written = WriteSyntheticShards(dir.path(), 20, {PatchDtype::kFloat32, 1});
  EXPECT_EQ(written.shards.size(), 20u);  // 1-byte shards: one sample each
  auto reader = ShardReader::Open(dir.path());
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_EQ((*reader)->size(), 20);
  EXPECT_EQ((*reader)->manifest().pad_token_id, testing::kSyntheticPad);
  EXPECT_EQ((*reader)->manifest().num_images, 7);
  for (int64_t i = 0; i < 20; ++i) {
    auto sample = (*reader)->Get(i);
    ASSERT_TRUE(sample.ok()) << sample.status();
    ExpectSameSample(*sample, SyntheticSample(i));
    EXPECT_EQ((*reader)->NumTokens(i), static_cast<int64_t>(sample->input_ids.size()));
  }
  EXPECT_EQ((*reader)->Get(20).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(ShardReaderTest, Bfloat16PatchesComeBackAsTheirRoundedValues) {
  trainctl::testing::TempDir dir;
  WriteSyntheticShards(dir.path(), 7, {PatchDtype::kBfloat16, 1 << 20});
  auto reader = ShardReader::Open(dir.path());
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->manifest().patch_dtype, PatchDtype::kBfloat16);
  for (int64_t i = 0; i < 7; ++i) ExpectSameSample((*reader)->Get(i).value(), SyntheticSample(i));
}

TEST(ShardReaderTest, ManifestRecordsCountsAndChecksums) {
  trainctl::testing::TempDir dir;
  WriteSyntheticShards(dir.path(), 5);
  std::ifstream in(dir.path() + "/manifest.json");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto manifest = ParseManifest(text, "manifest.json");
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->num_samples, 5);
  ASSERT_EQ(manifest->shards.size(), 1u);
  EXPECT_EQ(manifest->shards[0].file, "shard-00000.bin");
  EXPECT_EQ(manifest->shards[0].bytes,
            static_cast<int64_t>(std::filesystem::file_size(dir.path() + "/shard-00000.bin")));
  EXPECT_THAT(text, HasSubstr("\"checksum\": \"crc32c\""));
}

class CorruptShardTest : public ::testing::Test {
 protected:
  void SetUp() override { WriteSyntheticShards(dir_.path(), 6, {PatchDtype::kFloat32, 1}); }
  std::string Shard(int k) const {
    return dir_.path() + "/shard-0000" + std::to_string(k) + ".bin";
  }
  void FlipByte(const std::string& path, std::streamoff at) const {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(at);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x40);
    f.seekp(at);
    f.write(&c, 1);
  }
  trainctl::testing::TempDir dir_;
};

TEST_F(CorruptShardTest, TruncatedShardIsAnErrorNamingIt) {
  std::filesystem::resize_file(Shard(3), std::filesystem::file_size(Shard(3)) - 10);
  auto reader = ShardReader::Open(dir_.path());
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(reader.status().message(), HasSubstr("shard-00003.bin"));
  EXPECT_THAT(reader.status().message(), HasSubstr("truncated"));
}

TEST_F(CorruptShardTest, FlippedByteIsAnErrorNamingTheShard) {
  FlipByte(Shard(2), 40);  // inside the first record's token ids
  auto reader = ShardReader::Open(dir_.path());
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(reader.status().message(), HasSubstr("shard-00002.bin is corrupted: crc32c"));
}

TEST_F(CorruptShardTest, StructureIsCheckedEvenWithoutChecksums) {
  const auto size = static_cast<std::streamoff>(std::filesystem::file_size(Shard(1)));
  FlipByte(Shard(1), size - 20);  // the footer's sample count
  auto reader = ShardReader::Open(dir_.path(), {/*verify_checksums=*/false});
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(reader.status().message(), HasSubstr("shard-00001.bin is corrupted"));
}

TEST_F(CorruptShardTest, MissingShardOrManifest) {
  std::filesystem::remove(Shard(4));
  EXPECT_THAT(ShardReader::Open(dir_.path()).status().message(), HasSubstr("shard-00004.bin"));
  std::filesystem::remove(dir_.path() + "/manifest.json");
  EXPECT_EQ(ShardReader::Open(dir_.path()).status().code(), absl::StatusCode::kNotFound);
}

TEST(ManifestTest, InconsistentManifestIsRefused) {
  const std::string text = R"({"format": "trainctl-shards", "version": 1, "checksum": "crc32c",
      "patch_dtype": "float32", "pad_token_id": 0, "num_samples": 3, "num_tokens": 0,
      "num_label_tokens": 0, "num_images": 0, "num_patches": 0,
      "shards": [{"file": "shard-00000.bin", "num_samples": 2, "bytes": 10,
                  "crc32c": "0000abcd"}]})";
  EXPECT_THAT(ParseManifest(text, "m.json").status().message(),
              HasSubstr("'num_samples' is 3 but the shards hold 2"));
  EXPECT_THAT(ParseManifest(R"({"format": "other"})", "m.json").status().message(),
              HasSubstr("m.json: 'format'"));
}

}  // namespace
}  // namespace trainctl::data
