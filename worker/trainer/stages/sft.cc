#include "worker/trainer/stages/sft.h"

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/trainer/data/loader.h"
#include "worker/trainer/data/shard_reader.h"
#include "worker/trainer/stages/batch_inputs.h"
#include "worker/trainer/stages/internal/autocast.h"

namespace trainctl::trainer {
namespace {

class SftStage final : public Stage {
 public:
  absl::StatusOr<int64_t> Setup(StageContext& ctx) override {
    ASSIGN_OR_RETURN(std::shared_ptr<const data::ShardReader> reader,
                     data::ShardReader::Open(ctx.spec.data_path()));
    data::LoaderOptions options;
    options.batch_size = ctx.training.per_device_train_batch_size();
    options.seed = static_cast<uint64_t>(ctx.training.seed());
    options.rank = ctx.comm.rank();
    options.world_size = ctx.comm.world_size();
    ASSIGN_OR_RETURN(loader_, data::Loader::Create(reader, options));
    return loader_->BatchesInEpoch(0) / ctx.training.gradient_accumulation_steps();
  }

  // The loss of the whole global batch: summed over every rank's trained tokens, divided by
  // their global count.
  absl::StatusOr<StageStep> Step(StageContext& ctx, int64_t /*step*/) override {
    std::vector<data::Batch> micro;
    int64_t label_tokens = 0, tokens = 0, samples = 0;
    for (int i = 0; i < ctx.training.gradient_accumulation_steps(); ++i) {
      ASSIGN_OR_RETURN(data::Batch batch, loader_->Next());
      label_tokens += ShiftedLabels(batch, torch::kCPU).ne(-100).sum().item<int64_t>();
      for (int32_t m : batch.attention_mask) tokens += m;
      samples += batch.batch_size;
      micro.push_back(std::move(batch));
    }
    torch::Tensor counts =
        torch::tensor({static_cast<double>(label_tokens), static_cast<double>(tokens),
                       static_cast<double>(samples)},
                      torch::kFloat64);
    RETURN_IF_ERROR(ctx.comm.AllReduceSum(counts, "token counts"));
    const double denominator = std::max(1.0, counts[0].item<double>());
    StageStep out;
    out.tokens = static_cast<int64_t>(counts[1].item<double>());
    out.samples = static_cast<int64_t>(counts[2].item<double>());
    double loss_value = 0;
    for (const data::Batch& batch : micro) {
      torch::Tensor loss;
      try {
        loss = MicroBatchLossSum(ctx, batch) / denominator;
      } catch (const c10::Error& e) {
        return absl::InternalError(e.what_without_backtrace());
      } catch (const zero::CollectiveError& e) {
        return absl::UnavailableError(e.what());
      }
      RETURN_IF_ERROR(ctx.engine.Backward(loss));
      loss_value += loss.item<double>();
    }
    torch::Tensor total = torch::tensor({loss_value}, torch::kFloat64);
    RETURN_IF_ERROR(ctx.comm.AllReduceSum(total, "loss"));
    out.loss = total.item<double>();
    return out;
  }

  data::LoaderState DataState() const override { return loader_->state(); }

  absl::Status RestoreDataState(const data::LoaderState& state, int64_t /*step*/) override {
    return loader_->SetState(state);
  }

 private:
  // Summed cross-entropy of one micro-batch over its trained (shifted) label positions. Only
  // those positions go through the vocabulary-wide head: with assistant-only labels that is a
  // small part of the sequence, and the [tokens, vocab] logits dominate time and memory.
  static torch::Tensor MicroBatchLossSum(StageContext& ctx, const data::Batch& batch) {
    model::Qwen2VLForConditionalGeneration& net = ctx.engine.model();
    const bool bf16 = ctx.options.compute_dtype == torch::kBFloat16;
    torch::Tensor hidden;
    {
      internal::AutocastGuard autocast(bf16, ctx.device.type(), torch::kBFloat16);
      hidden = net.ForwardHidden(ToModelInputs(batch, ctx.device));
    }
    const int64_t width = hidden.size(-1);
    auto labels = ShiftedLabels(batch, ctx.device).reshape({-1});
    auto positions = labels.ne(-100).nonzero().squeeze(1);
    auto trained =
        hidden.slice(1, 0, batch.seq_len - 1).reshape({-1, width}).index_select(0, positions);
    torch::Tensor logits;
    {
      internal::AutocastGuard autocast(bf16, ctx.device.type(), torch::kBFloat16);
      logits = net.Head(trained);
    }
    return torch::nn::functional::cross_entropy(
        logits.to(torch::kFloat32), labels.index_select(0, positions),
        torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  }

  std::unique_ptr<data::Loader> loader_;
};

}  // namespace

std::unique_ptr<Stage> MakeSftStage() { return std::make_unique<SftStage>(); }

}  // namespace trainctl::trainer
