#include "worker/trainer/model/safetensors_header.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace trainctl::model {
namespace {

using nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;  // safetensors' own limit

struct DtypeSize {
  const char* name;
  size_t bytes;
};
constexpr DtypeSize kDtypeSizes[] = {
    {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},
    {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1},
};

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Parses one tensor entry of the header.
absl::StatusOr<SafetensorInfo> ParseEntry(const std::string& name, const json& entry,
                                          const std::string& path) {
  auto corrupt = [&](const std::string& what) {
    return absl::DataLossError(
        absl::StrCat("tensor ", name, " in ", path, ": corrupt header: ", what));
  };
  if (!entry.is_object()) return corrupt("entry is not an object");
  SafetensorInfo info;
  if (!entry.contains("dtype") || !entry["dtype"].is_string()) return corrupt("no dtype");
  info.dtype = entry["dtype"].get<std::string>();
  const size_t dtype_bytes = SafetensorsDtypeBytes(info.dtype);
  if (dtype_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", name, " in ", path, ": unsupported dtype ", info.dtype));
  }
  if (!entry.contains("shape") || !entry["shape"].is_array()) return corrupt("no shape");
  uint64_t numel = 1;
  for (const json& d : entry["shape"]) {
    if (!d.is_number_unsigned()) return corrupt("shape holds a non-integer or negative size");
    const uint64_t size = d.get<uint64_t>();
    if (size > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        (size != 0 && numel > std::numeric_limits<uint64_t>::max() / size)) {
      return corrupt("shape overflows");
    }
    numel *= size;
    info.shape.push_back(static_cast<int64_t>(size));
  }
  const json& offsets = entry.contains("data_offsets") ? entry["data_offsets"] : json();
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    return corrupt("data_offsets must be two non-negative integers");
  }
  info.begin = offsets[0].get<uint64_t>();
  info.end = offsets[1].get<uint64_t>();
  if (info.end < info.begin) return corrupt("data_offsets end before they begin");
  if (numel > std::numeric_limits<uint64_t>::max() / dtype_bytes ||
      info.end - info.begin != numel * dtype_bytes) {
    return corrupt(absl::StrCat("shape ", ShapeString(info.shape), " of ", info.dtype, " needs ",
                                numel * dtype_bytes, " bytes but data_offsets span ",
                                info.end - info.begin));
  }
  return info;
}

// Checks that the byte ranges tile [0, data_size) exactly, as safetensors requires.
absl::Status CheckLayout(const std::map<std::string, SafetensorInfo>& tensors, uint64_t data_size,
                         const std::string& path) {
  std::vector<std::pair<uint64_t, const std::string*>> order;
  for (const auto& [name, info] : tensors) order.emplace_back(info.begin, &name);
  std::sort(order.begin(), order.end(), [&tensors](const auto& a, const auto& b) {
    if (a.first != b.first) return a.first < b.first;
    return tensors.at(*a.second).end < tensors.at(*b.second).end;
  });
  uint64_t expected = 0;
  for (const auto& [begin, name] : order) {
    const SafetensorInfo& info = tensors.at(*name);
    if (info.end > data_size) {
      return absl::DataLossError(absl::StrFormat(
          "tensor %s in %s: its bytes [%d, %d) lie past the end of the data section (%d bytes); "
          "the file is truncated",
          *name, path, info.begin, info.end, data_size));
    }
    if (begin != expected) {
      return absl::DataLossError(absl::StrFormat(
          "tensor %s in %s: corrupt header: data starts at byte %d, expected %d (ranges must be "
          "contiguous and not overlap)",
          *name, path, begin, expected));
    }
    expected = info.end;
  }
  if (expected != data_size) {
    return absl::DataLossError(absl::StrFormat(
        "%s: corrupt file: %d bytes after the last tensor's data", path, data_size - expected));
  }
  return absl::OkStatus();
}

}  // namespace

size_t SafetensorsDtypeBytes(absl::string_view dtype) {
  for (const DtypeSize& e : kDtypeSizes) {
    if (dtype == e.name) return e.bytes;
  }
  return 0;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(const char* bytes, uint64_t size,
                                                         const std::string& path) {
  if (size < 8) {
    return absl::DataLossError(absl::StrCat(
        path, ": truncated: ", size, " bytes, too short for a safetensors header"));
  }
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes, 8);  // little-endian: the caller checks the host
  if (header_size > kMaxHeaderBytes) {
    return absl::DataLossError(
        absl::StrCat(path, ": corrupt: header length ", header_size, " exceeds the 100 MiB limit"));
  }
  if (header_size > size - 8) {
    return absl::DataLossError(absl::StrCat(path, ": truncated: header length ", header_size,
                                            " but only ", size - 8, " bytes follow"));
  }
  json doc = json::parse(bytes + 8, bytes + 8 + header_size, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::DataLossError(absl::StrCat(path, ": corrupt: header is not a JSON object"));
  }
  SafetensorsHeader header;
  for (const auto& [name, entry] : doc.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) {
        return absl::DataLossError(absl::StrCat(path, ": corrupt: __metadata__ is not an object"));
      }
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          return absl::DataLossError(
              absl::StrCat(path, ": corrupt: __metadata__.", key, " is not a string"));
        }
        header.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    ASSIGN_OR_RETURN(SafetensorInfo info, ParseEntry(name, entry, path));
    header.tensors.emplace(name, std::move(info));
  }
  header.data_offset = 8 + header_size;
  RETURN_IF_ERROR(CheckLayout(header.tensors, size - header.data_offset, path));
  return header;
}

}  // namespace trainctl::model
