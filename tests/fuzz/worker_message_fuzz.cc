// What a worker sends on its session (proto/trainctl/v1/worker.proto): bytes that parse as a
// WorkerMessage go through the checks the coordinator runs on every message it receives
// (common/worker_limits.h), register included (NodeRegistry runs CheckRegisterWorker).
#include <cstddef>
#include <cstdint>

#include "common/worker_limits.h"
#include "trainctl/v1/worker.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  trainctl::v1::WorkerMessage message;
  if (!message.ParseFromArray(data, static_cast<int>(size))) return 0;
  if (message.has_register_()) (void)trainctl::CheckRegisterWorker(message.register_());
  (void)trainctl::CheckWorkerMessage(message);
  return 0;
}
