// DeepSpeed config documents (common/deepspeed_config.h): parsed, then resolved against a few
// fixed sets of job flags (one GPU with the hidden size known; many ranks with fp16 and every
// "auto" deferred), as the coordinator and the trainer resolve them.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/deepspeed_config.h"

namespace {

trainctl::DeepSpeedInputs SingleRank() {
  trainctl::DeepSpeedInputs in;
  in.micro_batch = 4;
  in.bf16 = true;
  in.hidden_size = 1536;
  in.total_steps = 1000;
  in.warmup_steps = 30;
  return in;
}

trainctl::DeepSpeedInputs ManyRanks() {
  trainctl::DeepSpeedInputs in;
  in.world_size = 16;
  in.micro_batch = 1;
  in.grad_accum = 8;
  in.fp16 = true;
  in.learning_rate = 1e-6;
  return in;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto doc = trainctl::ParseDeepSpeedJson(
      std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.json");
  if (!doc.ok()) return 0;
  static const trainctl::DeepSpeedInputs kInputs[] = {SingleRank(), ManyRanks()};
  for (const trainctl::DeepSpeedInputs& in : kInputs) {
    (void)trainctl::ResolveDeepSpeedConfig(*doc, in);
  }
  return 0;
}
