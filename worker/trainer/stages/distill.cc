#include "worker/trainer/stages/distill.h"

#include <torch/torch.h>

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/data/loader.h"
#include "common/status_macros.h"
#include "worker/trainer/model/status_guard.h"
#include "worker/trainer/stages/distill_loss.h"
#include "worker/trainer/stages/internal/labelled_batches.h"

namespace trainctl::trainer {
namespace {

// One micro-batch's sums over its trained positions.
struct LossSums {
  torch::Tensor kd;  // the divergence to the teacher
  torch::Tensor ce;  // the cross-entropy on the labels
};

class DistillStage final : public Stage {
 public:
  absl::StatusOr<int64_t> Setup(StageContext& ctx) override {
    const auto& t = ctx.training;
    ASSIGN_OR_RETURN(loss_.type, ParseDistillLossType(t.distill_loss()));
    loss_.beta = t.jsd_beta();
    loss_.temperature = t.kd_temperature();
    alpha_ = t.kd_alpha();
    const std::string& teacher = ctx.spec.teacher_model_name_or_path();
    if (teacher.empty()) {
      return absl::InvalidArgumentError(
          "spec.teacher_model_name_or_path: required for logit distillation");
    }
    ASSIGN_OR_RETURN(auto resolved, ResolveModel(teacher, ctx.env.model_registry));
    if (resolved.first.vocab_size != ctx.config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "spec.teacher_model_name_or_path: the teacher (", teacher, ") has a vocabulary of ",
          resolved.first.vocab_size, " tokens, the student (", ctx.spec.model_name_or_path(),
          ") one of ", ctx.config.vocab_size,
          "; logit distillation compares their distributions token by token, so they must match"));
    }
    ASSIGN_OR_RETURN(teacher_, zero::Engine::CreateFrozen(resolved.first, ctx.options, &ctx.comm,
                                                          t.seed(), resolved.second));
    teacher_->model().SetAttentionImpl(ctx.engine->model().attention_impl());
    RETURN_IF_ERROR(ctx.SplitSequences(*teacher_, absl::StrCat("the teacher (", teacher, ")")));

    ASSIGN_OR_RETURN(loader_, internal::RankLoader(ctx));
    return loader_->BatchesInEpoch(0) / t.gradient_accumulation_steps();
  }

  absl::StatusOr<StageStep> Step(StageContext& ctx, int64_t /*step*/) override {
    ASSIGN_OR_RETURN(internal::MicroBatches micro, internal::NextMicroBatches(ctx, *loader_));
    const double denominator = micro.label_tokens;
    StageStep out;
    out.tokens = micro.tokens;
    out.samples = micro.samples;
    double loss_value = 0, kd_value = 0, ce_value = 0;
    for (const data::Batch& batch : micro.batches) {
      torch::Tensor loss;
      RETURN_IF_ERROR(model::Guarded("", [&] {
        LossSums sums = MicroBatchSums(ctx, batch);
        loss = (alpha_ * sums.kd + (1 - alpha_) * sums.ce) / denominator;
        kd_value += sums.kd.item<double>() / denominator;
        ce_value += sums.ce.item<double>() / denominator;
      }));
      RETURN_IF_ERROR(ctx.engine->Backward(loss));
      loss_value += loss.item<double>();
    }
    torch::Tensor total = torch::tensor({loss_value, kd_value, ce_value}, torch::kFloat64);
    RETURN_IF_ERROR(ctx.SumOverRanks(total, "loss"));
    out.loss = total[0].item<double>();
    out.metrics["kd_loss"] = total[1].item<double>();
    out.metrics["ce_loss"] = total[2].item<double>();
    return out;
  }

  data::LoaderState DataState() const override { return loader_->state(); }

  absl::Status RestoreDataState(const data::LoaderState& state, int64_t /*step*/) override {
    return loader_->SetState(state);
  }

 private:
  LossSums MicroBatchSums(StageContext& ctx, const data::Batch& batch) {
    const internal::TrainedPositions trained = internal::Trained(ctx, batch);
    torch::Tensor student = internal::LogitsAt(ctx, ctx.engine->model(), batch, trained.positions);
    torch::Tensor teacher;
    {
      torch::NoGradGuard no_grad;
      teacher = internal::LogitsAt(ctx, teacher_->model(), batch, trained.positions);
    }
    LossSums sums;
    sums.kd = DistillLossSum(student, teacher, loss_);
    sums.ce = torch::nn::functional::cross_entropy(
        student, trained.labels.index_select(0, trained.positions),
        torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
    return sums;
  }

  DistillLossOptions loss_;
  double alpha_ = 1.0;
  std::unique_ptr<zero::Engine> teacher_;
  std::unique_ptr<data::Loader> loader_;
};

}  // namespace

std::unique_ptr<Stage> MakeDistillStage() { return std::make_unique<DistillStage>(); }

}  // namespace trainctl::trainer
