// manifest.json of a prepared shard directory (common/data/manifest.h); a manifest that
// parses is written back and must parse again.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "common/data/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto manifest = trainctl::data::ParseManifest(
      absl::string_view(reinterpret_cast<const char*>(data), size), "fuzz/manifest.json");
  if (!manifest.ok()) return 0;
  const std::string again = trainctl::data::ManifestToJson(*manifest);
  if (!trainctl::data::ParseManifest(again, "rewritten manifest.json").ok()) std::abort();
  return 0;
}
