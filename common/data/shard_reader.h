// Read access to a prepared shard directory: the manifest, then every shard memory-mapped. Open
// checks each shard's size against the manifest, its CRC-32C (unless told not to), and the
// structure of its index and records, so a truncated or corrupted shard is refused at open,
// naming the shard, rather than read as garbage later. Shards of format version 2 (with
// solutions) and 1 (without: every solution reads empty) are read alike.
//
// Thread-safe after Open: every method is const; the mappings live as long as the reader.
#ifndef TRAINCTL_COMMON_DATA_SHARD_READER_H_
#define TRAINCTL_COMMON_DATA_SHARD_READER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/data/batch.h"
#include "common/data/manifest.h"

namespace trainctl::data {

namespace internal {
class MappedFile;
}

struct ShardReaderOptions {
  // Reads every byte once at open to check the CRC-32C; off skips that pass (the structure is
  // still checked).
  bool verify_checksums = true;
};

// One sample in place, in the mapped shard. Valid while the reader lives.
struct SampleView {
  int64_t num_tokens = 0;
  int64_t num_images = 0;
  int64_t num_patches = 0;
  const int32_t* input_ids = nullptr;       // [num_tokens]
  const int32_t* labels = nullptr;          // [num_tokens]
  const int32_t* image_grid_thw = nullptr;  // [num_images * 3]
  const void* patches = nullptr;            // [num_patches * kPatchDim] of patch_dtype
  PatchDtype patch_dtype = PatchDtype::kFloat32;
  absl::string_view solution;  // UTF-8 (Sample::solution); empty in a version-1 shard

  // Writes the patches as float32 (widening bfloat16) to dst[0, num_patches * kPatchDim).
  void CopyPatches(float* dst) const;
};

class ShardReader {
 public:
  // Opens `dir`. NOT_FOUND when it has no manifest.json or a listed shard is missing;
  // INVALID_ARGUMENT for a malformed manifest; DATA_LOSS naming the shard file when a shard's size
  // differs from the manifest's (truncated), its checksum does not match (corrupted), or its
  // header, index or records are inconsistent.
  static absl::StatusOr<std::unique_ptr<ShardReader>> Open(const std::string& dir,
                                                           const ShardReaderOptions& options = {});
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  int64_t size() const { return static_cast<int64_t>(records_.size()); }
  const DatasetManifest& manifest() const { return manifest_; }
  const std::string& dir() const { return dir_; }

  // Sample `i` copied out (patches as float32). OUT_OF_RANGE unless 0 <= i < size().
  absl::StatusOr<Sample> Get(int64_t i) const;

  // Sample `i` in place; `i` must be in [0, size()).
  SampleView View(int64_t i) const;

  // Tokens of sample `i` (without touching the rest of it); `i` must be in [0, size()).
  int64_t NumTokens(int64_t i) const;

 private:
  ShardReader() = default;
  absl::Status OpenShard(const ShardInfo& info, const ShardReaderOptions& options);

  std::string dir_;
  DatasetManifest manifest_;
  std::vector<std::unique_ptr<internal::MappedFile>> files_;
  std::vector<const uint8_t*> records_;  // start of each sample's record, over all shards
};

}  // namespace trainctl::data

#endif  // TRAINCTL_COMMON_DATA_SHARD_READER_H_
