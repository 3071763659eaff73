// Safetensors files (worker/trainer/model/safetensors_header.h): the whole input is the file.
// A header that passes must describe ranges inside the input, which the harness checks by reading
// every tensor's bytes (ASan reports a read past the end).
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "worker/trainer/model/safetensors_header.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto header = trainctl::model::ParseSafetensorsHeader(reinterpret_cast<const char*>(data), size,
                                                        "fuzz.safetensors");
  if (!header.ok()) return 0;
  uint8_t sum = 0;
  for (const auto& [name, info] : header->tensors) {
    if (header->data_offset + info.end > size) std::abort();  // the parser let a range escape
    for (uint64_t i = info.begin; i < info.end; ++i) sum ^= data[header->data_offset + i];
  }
  volatile uint8_t sink = sum;
  (void)sink;
  return 0;
}
