// Safetensors files (https://github.com/huggingface/safetensors): an 8-byte little-endian header
// length, a JSON header naming each tensor's dtype, shape and byte range, then the raw data.
//
// Reading memory-maps the file (copy-on-write, so a tensor handed out may be modified in place
// without touching the file) and validates the whole header before anything is returned: known
// dtypes, byte ranges that tile the data section exactly, size = product(shape) x dtype size.
// A truncated or corrupt file, a missing tensor or a dtype this reader does not know is an error
// naming the tensor and the file.
//
// Supported dtypes: F32, F16, BF16, F64 (converted on request), I64, I32, I16, I8, U8, BOOL
// (passed through).
//
// Thread-safety: a SafetensorsFile / SafetensorsCheckpoint is immutable after Open; its const
// methods may be called from several threads at once.
#ifndef TRAINCTL_WORKER_TRAINER_MODEL_SAFETENSORS_H_
#define TRAINCTL_WORKER_TRAINER_MODEL_SAFETENSORS_H_

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/trainer/model/safetensors_header.h"  // SafetensorInfo

namespace trainctl::model {

namespace internal {
class MappedFile;
}  // namespace internal

class SafetensorsFile {
 public:
  // Maps and validates `path`. NOT_FOUND when it cannot be opened; DATA_LOSS when it is
  // truncated or its header is corrupt (naming the first tensor whose bytes lie past the end);
  // INVALID_ARGUMENT for a dtype this reader does not support.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;                     // sorted
  const SafetensorInfo* Find(const std::string& name) const;  // nullptr when absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The tensor `name` on the CPU. Without `dtype`, or when it equals the stored dtype, the result
  // is a zero-copy view into the mapping (which it keeps alive) when the data is aligned;
  // otherwise a converted copy. NOT_FOUND naming tensor and file when absent.
  absl::StatusOr<torch::Tensor> Get(const std::string& name,
                                    std::optional<torch::ScalarType> dtype = std::nullopt) const;

 private:
  SafetensorsFile() = default;

  std::string path_;
  std::shared_ptr<internal::MappedFile> mapping_;
  const char* data_ = nullptr;  // start of the data section inside mapping_
  std::map<std::string, SafetensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint in HF's layout: one `model.safetensors`, or shards listed by
// `model.safetensors.index.json` ({"metadata": {...}, "weight_map": {name: file}}).
class SafetensorsCheckpoint {
 public:
  // `path`: a .safetensors file, an *.index.json, or a directory holding model.safetensors or
  // model.safetensors.index.json. NOT_FOUND when none is there; errors of SafetensorsFile::Open;
  // DATA_LOSS naming tensor and shard when the index lists a tensor its shard lacks.
  static absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> Open(const std::string& path);

  // The file (or index) that describes the whole checkpoint, for messages.
  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;  // sorted
  const SafetensorInfo* Find(const std::string& name) const;
  // The file holding `name`, or "" when absent.
  std::string FileOf(const std::string& name) const;
  // As SafetensorsFile::Get; NOT_FOUND naming tensor and checkpoint when absent.
  absl::StatusOr<torch::Tensor> Get(const std::string& name,
                                    std::optional<torch::ScalarType> dtype = std::nullopt) const;

 private:
  SafetensorsCheckpoint() = default;

  std::string path_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> owner_;  // tensor name -> index into files_
};

struct NamedTensor {
  std::string name;
  torch::Tensor tensor;
};

// Writes `tensors` (any device; stored as they are, contiguous, aligned) to `path`
// atomically (a temporary file renamed into place). `metadata` goes to "__metadata__"; "format":
// "pt" is added, as transformers expects. INVALID_ARGUMENT for an unsupported dtype or a duplicate
// name; INTERNAL with the path when the file cannot be written.
absl::Status WriteSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

struct ShardingOptions {
  // A new shard starts when the next tensor would take the current one past this size.
  uint64_t max_shard_bytes = uint64_t{5} << 30;
};

// Writes `tensors` into directory `dir` in HF's layout: `model.safetensors` when they fit in one
// shard, else `model-0000K-of-0000N.safetensors` plus `model.safetensors.index.json`. Removes a
// stale file of the other layout so that a reader cannot pick up old weights. Errors as
// WriteSafetensors.
absl::Status WriteSafetensorsCheckpoint(const std::string& dir,
                                        const std::vector<NamedTensor>& tensors,
                                        const ShardingOptions& options = {});

// "F32" etc. for a torch dtype; INVALID_ARGUMENT when safetensors has no name for it.
absl::StatusOr<std::string> SafetensorsDtypeName(torch::ScalarType dtype);

}  // namespace trainctl::model

#endif  // TRAINCTL_WORKER_TRAINER_MODEL_SAFETENSORS_H_
