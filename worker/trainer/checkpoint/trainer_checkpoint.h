// Training checkpoints of any ZeRO stage and world size: `<output_dir>/checkpoint-<step>/` holds
//   rank-<r>.safetensors  one per rank: the unit slices that rank owns (fp32 master weights and
//                         AdamW moments, "<unit>.<kind>"), its RNG state and data-loader position;
//   trainer_state.json    step, epoch, world size, stage, the engine's optimizer step and loss
//                         scaler, and every unit's parameters (names, shapes) — the layout;
//   model.safetensors + config.json   the full model in HF's layout (the working weights, in the
//                         compute dtype) unless stage 3 without stage3_gather_16bit_weights_on_
//                         model_save; plus the tokenizer files of the model it started from;
//   manifest.json         written last by rank 0, after every rank finished, atomically: each
//                         file's size and FNV-1a 64 checksum.
// A directory without a manifest, or whose files do not match it, is incomplete:
// FindLatestCheckpoint skips it (and says why) in favour of the previous complete one.
//
// Loading re-partitions: each rank reads the element ranges it owns now from whichever saved
// ranks' files hold them, so a checkpoint saved on 4 ranks resumes on 2 (or at another stage)
// with no conversion step.
#ifndef TRAINCTL_WORKER_TRAINER_CHECKPOINT_TRAINER_CHECKPOINT_H_
#define TRAINCTL_WORKER_TRAINER_CHECKPOINT_TRAINER_CHECKPOINT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/data/loader.h"
#include "worker/trainer/zero/engine.h"

namespace trainctl::trainer {

struct TrainerState {
  int64_t global_step = 0;  // optimizer steps done
  double epoch = 0;         // fractional, as the HF Trainer reports it
  data::LoaderState loader;
};

struct SaveOptions {
  bool write_hf_weights = true;  // model.safetensors + config.json
  std::string tokenizer_dir;     // tokenizer files copied from here when present
  // The ranks the data is dealt to: the world size over the sequence-parallel size (whose groups
  // share their batches); 0: the world size.
  int data_ranks = 0;
};

// Collective: every rank of `engine` calls it. Writes checkpoint-<state.global_step> under
// `output_dir` and returns the directory.
absl::StatusOr<std::string> SaveCheckpoint(const std::string& output_dir, const TrainerState& state,
                                           zero::Engine& engine, const SaveOptions& options);

// Collective. Verifies `dir` against its manifest and restores the engine's slices, the RNG (when
// the world size is unchanged) and this rank's data-loader position (re-dealt when the ranks the
// data is dealt to changed; `data_ranks` as SaveOptions', 0: the world size).
// NOT_FOUND without a manifest; DATA_LOSS naming the file whose size or checksum differs;
// FAILED_PRECONDITION naming the unit when the checkpoint's model differs from the engine's.
absl::StatusOr<TrainerState> LoadCheckpoint(const std::string& dir, zero::Engine& engine,
                                            int data_ranks = 0);

// The newest complete checkpoint under `output_dir`, verified; nullopt when there is none.
// `skipped` (optional) receives one line per incomplete or corrupt checkpoint passed over.
std::optional<std::string> FindLatestCheckpoint(const std::string& output_dir,
                                                std::vector<std::string>* skipped);

// Offline: assembles the full fp32 (or `dtype`) weights of checkpoint `dir` from its rank files
// and writes them in HF's layout (model.safetensors, config.json, tokenizer files) into `out_dir`.
absl::Status ExportCheckpoint(const std::string& dir, const std::string& out_dir,
                              torch::ScalarType dtype = torch::kFloat32);

}  // namespace trainctl::trainer

#endif  // TRAINCTL_WORKER_TRAINER_CHECKPOINT_TRAINER_CHECKPOINT_H_
