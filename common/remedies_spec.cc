#include "common/remedies_spec.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace trainctl {

void ApplyRemediesDefaults(trainctl::v1::JobSpec* spec) {
  if (!spec->has_remedies()) return;
  trainctl::v1::RemediesSpec* r = spec->mutable_remedies();
  if (!r->has_oom()) r->set_oom(false);
  if (!r->has_loss_spike()) return;
  trainctl::v1::LossSpikeRemedy* s = r->mutable_loss_spike();
  if (!s->has_spike_factor()) s->set_spike_factor(kDefaultSpikeFactor);
  if (!s->has_window()) s->set_window(kDefaultSpikeWindow);
  if (!s->has_max_rollbacks()) s->set_max_rollbacks(kDefaultMaxRollbacks);
  if (!s->has_max_grad_norm()) s->set_max_grad_norm(kDefaultSpikeMaxGradNorm);
  if (!s->has_warmup_ratio()) s->set_warmup_ratio(kDefaultSpikeWarmupRatio);
}

void CheckRemedies(const trainctl::v1::JobSpec& spec, internal::Checker& c,
                   std::vector<std::string>* warnings) {
  if (!spec.has_remedies()) return;
  const trainctl::v1::RemediesSpec& r = spec.remedies();
  if (spec.kind() == trainctl::v1::JOB_KIND_PIPELINE) {
    c.Fail("spec.remedies", "not supported on pipeline jobs; set it on a job of one kind");
    return;
  }
  if (r.has_loss_spike()) {
    const trainctl::v1::LossSpikeRemedy& s = r.loss_spike();
    const std::string path = "spec.remedies.loss_spike";
    if (spec.kind() == trainctl::v1::JOB_KIND_EVAL) {
      c.Fail(path, "an eval job does not train, so it has no loss to watch");
    }
    if (!(s.spike_factor() > 1) || !std::isfinite(s.spike_factor())) {
      c.Fail(path + ".spike_factor", absl::StrCat("must be > 1, got ", s.spike_factor()));
    }
    c.InRange(path + ".window", s.window(), 3, 100000, /*hi_open=*/false);
    c.InRange(path + ".max_rollbacks", s.max_rollbacks(), 0, 1000, /*hi_open=*/false);
    c.Positive(path + ".max_grad_norm", s.max_grad_norm());
    if (!(s.warmup_ratio() > 0 && s.warmup_ratio() <= 1)) {
      c.Fail(path + ".warmup_ratio", absl::StrCat("must be in (0, 1], got ", s.warmup_ratio()));
    }
  }
  if ((r.oom() || r.has_loss_spike()) && spec.max_restarts() == 0 && warnings != nullptr) {
    warnings->push_back(
        "spec.remedies: max_restarts is 0, so no remedy can run (each remedy is a restart)");
  }
}

std::string RemedyLine(const trainctl::v1::Remedy& remedy) {
  const std::string cause = remedy.cause() == "oom"          ? "OOM"
                            : remedy.cause() == "loss_spike" ? "loss spike"
                                                             : remedy.cause();
  const std::string where = remedy.rank() >= 0 ? absl::StrCat(" on rank ", remedy.rank()) : "";
  return absl::StrCat("attempt ", remedy.attempt(), ": ", cause, where, " \u2192 ",
                      remedy.change());
}

}  // namespace trainctl
