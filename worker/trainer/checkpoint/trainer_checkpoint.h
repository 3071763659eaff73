// Single-rank training checkpoints: `<output_dir>/checkpoint-<step>/` holding the model in HF
// layout (model.safetensors + config.json, float32 master weights), the optimizer state
// (optimizer.pt), the CPU RNG state (rng.pt) and trainer_state.json (step, epoch, data-loader
// position), plus manifest.json written last, atomically, with each file's size and FNV-1a 64
// checksum. A directory without a manifest, or whose files do not match it, is incomplete:
// FindLatestCheckpoint skips it (and says why) in favour of the previous complete one.
#ifndef TRAINCTL_WORKER_TRAINER_CHECKPOINT_TRAINER_CHECKPOINT_H_
#define TRAINCTL_WORKER_TRAINER_CHECKPOINT_TRAINER_CHECKPOINT_H_

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/trainer/data/loader.h"
#include "worker/trainer/model/qwen2vl.h"

namespace trainctl::trainer {

struct TrainerState {
  int64_t global_step = 0;  // optimizer steps done
  double epoch = 0;         // fractional, as the HF Trainer reports it
  data::LoaderState loader;
};

// Writes checkpoint-<state.global_step> under `output_dir`. The manifest goes last, so a crash
// leaves an incomplete directory that loading ignores. Returns the directory.
absl::StatusOr<std::string> SaveCheckpoint(const std::string& output_dir, const TrainerState& state,
                                           const model::Qwen2VLForConditionalGeneration& model,
                                           torch::optim::Optimizer& optimizer);

// Verifies `dir` against its manifest and restores model weights, optimizer state and the RNG.
// NOT_FOUND without a manifest; DATA_LOSS naming the file whose size or checksum differs.
absl::StatusOr<TrainerState> LoadCheckpoint(const std::string& dir,
                                            model::Qwen2VLForConditionalGeneration& model,
                                            torch::optim::Optimizer& optimizer);

// The newest complete checkpoint under `output_dir`, verified; nullopt when there is none.
// `skipped` (optional) receives one line per incomplete or corrupt checkpoint passed over.
std::optional<std::string> FindLatestCheckpoint(const std::string& output_dir,
                                                std::vector<std::string>* skipped);

}  // namespace trainctl::trainer

#endif  // TRAINCTL_WORKER_TRAINER_CHECKPOINT_TRAINER_CHECKPOINT_H_
