// One JSONL training record (common/data/record_parser.h).
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "common/data/record_parser.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)trainctl::data::ParseRecord(absl::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
