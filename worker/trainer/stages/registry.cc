// The stage of each job kind. Explicit rather than self-registering: a static library drops
// translation units nothing refers to, and with them any registration side effects.
#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "worker/trainer/stages/distill.h"
#include "worker/trainer/stages/eval.h"
#include "worker/trainer/stages/grpo.h"
#include "worker/trainer/stages/loop.h"
#include "worker/trainer/stages/sft.h"
#include "worker/trainer/stages/trace_distill.h"

namespace trainctl::trainer {
namespace {

// A probe job: the loop runs the bandwidth probe over the comm layer before any stage (as for
// every job with diagnostics.bandwidth_probe); this stage builds no model and has nothing more to
// do.
class ProbeStage final : public MeasuringStage {
 public:
  std::string EngineModel(const trainctl::v1::JobSpec& /*spec*/) const override { return ""; }
  absl::StatusOr<int64_t> Setup(StageContext& /*ctx*/) override { return 1; }
  absl::Status Evaluate(StageContext& /*ctx*/) override { return absl::OkStatus(); }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Stage>> MakeStage(const trainctl::v1::JobSpec& spec) {
  const trainctl::v1::JobKind kind = spec.kind();
  switch (kind) {
    case trainctl::v1::JOB_KIND_SFT:
      return MakeSftStage();
    case trainctl::v1::JOB_KIND_GRPO:
      return MakeGrpoStage();
    case trainctl::v1::JOB_KIND_EVAL:
      return MakeEvalStage();
    case trainctl::v1::JOB_KIND_DISTILL:
      // distill_loss: logit distillation; without it, a teacher generating traces.
      if (spec.training().has_distill_loss()) return MakeDistillStage();
      return MakeTraceDistillStage();
    case trainctl::v1::JOB_KIND_PROBE:
      return std::unique_ptr<Stage>(std::make_unique<ProbeStage>());
    default:
      return absl::UnimplementedError(
          absl::StrCat("this trainer runs sft, grpo, distill, eval and probe jobs; the ",
                       JobKindName(kind), " stage is not in it"));
  }
}

}  // namespace trainctl::trainer
