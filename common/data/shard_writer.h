// Writes prepared samples into shard files (layout in internal/shard_layout.h) and,
// at Finish, the manifest. `trainctl prepare` writes through it into a temporary directory that
// it then renames into place; tests use it to make shards of synthetic samples.
//
// Not thread-safe: one writer per directory, used from one thread.
#ifndef TRAINCTL_COMMON_DATA_SHARD_WRITER_H_
#define TRAINCTL_COMMON_DATA_SHARD_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/data/batch.h"
#include "common/data/manifest.h"

namespace trainctl::data {

struct ShardWriterOptions {
  PatchDtype patch_dtype = PatchDtype::kFloat32;
  // A shard is closed once it holds at least this many bytes (a larger sample gets one alone).
  int64_t shard_size_bytes = int64_t{256} << 20;
};

class ShardWriter {
 public:
  // Shards are written as `dir`/shard-NNNNN.bin; `dir` must exist.
  ShardWriter(std::string dir, ShardWriterOptions options);
  // Closes an open shard without finishing it; the caller discards the directory.
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Appends `sample`, its solution included. INVALID_ARGUMENT when it is inconsistent (labels not
  // as long as input_ids, a grid that is not positive with even h and w, pixel_values not
  // sum(t*h*w) * kPatchDim floats, a solution of 4 GiB or more); INTERNAL (RESOURCE_EXHAUSTED on
  // a full disk) naming the file when writing fails.
  absl::Status Add(const Sample& sample);

  // Closes the last shard (fsynced), fills `manifest`'s shards, counts and patch dtype from what
  // was written, and writes it as `dir`/manifest.json. Returns the manifest written.
  absl::StatusOr<DatasetManifest> Finish(DatasetManifest manifest);

 private:
  absl::Status OpenShard();
  absl::Status CloseShard();
  absl::Status Write(const void* data, size_t size);
  absl::Status Flush();

  const std::string dir_;
  const ShardWriterOptions options_;
  int fd_ = -1;
  std::string path_;     // of the open shard
  std::string buffer_;   // bytes not yet written to fd_
  uint64_t offset_ = 0;  // bytes of the open shard so far
  uint32_t crc_ = 0;     // of those bytes
  std::vector<uint64_t> record_offsets_;
  std::vector<ShardInfo> shards_;
  DatasetManifest totals_;  // counts only
};

}  // namespace trainctl::data

#endif  // TRAINCTL_COMMON_DATA_SHARD_WRITER_H_
