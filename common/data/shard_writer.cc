#include "common/data/shard_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/data/internal/crc32c.h"
#include "common/data/internal/shard_layout.h"
#include "common/tokenizer/chat_template.h"

namespace trainctl::data {
namespace {

constexpr size_t kBufferBytes = size_t{4} << 20;
static_assert(sizeof(std::array<int32_t, 3>) == 12, "grids are written as packed int32 triples");

absl::Status IoError(absl::string_view what, const std::string& path, int err) {
  const std::string message = absl::StrCat("cannot ", what, " ", path, ": ", std::strerror(err));
  return err == ENOSPC || err == EDQUOT ? absl::ResourceExhaustedError(message)
                                        : absl::InternalError(message);
}

absl::Status CheckSample(const Sample& s) {
  if (s.labels.size() != s.input_ids.size()) {
    return absl::InvalidArgumentError(absl::StrCat("sample has ", s.input_ids.size(),
                                                   " input ids but ", s.labels.size(), " labels"));
  }
  if (s.input_ids.size() > UINT32_MAX || s.image_grid_thw.size() > UINT32_MAX / 3 ||
      s.solution.size() > UINT32_MAX) {
    return absl::InvalidArgumentError("sample too large for the shard format");
  }
  uint64_t patches = 0;
  for (const auto& g : s.image_grid_thw) {
    if (g[0] < 1 || g[1] < 2 || g[2] < 2 || g[1] % 2 != 0 || g[2] % 2 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("image grid (", g[0], ", ", g[1], ", ", g[2],
                       ") is not positive with even height and width"));
    }
    patches += uint64_t(g[0]) * uint64_t(g[1]) * uint64_t(g[2]);
  }
  if (patches > UINT32_MAX || s.pixel_values.size() != patches * kPatchDim) {
    return absl::InvalidArgumentError(absl::StrCat("sample has ", s.pixel_values.size(),
                                                   " pixel values; its grids need ",
                                                   patches * kPatchDim));
  }
  return absl::OkStatus();
}

}  // namespace

ShardWriter::ShardWriter(std::string dir, ShardWriterOptions options)
    : dir_(std::move(dir)), options_(options) {}

ShardWriter::~ShardWriter() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status ShardWriter::Flush() {
  size_t done = 0;
  while (done < buffer_.size()) {
    const ssize_t n = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return IoError("write", path_, errno);
    done += static_cast<size_t>(n);
  }
  buffer_.clear();
  return absl::OkStatus();
}

absl::Status ShardWriter::Write(const void* data, size_t size) {
  if (size == 0) return absl::OkStatus();
  crc_ = internal::Crc32cExtend(crc_, data, size);
  offset_ += size;
  buffer_.append(static_cast<const char*>(data), size);
  return buffer_.size() >= kBufferBytes ? Flush() : absl::OkStatus();
}

absl::Status ShardWriter::OpenShard() {
  path_ = absl::StrFormat("%s/shard-%05d.bin", dir_, shards_.size());
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) return IoError("create", path_, errno);
  offset_ = 0;
  crc_ = 0;
  record_offsets_.clear();
  buffer_.reserve(kBufferBytes + (size_t{1} << 16));
  const uint32_t header[2] = {internal::kShardVersion, static_cast<uint32_t>(options_.patch_dtype)};
  if (absl::Status s = Write(internal::kShardMagic, 8); !s.ok()) return s;
  return Write(header, sizeof(header));
}

absl::Status ShardWriter::CloseShard() {
  const uint64_t index_offset = offset_;
  record_offsets_.push_back(index_offset);
  if (absl::Status s = Write(record_offsets_.data(), record_offsets_.size() * 8); !s.ok()) {
    return s;
  }
  const uint64_t footer[2] = {record_offsets_.size() - 1, index_offset};
  if (absl::Status s = Write(footer, sizeof(footer)); !s.ok()) return s;
  if (absl::Status s = Write(internal::kShardEndMagic, 8); !s.ok()) return s;
  if (absl::Status s = Flush(); !s.ok()) return s;
  if (::fsync(fd_) != 0) return IoError("fsync", path_, errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return IoError("close", path_, errno);
  ShardInfo info;
  info.file = path_.substr(dir_.size() + 1);
  info.num_samples = static_cast<int64_t>(record_offsets_.size() - 1);
  info.bytes = static_cast<int64_t>(offset_);
  info.crc32c = crc_;
  shards_.push_back(std::move(info));
  return absl::OkStatus();
}

absl::Status ShardWriter::Add(const Sample& sample) {
  if (absl::Status s = CheckSample(sample); !s.ok()) return s;
  if (fd_ < 0) {
    if (absl::Status s = OpenShard(); !s.ok()) return s;
  }
  internal::RecordHeader header;
  header.num_tokens = static_cast<uint32_t>(sample.input_ids.size());
  header.num_images = static_cast<uint32_t>(sample.image_grid_thw.size());
  header.num_patches = static_cast<uint32_t>(sample.pixel_values.size() / kPatchDim);
  header.solution_bytes = static_cast<uint32_t>(sample.solution.size());
  record_offsets_.push_back(offset_);
  absl::Status s = Write(&header, sizeof(header));
  if (s.ok()) s = Write(sample.input_ids.data(), sample.input_ids.size() * 4);
  if (s.ok()) s = Write(sample.labels.data(), sample.labels.size() * 4);
  if (s.ok()) s = Write(sample.image_grid_thw.data(), sample.image_grid_thw.size() * 12);
  if (s.ok() && options_.patch_dtype == PatchDtype::kFloat32) {
    s = Write(sample.pixel_values.data(), sample.pixel_values.size() * 4);
  } else if (s.ok()) {
    std::vector<uint16_t> half(sample.pixel_values.size());
    for (size_t i = 0; i < half.size(); ++i) {
      half[i] = internal::FloatToBf16(sample.pixel_values[i]);
    }
    s = Write(half.data(), half.size() * 2);
  }
  if (s.ok()) s = Write(sample.solution.data(), sample.solution.size());
  static constexpr char kZeros[internal::kRecordAlign] = {};
  if (s.ok()) s = Write(kZeros, internal::AlignUp(offset_) - offset_);
  if (!s.ok()) return s;

  totals_.num_samples += 1;
  totals_.num_tokens += header.num_tokens;
  for (const int32_t label : sample.labels) {
    totals_.num_label_tokens += label != tokenizer::kIgnoreLabel;
  }
  totals_.num_images += header.num_images;
  totals_.num_patches += header.num_patches;
  if (static_cast<int64_t>(offset_) >= options_.shard_size_bytes) return CloseShard();
  return absl::OkStatus();
}

absl::StatusOr<DatasetManifest> ShardWriter::Finish(DatasetManifest manifest) {
  if (fd_ >= 0) {
    if (absl::Status s = CloseShard(); !s.ok()) return s;
  }
  manifest.patch_dtype = options_.patch_dtype;
  manifest.num_samples = totals_.num_samples;
  manifest.num_tokens = totals_.num_tokens;
  manifest.num_label_tokens = totals_.num_label_tokens;
  manifest.num_images = totals_.num_images;
  manifest.num_patches = totals_.num_patches;
  manifest.shards = shards_;
  const std::string text = ManifestToJson(manifest);
  path_ = absl::StrCat(dir_, "/", kManifestFile);
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) return IoError("create", path_, errno);
  buffer_ = text;
  absl::Status s = Flush();
  if (s.ok() && ::fsync(fd_) != 0) s = IoError("fsync", path_, errno);
  ::close(fd_);
  fd_ = -1;
  if (!s.ok()) return s;
  return manifest;
}

}  // namespace trainctl::data
