#include "worker/trainer/stages/sft.h"

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/data/loader.h"
#include "common/status_macros.h"
#include "worker/trainer/model/status_guard.h"
#include "worker/trainer/stages/internal/labelled_batches.h"

namespace trainctl::trainer {
namespace {

class SftStage final : public Stage {
 public:
  absl::StatusOr<int64_t> Setup(StageContext& ctx) override {
    ASSIGN_OR_RETURN(loader_, internal::RankLoader(ctx));
    return loader_->BatchesInEpoch(0) / ctx.training.gradient_accumulation_steps();
  }

  // The loss of the whole global batch: summed over every rank's trained tokens, divided by
  // their global count.
  absl::StatusOr<StageStep> Step(StageContext& ctx, int64_t /*step*/) override {
    ASSIGN_OR_RETURN(internal::MicroBatches micro, internal::NextMicroBatches(ctx, *loader_));
    StageStep out;
    out.tokens = micro.tokens;
    out.samples = micro.samples;
    // Summed where it is computed and read once after the last micro-batch: reading each
    // micro-batch's loss would make the host wait for the device between micro-batches.
    torch::Tensor loss_sum;
    for (const data::Batch& batch : micro.batches) {
      torch::Tensor loss;
      RETURN_IF_ERROR(model::Guarded("", [&] {
        const internal::TrainedPositions trained = internal::Trained(ctx, batch);
        loss = internal::CrossEntropySumAt(ctx, ctx.engine->model(), batch, trained.positions,
                                           trained.labels.index_select(0, trained.positions)) /
               micro.label_tokens;
      }));
      RETURN_IF_ERROR(ctx.engine->Backward(loss));
      loss_sum = loss_sum.defined() ? loss_sum + loss.detach() : loss.detach();
    }
    torch::Tensor total = loss_sum.to(torch::kCPU, torch::kFloat64).reshape({1});
    RETURN_IF_ERROR(ctx.SumOverRanks(total, "loss"));
    out.loss = total.item<double>();
    return out;
  }

  data::LoaderState DataState() const override { return loader_->state(); }

  absl::Status RestoreDataState(const data::LoaderState& state, int64_t /*step*/) override {
    return loader_->SetState(state);
  }

 private:
  std::unique_ptr<data::Loader> loader_;
};

}  // namespace

std::unique_ptr<Stage> MakeSftStage() { return std::make_unique<SftStage>(); }

}  // namespace trainctl::trainer
