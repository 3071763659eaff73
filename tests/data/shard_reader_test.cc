// Shards written, memory-mapped and read back; truncated and corrupted shards refused by name.
#include "common/data/shard_reader.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "common/data/internal/crc32c.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/data/synthetic_shards.h"
#include "tests/testing/temp_dir.h"

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
  EXPECT_EQ(got.solution, want.solution);
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

TEST(ShardReaderTest, SolutionsAreReadInPlace) {
  trainctl::testing::TempDir dir;
  WriteSyntheticShards(dir.path(), 12, {PatchDtype::kBfloat16, 300});
  auto reader = ShardReader::Open(dir.path());
  ASSERT_TRUE(reader.ok()) << reader.status();
  for (int64_t i = 0; i < 12; ++i) {
    EXPECT_EQ((*reader)->View(i).solution, SyntheticSample(i).solution) << i;
  }
  EXPECT_EQ((*reader)->View(3).solution, "");
  EXPECT_EQ((*reader)->View(4).solution, "<answer>4</answer>\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9");
}

// Shard bytes edited in place, with the manifest's checksums brought up to date, so that only the
// structure checks can object.
class ShardEditTest : public ::testing::Test {
 protected:
  std::string Read(const std::string& path) const {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  void Edit(const std::function<void(std::string*)>& edit) const {
    const std::string manifest_path = dir_.path() + "/manifest.json";
    auto manifest = ParseManifest(Read(manifest_path), manifest_path);
    ASSERT_TRUE(manifest.ok()) << manifest.status();
    for (ShardInfo& shard : manifest->shards) {
      const std::string path = dir_.path() + "/" + shard.file;
      std::string bytes = Read(path);
      edit(&bytes);
      std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
      shard.bytes = static_cast<int64_t>(bytes.size());
      shard.crc32c = internal::Crc32c(bytes.data(), bytes.size());
    }
    std::ofstream(manifest_path, std::ios::trunc) << ManifestToJson(*manifest);
  }
  static void SetU32(std::string* bytes, size_t at, uint32_t value) {
    std::memcpy(bytes->data() + at, &value, 4);
  }
  trainctl::testing::TempDir dir_;
};

// What the version-1 writer wrote: the same bytes as version 2 without solutions, but the version.
TEST_F(ShardEditTest, Version1ShardsLoadWithEmptySolutions) {
  ShardWriter writer(dir_.path(), {PatchDtype::kFloat32, 200});
  for (int64_t i = 0; i < 9; ++i) {
    Sample sample = SyntheticSample(i);
    sample.solution.clear();
    ASSERT_TRUE(writer.Add(sample).ok());
  }
  ASSERT_TRUE(writer.Finish({}).ok());
  Edit([](std::string* bytes) { SetU32(bytes, 8, 1); });
  auto reader = ShardReader::Open(dir_.path());
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_EQ((*reader)->size(), 9);
  for (int64_t i = 0; i < 9; ++i) {
    Sample want = SyntheticSample(i);
    want.solution.clear();
    ExpectSameSample((*reader)->Get(i).value(), want);
    EXPECT_EQ((*reader)->View(i).solution, "");
  }
}

TEST_F(ShardEditTest, Version1RecordWithItsReservedFieldSetIsDataLoss) {
  WriteSyntheticShards(dir_.path(), 1);  // sample 0 has a solution: solution_bytes != 0
  Edit([](std::string* bytes) { SetU32(bytes, 8, 1); });
  auto reader = ShardReader::Open(dir_.path());
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(reader.status().message(),
              HasSubstr("shard-00000.bin is corrupted: record 0 sets the reserved field"));
}

TEST_F(ShardEditTest, UnknownVersionIsDataLoss) {
  WriteSyntheticShards(dir_.path(), 2);
  Edit([](std::string* bytes) { SetU32(bytes, 8, 3); });
  EXPECT_THAT(ShardReader::Open(dir_.path()).status().message(),
              HasSubstr("shard-00000.bin is corrupted: format version 3, expected 1 to 2"));
}

TEST_F(ShardEditTest, SolutionLongerThanItsRecordIsDataLossNamingTheShard) {
  WriteSyntheticShards(dir_.path(), 3);
  // Record 0 starts right after the 16-byte header; solution_bytes is its fourth field.
  Edit([](std::string* bytes) { SetU32(bytes, 16 + 12, 1000); });
  auto reader = ShardReader::Open(dir_.path());
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(reader.status().message(),
              HasSubstr("shard-00000.bin is corrupted: record 0 does not match its size"));
}

TEST_F(ShardEditTest, ShardCutInsideTheLastSolutionIsDataLoss) {
  WriteSyntheticShards(dir_.path(), 3);  // the last record's solution ends before the index
  Edit([](std::string* bytes) {
    // Drop the last record's solution and padding, keeping index and footer: the index no longer
    // fits the records.
    const size_t index_offset = [&] {
      uint64_t v;
      std::memcpy(&v, bytes->data() + bytes->size() - 16, 8);
      return static_cast<size_t>(v);
    }();
    bytes->erase(index_offset - 16, 16);
  });
  auto reader = ShardReader::Open(dir_.path(), {/*verify_checksums=*/false});
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(reader.status().message(), HasSubstr("shard-00000.bin is corrupted"));
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

// Found by tests/fuzz/manifest_fuzz (regressions/manifest_fuzz): a field of the wrong type threw
// out of nlohmann::json::value and killed the process.
TEST(ManifestTest, FieldsOfTheWrongTypeAreErrorsOrIgnored) {
  EXPECT_THAT(ParseManifest(R"({"format": 1})", "m.json").status().message(),
              HasSubstr("m.json: 'format'"));
  const std::string text = R"({"format": "trainctl-shards", "version": 1, "checksum": "crc32c",
      "patch_dtype": "float32", "pad_token_id": 0, "num_samples": 0, "num_tokens": 0,
      "num_label_tokens": 0, "num_images": 0, "num_patches": 0,
      "prepared": {"tokenizer": 5, "skipped_records": [{"file": 1, "line": "7"}]},
      "shards": [{"file": "shard-00000.bin", "num_samples": 0, "bytes": 10, "crc32c": 7}]})";
  EXPECT_THAT(ParseManifest(text, "m.json").status().message(),
              HasSubstr("'shards[0].crc32c' must be 8 hex digits"));
}

// Found by tests/fuzz/shard_reader_fuzz (regressions/shard_reader_fuzz): the manifest's sample
// count sized an allocation before any shard was read.
TEST_F(CorruptShardTest, SampleCountBeyondTheShardsIsDataLoss) {
  const std::string path = dir_.path() + "/manifest.json";
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  auto manifest = ParseManifest(text.str(), path);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  manifest->num_samples = int64_t{1} << 50;
  manifest->shards.back().num_samples += manifest->num_samples - 6;
  std::ofstream(path) << ManifestToJson(*manifest);
  auto reader = ShardReader::Open(dir_.path());
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(reader.status().message(), HasSubstr("bytes hold at most"));
}

}  // namespace
}  // namespace trainctl::data
