// A whole file mapped read-only into memory; unmapped when destroyed. Not copyable.
#ifndef TRAINCTL_COMMON_DATA_INTERNAL_MAPPED_FILE_H_
#define TRAINCTL_COMMON_DATA_INTERNAL_MAPPED_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace trainctl::data::internal {

class MappedFile {
 public:
  // NOT_FOUND when `path` cannot be opened; INTERNAL when it cannot be mapped.
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  MappedFile(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  const uint8_t* data_;
  size_t size_;
};

}  // namespace trainctl::data::internal

#endif  // TRAINCTL_COMMON_DATA_INTERNAL_MAPPED_FILE_H_
