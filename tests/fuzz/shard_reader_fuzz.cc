// Prepared shard files (common/data/shard_reader.h): the input is one shard file, written
// to a scratch directory next to a manifest that agrees with it on what the manifest can know
// (size, CRC-32C, patch dtype, and the sample count the footer claims), so that the fuzzer's
// inputs reach the checks of the shard's header, index and records. Every sample of a shard that
// opens is then read in full.
#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "common/data/internal/crc32c.h"
#include "common/data/manifest.h"
#include "common/data/shard_reader.h"

namespace {

namespace data = trainctl::data;

const std::string& ScratchDir() {
  static const std::string dir = [] {
    const char* tmp = getenv("TMPDIR");
    std::string pattern =
        std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/shard_reader_fuzz.XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    return pattern;
  }();
  return dir;
}

void WriteFile(const std::string& path, const void* data, size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || std::fwrite(data, 1, size, f) != size || std::fclose(f) != 0) {
    std::perror(path.c_str());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  data::DatasetManifest manifest;
  if (size >= 16) {
    uint32_t dtype = 0;
    std::memcpy(&dtype, bytes + 12, 4);
    manifest.patch_dtype = dtype == 1 ? data::PatchDtype::kBfloat16 : data::PatchDtype::kFloat32;
  }
  int64_t samples = 0;
  if (size >= 24) {
    std::memcpy(&samples, bytes + size - 24, 8);
    if (samples < 0) samples = 0;  // a manifest holds no negative count
  }
  data::ShardInfo shard;
  shard.file = "shard-00000.bin";
  shard.num_samples = samples;
  shard.bytes = static_cast<int64_t>(size);
  shard.crc32c = data::internal::Crc32c(bytes, size);
  manifest.num_samples = samples;
  manifest.shards.push_back(shard);

  const std::string& dir = ScratchDir();
  WriteFile(dir + "/" + shard.file, bytes, size);
  const std::string text = data::ManifestToJson(manifest);
  WriteFile(dir + "/" + data::kManifestFile, text.data(), text.size());

  auto reader = data::ShardReader::Open(dir);
  if (!reader.ok()) return 0;
  for (int64_t i = 0; i < (*reader)->size(); ++i) {
    auto sample = (*reader)->Get(i);
    if (!sample.ok()) std::abort();  // in range, so it must read
  }
  return 0;
}
