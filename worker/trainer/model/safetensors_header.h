// The header of a safetensors file, parsed and checked without LibTorch: the 8-byte little-endian
// length, the JSON naming each tensor's dtype, shape and byte range, and the layout rules
// (known dtypes, size = product(shape) x dtype size, ranges that tile the data section exactly).
// SafetensorsFile (safetensors.h) opens files through it; the fuzz target tests/fuzz/
// safetensors_fuzz.cc feeds it arbitrary bytes, which is why it lives apart from the torch code.
//
// Everything here is a pure function of its arguments and safe to call from any thread.
#ifndef TRAINCTL_WORKER_TRAINER_MODEL_SAFETENSORS_HEADER_H_
#define TRAINCTL_WORKER_TRAINER_MODEL_SAFETENSORS_HEADER_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainctl::model {

// One tensor's entry in a header.
struct SafetensorInfo {
  std::string dtype;  // "F32", "BF16", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte range in the data section
  uint64_t end = 0;
};

struct SafetensorsHeader {
  std::map<std::string, SafetensorInfo> tensors;
  std::map<std::string, std::string> metadata;  // "__metadata__"
  uint64_t data_offset = 0;  // where the data section starts in the file: 8 + header length
};

// Bytes per element of a dtype this reader supports (F64, F32, F16, BF16, I64, I32, I16, I8, U8,
// BOOL); 0 for any other name.
size_t SafetensorsDtypeBytes(absl::string_view dtype);

// Parses and checks the header of the file whose `size` bytes start at `bytes` (the whole file:
// the data section's size is checked against the ranges). `path` names the file in messages.
// DATA_LOSS when the file is truncated or its header corrupt (naming the first tensor at fault);
// INVALID_ARGUMENT for a dtype this reader does not support.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(const char* bytes, uint64_t size,
                                                         const std::string& path);

}  // namespace trainctl::model

#endif  // TRAINCTL_WORKER_TRAINER_MODEL_SAFETENSORS_HEADER_H_
