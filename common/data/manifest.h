// manifest.json of a prepared shard directory: what was prepared, from what, with which settings,
// and for each shard file its sample count, size and CRC-32C. The manifest is written last (the
// directory appears by an atomic rename), so a directory with one is complete.
#ifndef TRAINCTL_COMMON_DATA_MANIFEST_H_
#define TRAINCTL_COMMON_DATA_MANIFEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainctl::data {

inline constexpr char kManifestFile[] = "manifest.json";
inline constexpr char kShardFormat[] = "trainctl-shards";
inline constexpr int kShardFormatVersion = 1;

// How image patches are stored; the loader always hands out float32.
enum class PatchDtype : uint32_t { kFloat32 = 0, kBfloat16 = 1 };

// "float32" or "bfloat16".
const char* PatchDtypeName(PatchDtype dtype);

struct ShardInfo {
  std::string file;  // relative to the shard directory
  int64_t num_samples = 0;
  int64_t bytes = 0;
  uint32_t crc32c = 0;  // of the whole file; written as 8 lowercase hex digits
};

// A record `trainctl prepare --skip_bad` left out.
struct SkippedRecord {
  std::string file;
  int64_t line = 0;  // 1-based
  std::string error;
};

struct DatasetManifest {
  PatchDtype patch_dtype = PatchDtype::kFloat32;
  int32_t pad_token_id = -1;  // the tokenizer's <|endoftext|>; -1 when unknown

  int64_t num_samples = 0;
  int64_t num_tokens = 0;
  int64_t num_label_tokens = 0;  // labels != -100
  int64_t num_images = 0;
  int64_t num_patches = 0;

  // How it was prepared (informational; the reader relies only on the fields above and shards).
  std::vector<std::string> inputs;
  std::string tokenizer;
  int64_t min_pixels = 0;
  int64_t max_pixels = 0;
  int64_t max_seq_len = 0;  // 0: no limit
  std::string overflow;     // "drop" or "truncate"
  int64_t records = 0;      // non-blank input lines
  int64_t skipped = 0;      // bad records left out (skip_bad)
  int64_t truncated = 0;    // samples cut to max_seq_len
  int64_t dropped = 0;      // over max_seq_len (drop), or nothing left to train on (truncate)
  std::vector<SkippedRecord> skipped_records;  // the first kMaxListedSkips of them

  std::vector<ShardInfo> shards;
};

inline constexpr size_t kMaxListedSkips = 1000;

std::string ManifestToJson(const DatasetManifest& manifest);

// INVALID_ARGUMENT naming `source` and the field when `text` is not a manifest of this format
// and version, or its counts are inconsistent (the shards' samples must add up to num_samples).
absl::StatusOr<DatasetManifest> ParseManifest(absl::string_view text, absl::string_view source);

}  // namespace trainctl::data

#endif  // TRAINCTL_COMMON_DATA_MANIFEST_H_
