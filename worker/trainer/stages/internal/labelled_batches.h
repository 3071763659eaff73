// What the stages that train on labelled data (SFT, logit distillation) share: this rank's
// loader, one step's micro-batches with the global counts that normalise the loss, and a model's
// logits at a batch's trained positions only.
#ifndef TRAINCTL_WORKER_TRAINER_STAGES_INTERNAL_LABELLED_BATCHES_H_
#define TRAINCTL_WORKER_TRAINER_STAGES_INTERNAL_LABELLED_BATCHES_H_

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/data/batch.h"
#include "common/data/loader.h"
#include "common/data/shard_reader.h"
#include "worker/trainer/model/qwen2vl.h"
#include "worker/trainer/stages/loop.h"

namespace trainctl::trainer::internal {

// Prepared shards hold patches already resized by `trainctl prepare --min_pixels --max_pixels`,
// so the job's training.min_pixels/max_pixels (HF's processor settings, as open-r1-multimodal and
// VLM-R1 pass them) must be the ones the shards were prepared with. FAILED_PRECONDITION naming
// the field and both values when they differ; shards that recorded none (0) pass.
absl::Status CheckPreparedPixels(const StageContext& ctx, const data::ShardReader& reader);

// The loader of spec.data_path dealing this rank its share, per_device_train_batch_size rows a
// batch, shuffled from training.seed. Checks the shards' pixels as CheckPreparedPixels.
absl::StatusOr<std::unique_ptr<data::Loader>> RankLoader(const StageContext& ctx);

struct MicroBatches {
  std::vector<data::Batch> batches;  // gradient_accumulation_steps of them
  double label_tokens = 0;           // trained tokens of every rank's micro-batches (>= 1)
  int64_t tokens = 0;                // tokens of every rank's micro-batches
  int64_t samples = 0;               // samples of every rank's micro-batches
};

// The next step's micro-batches and the counts summed over ranks (collective).
absl::StatusOr<MicroBatches> NextMicroBatches(StageContext& ctx, data::Loader& loader);

// The trained (shifted) labels of `batch`, flattened, and the positions where they are not -100.
struct TrainedPositions {
  torch::Tensor labels;     // [batch * (seq_len - 1)] int64 on the device
  torch::Tensor positions;  // indices into labels of the trained ones
};
TrainedPositions Trained(const StageContext& ctx, const data::Batch& batch);

// `net`'s float32 logits at `positions` of the flattened shifted sequence: only those rows go
// through the vocabulary-wide head (with assistant-only labels a small part of the sequence; the
// [tokens, vocab] logits dominate time and memory). bf16 autocast when the engine computes in
// bf16.
torch::Tensor LogitsAt(const StageContext& ctx, model::Qwen2VLForConditionalGeneration& net,
                       const data::Batch& batch, const torch::Tensor& positions);

// The summed cross-entropy of the model's predictions at `positions` against `labels` there, the
// head fused with the loss (Qwen2VLForConditionalGeneration::HeadCrossEntropy): the same value and
// gradients as cross_entropy(LogitsAt(...), labels, sum) without the [positions, vocab] logits.
torch::Tensor CrossEntropySumAt(const StageContext& ctx,
                                model::Qwen2VLForConditionalGeneration& net,
                                const data::Batch& batch, const torch::Tensor& positions,
                                const torch::Tensor& labels);

}  // namespace trainctl::trainer::internal

#endif  // TRAINCTL_WORKER_TRAINER_STAGES_INTERNAL_LABELLED_BATCHES_H_
