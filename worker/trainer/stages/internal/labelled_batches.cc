#include "worker/trainer/stages/internal/labelled_batches.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/data/shard_reader.h"
#include "common/status_macros.h"
#include "worker/trainer/stages/batch_inputs.h"
#include "worker/trainer/stages/internal/autocast.h"

namespace trainctl::trainer::internal {

absl::Status CheckPreparedPixels(const StageContext& ctx, const data::ShardReader& reader) {
  const data::DatasetManifest& m = reader.manifest();
  const std::pair<const char*, std::pair<int64_t, int64_t>> fields[] = {
      {"min_pixels", {ctx.training.min_pixels(), m.min_pixels}},
      {"max_pixels", {ctx.training.max_pixels(), m.max_pixels}}};
  for (const auto& [name, values] : fields) {
    const auto [wanted, prepared] = values;
    if (prepared != 0 && wanted != prepared) {
      return absl::FailedPreconditionError(
          absl::StrCat("spec.training.", name, ": ", wanted, ", but the shards in ",
                       ctx.spec.data_path(), " were prepared with --", name, " ", prepared,
                       " (their images are resized already): ", "prepare them again with --", name,
                       " ", wanted, ", or set training.", name, " to ", prepared));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<data::Loader>> RankLoader(const StageContext& ctx) {
  ASSIGN_OR_RETURN(std::shared_ptr<const data::ShardReader> reader,
                   data::ShardReader::Open(ctx.spec.data_path()));
  RETURN_IF_ERROR(CheckPreparedPixels(ctx, *reader));
  data::LoaderOptions options;
  options.batch_size = ctx.training.per_device_train_batch_size();
  options.seed = static_cast<uint64_t>(ctx.training.seed());
  // A sequence- or tensor-parallel group's ranks share their batches (each keeps a slice of
  // every sequence, or of every MLP).
  options.rank = ctx.mesh.DataRank(ctx.comm.rank());
  options.world_size = ctx.comm.world_size() / (ctx.mesh.sequence * ctx.mesh.tensor);
  if (ctx.training.packing()) options.pack_length = ctx.training.max_seq_length();
  return data::Loader::Create(reader, options);
}

absl::StatusOr<MicroBatches> NextMicroBatches(StageContext& ctx, data::Loader& loader) {
  MicroBatches out;
  int64_t label_tokens = 0, tokens = 0, samples = 0;
  for (int i = 0; i < ctx.training.gradient_accumulation_steps(); ++i) {
    ASSIGN_OR_RETURN(data::Batch batch, loader.Next());
    label_tokens += ShiftedLabels(batch, torch::kCPU).ne(-100).sum().item<int64_t>();
    for (int32_t m : batch.attention_mask) tokens += m;
    // A packed row holds several samples: its largest segment id.
    for (int64_t r = 0; r < batch.batch_size; ++r) {
      const auto row = batch.segment_ids.begin() + r * batch.seq_len;
      samples += std::max<int64_t>(1, *std::max_element(row, row + batch.seq_len));
    }
    out.batches.push_back(std::move(batch));
  }
  torch::Tensor counts = torch::tensor({static_cast<double>(label_tokens),
                                        static_cast<double>(tokens), static_cast<double>(samples)},
                                       torch::kFloat64);
  // A tensor-parallel group's ranks each take the whole loss (their replicated weights'
  // gradients are not summed over the group): SumOverRanks counts the group once. Each batch is
  // still counted once per rank of its sequence-parallel group: label_tokens stays so (every
  // rank's loss over the whole gathered sequence is then 1/size of it, and the gradients, summed
  // over the ZeRO group, add up to the batch's); the throughput figures do not.
  RETURN_IF_ERROR(ctx.SumOverRanks(counts, "token counts"));
  out.label_tokens = std::max(1.0, counts[0].item<double>());
  out.tokens = static_cast<int64_t>(counts[1].item<double>()) / ctx.mesh.sequence;
  out.samples = static_cast<int64_t>(counts[2].item<double>()) / ctx.mesh.sequence;
  return out;
}

TrainedPositions Trained(const StageContext& ctx, const data::Batch& batch) {
  // Found on the host (nonzero on a device waits for it), then copied over without waiting.
  const torch::Tensor labels = ShiftedLabels(batch, torch::kCPU).reshape({-1});
  TrainedPositions t;
  t.labels = model::ToDeviceAsync(labels, ctx.device);
  t.positions = model::ToDeviceAsync(labels.ne(-100).nonzero().squeeze(1), ctx.device);
  return t;
}

namespace {

// The last hidden states at `positions` of the flattened shifted sequence; run under the caller's
// autocast, which the head must share.
torch::Tensor HiddenAt(const StageContext& ctx, model::Qwen2VLForConditionalGeneration& net,
                       const data::Batch& batch, const torch::Tensor& positions) {
  const torch::Tensor hidden = net.ForwardHidden(ToModelInputs(batch, ctx.device));
  const int64_t width = hidden.size(-1);
  return hidden.slice(1, 0, batch.seq_len - 1).reshape({-1, width}).index_select(0, positions);
}

}  // namespace

torch::Tensor LogitsAt(const StageContext& ctx, model::Qwen2VLForConditionalGeneration& net,
                       const data::Batch& batch, const torch::Tensor& positions) {
  const bool bf16 = ctx.options.compute_dtype == torch::kBFloat16;
  internal::AutocastGuard autocast(bf16, ctx.device.type(), torch::kBFloat16);
  return net.Head(HiddenAt(ctx, net, batch, positions)).to(torch::kFloat32);
}

torch::Tensor CrossEntropySumAt(const StageContext& ctx,
                                model::Qwen2VLForConditionalGeneration& net,
                                const data::Batch& batch, const torch::Tensor& positions,
                                const torch::Tensor& labels) {
  const bool bf16 = ctx.options.compute_dtype == torch::kBFloat16;
  internal::AutocastGuard autocast(bf16, ctx.device.type(), torch::kBFloat16);
  return net.HeadCrossEntropy(HiddenAt(ctx, net, batch, positions), labels);
}

}  // namespace trainctl::trainer::internal
