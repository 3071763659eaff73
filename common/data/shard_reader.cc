#include "common/data/shard_reader.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/data/internal/crc32c.h"
#include "common/data/internal/mapped_file.h"
#include "common/data/internal/shard_layout.h"

namespace trainctl::data {
namespace {

using internal::RecordHeader;

RecordHeader HeaderAt(const uint8_t* record) {
  RecordHeader h;
  std::memcpy(&h, record, sizeof(h));
  return h;
}

uint64_t U64At(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// The records of a mapped shard, checked against its own header, index and footer.
absl::StatusOr<std::vector<const uint8_t*>> ParseShard(const uint8_t* data, uint64_t size,
                                                       PatchDtype dtype, int64_t expected,
                                                       const std::string& path) {
  auto corrupt = [&path](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("shard ", path, " is corrupted: ", what));
  };
  if (size < internal::kShardHeaderBytes + 8 + internal::kShardFooterBytes) {
    return corrupt("too short");
  }
  if (std::memcmp(data, internal::kShardMagic, 8) != 0) return corrupt("bad magic");
  uint32_t header[2];
  std::memcpy(header, data + 8, sizeof(header));
  const uint32_t version = header[0];
  if (version != internal::kShardVersion && version != internal::kShardVersionNoSolution) {
    return corrupt(absl::StrCat("format version ", version, ", expected ",
                                internal::kShardVersionNoSolution, " to ",
                                internal::kShardVersion));
  }
  if (header[1] != static_cast<uint32_t>(dtype)) {
    return corrupt("patch dtype differs from the manifest's");
  }
  const uint8_t* footer = data + size - internal::kShardFooterBytes;
  if (std::memcmp(footer + 16, internal::kShardEndMagic, 8) != 0) return corrupt("bad end magic");
  const uint64_t n = U64At(footer);
  const uint64_t index_offset = U64At(footer + 8);
  if (static_cast<int64_t>(n) != expected) {
    return corrupt(absl::StrCat(n, " samples, the manifest says ", expected));
  }
  if (index_offset < internal::kShardHeaderBytes || index_offset % 8 != 0 ||
      index_offset > size - internal::kShardFooterBytes ||
      (size - internal::kShardFooterBytes - index_offset) / 8 != n + 1 ||
      (size - internal::kShardFooterBytes - index_offset) % 8 != 0) {
    return corrupt("index does not fit the file");
  }
  std::vector<const uint8_t*> records;
  records.reserve(n);
  const uint8_t* index = data + index_offset;
  uint64_t expected_start = internal::kShardHeaderBytes;
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t start = U64At(index + i * 8);
    const uint64_t end = U64At(index + (i + 1) * 8);
    if (start != expected_start || end <= start || end > index_offset ||
        end - start < sizeof(RecordHeader)) {
      return corrupt(absl::StrCat("index entry ", i, " is out of order"));
    }
    const RecordHeader h = HeaderAt(data + start);
    if (version == internal::kShardVersionNoSolution && h.solution_bytes != 0) {
      return corrupt(absl::StrCat("record ", i, " sets the reserved field of format version 1"));
    }
    if (internal::AlignUp(internal::RecordBytes(h, dtype)) != end - start) {
      return corrupt(absl::StrCat("record ", i, " does not match its size"));
    }
    const int32_t* grid = reinterpret_cast<const int32_t*>(data + start + sizeof(RecordHeader) +
                                                           uint64_t{h.num_tokens} * 8);
    uint64_t patches = 0;
    for (uint32_t k = 0; k < h.num_images; ++k) {
      const int32_t* g = grid + k * 3;
      if (g[0] < 1 || g[1] < 1 || g[2] < 1) {
        return corrupt(absl::StrCat("record ", i, " has a bad image grid"));
      }
      patches += uint64_t(g[0]) * uint64_t(g[1]) * uint64_t(g[2]);
    }
    if (patches != h.num_patches) {
      return corrupt(absl::StrCat("record ", i, " has grids that do not add up to its patches"));
    }
    records.push_back(data + start);
    expected_start = end;
  }
  if (expected_start != index_offset) return corrupt("records do not end at the index");
  return records;
}

absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

void SampleView::CopyPatches(float* dst) const {
  const size_t count = static_cast<size_t>(num_patches * kPatchDim);
  if (count == 0) return;
  if (patch_dtype == PatchDtype::kFloat32) {
    std::memcpy(dst, patches, count * 4);
    return;
  }
  const uint8_t* src = static_cast<const uint8_t*>(patches);
  for (size_t i = 0; i < count; ++i) {
    uint16_t h;
    std::memcpy(&h, src + i * 2, 2);
    dst[i] = internal::Bf16ToFloat(h);
  }
}

ShardReader::~ShardReader() = default;

absl::Status ShardReader::OpenShard(const ShardInfo& info, const ShardReaderOptions& options) {
  const std::string path = absl::StrCat(dir_, "/", info.file);
  auto file = internal::MappedFile::Open(path);
  if (!file.ok()) return file.status();
  const uint64_t size = (*file)->size();
  if (size != static_cast<uint64_t>(info.bytes)) {
    return absl::DataLossError(
        absl::StrCat("shard ", path, " is ", size, " bytes, the manifest ", "says ", info.bytes,
                     size < static_cast<uint64_t>(info.bytes) ? " (truncated)" : ""));
  }
  if (options.verify_checksums) {
    const uint32_t crc = internal::Crc32c((*file)->data(), size);
    if (crc != info.crc32c) {
      return absl::DataLossError(absl::StrFormat(
          "shard %s is corrupted: crc32c %08x, the manifest says %08x", path, crc, info.crc32c));
    }
  }
  auto records = ParseShard((*file)->data(), size, manifest_.patch_dtype, info.num_samples, path);
  if (!records.ok()) return records.status();
  records_.insert(records_.end(), records->begin(), records->end());
  files_.push_back(std::move(*file));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ShardReader>> ShardReader::Open(const std::string& dir,
                                                               const ShardReaderOptions& options) {
  const std::string manifest_path = absl::StrCat(dir, "/", kManifestFile);
  auto text = ReadText(manifest_path);
  if (!text.ok()) {
    return absl::NotFoundError(absl::StrCat(
        manifest_path, " not found: not a prepared shard directory (run `trainctl prepare`)"));
  }
  auto manifest = ParseManifest(*text, manifest_path);
  if (!manifest.ok()) return manifest.status();
  std::unique_ptr<ShardReader> reader(new ShardReader());
  reader->dir_ = dir;
  reader->manifest_ = std::move(*manifest);
  // Every record takes at least its header: a manifest claiming more samples than its shards'
  // bytes can hold is corrupt (and must not size an allocation).
  uint64_t shard_bytes = 0;
  for (const ShardInfo& info : reader->manifest_.shards) {
    shard_bytes += static_cast<uint64_t>(info.bytes);
  }
  if (static_cast<uint64_t>(reader->manifest_.num_samples) > shard_bytes / sizeof(RecordHeader)) {
    return absl::DataLossError(absl::StrCat(
        manifest_path, ": num_samples is ", reader->manifest_.num_samples, " but its shards' ",
        shard_bytes, " bytes hold at most ", shard_bytes / sizeof(RecordHeader), " records"));
  }
  reader->records_.reserve(static_cast<size_t>(reader->manifest_.num_samples));
  for (const ShardInfo& info : reader->manifest_.shards) {
    if (absl::Status s = reader->OpenShard(info, options); !s.ok()) return s;
  }
  return reader;
}

SampleView ShardReader::View(int64_t i) const {
  const uint8_t* record = records_[static_cast<size_t>(i)];
  const RecordHeader h = HeaderAt(record);
  SampleView v;
  v.num_tokens = h.num_tokens;
  v.num_images = h.num_images;
  v.num_patches = h.num_patches;
  const uint8_t* p = record + sizeof(RecordHeader);
  v.input_ids = reinterpret_cast<const int32_t*>(p);
  v.labels = v.input_ids + h.num_tokens;
  v.image_grid_thw = v.labels + h.num_tokens;
  v.patches = v.image_grid_thw + uint64_t{h.num_images} * 3;
  v.patch_dtype = manifest_.patch_dtype;
  v.solution = absl::string_view(
      reinterpret_cast<const char*>(record) + internal::RecordBytesBeforeSolution(h, v.patch_dtype),
      h.solution_bytes);
  return v;
}

int64_t ShardReader::NumTokens(int64_t i) const {
  return HeaderAt(records_[static_cast<size_t>(i)]).num_tokens;
}

absl::StatusOr<Sample> ShardReader::Get(int64_t i) const {
  if (i < 0 || i >= size()) {
    return absl::OutOfRangeError(
        absl::StrCat("sample ", i, " of ", size(), " in ", dir_, " does not exist"));
  }
  const SampleView v = View(i);
  Sample s;
  s.input_ids.assign(v.input_ids, v.input_ids + v.num_tokens);
  s.labels.assign(v.labels, v.labels + v.num_tokens);
  s.image_grid_thw.resize(static_cast<size_t>(v.num_images));
  for (int64_t k = 0; k < v.num_images; ++k) {
    std::memcpy(s.image_grid_thw[k].data(), v.image_grid_thw + k * 3, 12);
  }
  s.pixel_values.resize(static_cast<size_t>(v.num_patches * kPatchDim));
  v.CopyPatches(s.pixel_values.data());
  s.solution = std::string(v.solution);
  return s;
}

}  // namespace trainctl::data
