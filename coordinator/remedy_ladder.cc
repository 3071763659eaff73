#include "coordinator/remedy_ladder.h"

#include <algorithm>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/deepspeed_config.h"
#include "common/trainer_exit_codes.h"
#include "nlohmann/json.hpp"

namespace trainctl {
namespace {

namespace v1 = trainctl::v1;

// Setting names, as Remedy.settings carries them: the TrainingArguments field, or the DeepSpeed
// key for offload.
constexpr char kCheckpointing[] = "gradient_checkpointing";
constexpr char kMicroBatch[] = "per_device_train_batch_size";
constexpr char kAccumulation[] = "gradient_accumulation_steps";
constexpr char kOffload[] = "offload_optimizer";
constexpr char kMaxGradNorm[] = "max_grad_norm";
constexpr char kWarmupRatio[] = "warmup_ratio";

bool AnyHas(const Remedies& remedies, const std::string& key) {
  for (const v1::Remedy& r : remedies) {
    if (r.settings().count(key)) return true;
  }
  return false;
}

// The DeepSpeed document's zero_optimization.stage and offload_optimizer.device, when the spec
// has a parseable document.
struct DeepSpeedFacts {
  bool present = false;
  int stage = 0;
  bool offloaded = false;
};

DeepSpeedFacts FactsOf(const v1::JobSpec& spec) {
  DeepSpeedFacts facts;
  if (spec.deepspeed_config_json().empty()) return facts;
  const nlohmann::json doc = nlohmann::json::parse(spec.deepspeed_config_json(), nullptr, false);
  if (!doc.is_object()) return facts;
  facts.present = true;
  const auto zero = doc.find("zero_optimization");
  if (zero == doc.end() || !zero->is_object()) return facts;
  if (auto stage = zero->find("stage"); stage != zero->end() && stage->is_number()) {
    facts.stage = stage->get<int>();
  }
  if (auto off = zero->find("offload_optimizer"); off != zero->end() && off->is_object()) {
    auto device = off->find("device");
    facts.offloaded = device != off->end() && device->is_string() && *device == "cpu";
  }
  return facts;
}

v1::Remedy Base(const AttemptFailure& failure, const std::string& cause) {
  v1::Remedy r;
  r.set_attempt(failure.attempt + 1);
  r.set_cause(cause);
  r.set_rank(failure.rank);
  r.set_detail(failure.detail);
  return r;
}

std::optional<v1::Remedy> NextOomStep(const v1::JobSpec& spec, const Remedies& prior,
                                      const AttemptFailure& failure) {
  absl::StatusOr<v1::JobSpec> now = ApplyRemedies(spec, prior);
  if (!now.ok()) return std::nullopt;
  const v1::TrainingArguments& t = now->training();
  v1::Remedy r = Base(failure, "oom");
  if (!t.gradient_checkpointing()) {
    r.set_change("gradient_checkpointing on");
    (*r.mutable_settings())[kCheckpointing] = "true";
    return r;
  }
  const int micro = t.per_device_train_batch_size();
  if (!AnyHas(prior, kMicroBatch) && micro > 1 && micro % 2 == 0) {
    const int accum = t.gradient_accumulation_steps();
    r.set_change(absl::StrCat("per_device_train_batch_size ", micro, " → ", micro / 2,
                              ", gradient_accumulation_steps ", accum, " → ", accum * 2));
    (*r.mutable_settings())[kMicroBatch] = absl::StrCat(micro / 2);
    (*r.mutable_settings())[kAccumulation] = absl::StrCat(accum * 2);
    return r;
  }
  const DeepSpeedFacts ds = FactsOf(*now);
  if (ds.present && ds.stage >= 1 && !ds.offloaded) {
    r.set_change("offload_optimizer cpu");
    (*r.mutable_settings())[kOffload] = "cpu";
    return r;
  }
  return std::nullopt;
}

// The next step, or with a plan the steps up to the first whose plan fits, merged into one remedy.
std::optional<v1::Remedy> NextOomRemedy(const v1::JobSpec& spec, const Remedies& prior,
                                        const AttemptFailure& failure) {
  std::optional<v1::Remedy> first = NextOomStep(spec, prior, failure);
  if (!first.has_value() || !failure.fits) return first;
  Remedies tried = prior;
  v1::Remedy merged = *first;
  merged.clear_settings();
  merged.clear_change();
  for (std::optional<v1::Remedy> step = first; step.has_value();
       step = NextOomStep(spec, tried, failure)) {
    *tried.Add() = *step;
    for (const auto& [key, value] : step->settings()) (*merged.mutable_settings())[key] = value;
    merged.set_change(merged.change().empty()
                          ? step->change()
                          : absl::StrCat(merged.change(), "; ", step->change()));
    absl::StatusOr<v1::JobSpec> remedied = ApplyRemedies(spec, tried);
    if (remedied.ok() && failure.fits(*remedied)) {
      if (tried.size() > prior.size() + 1) {
        merged.set_change(
            absl::StrCat(merged.change(), " (the memory plan fits only with all of them)"));
      }
      return merged;
    }
  }
  return first;
}

std::optional<v1::Remedy> NextSpikeRemedy(const v1::JobSpec& spec, const Remedies& prior,
                                          const AttemptFailure& failure) {
  const v1::LossSpikeRemedy& s = spec.remedies().loss_spike();
  int rollbacks = 0;
  for (const v1::Remedy& r : prior) rollbacks += r.cause() == "loss_spike" ? 1 : 0;
  if (rollbacks >= s.max_rollbacks()) return std::nullopt;
  // Clipping lowered to the remedy's and warm-up raised to it, never the other way.
  absl::StatusOr<v1::JobSpec> now = ApplyRemedies(spec, prior);
  if (!now.ok()) return std::nullopt;
  const v1::TrainingArguments& t = now->training();
  const double clip =
      t.max_grad_norm() > 0 ? std::min(t.max_grad_norm(), s.max_grad_norm()) : s.max_grad_norm();
  const double current_warmup = t.warmup_steps() > 0 && t.max_steps() > 0
                                    ? static_cast<double>(t.warmup_steps()) / t.max_steps()
                                    : t.warmup_ratio();
  const double warmup = std::max(current_warmup, s.warmup_ratio());
  v1::Remedy r = Base(failure, "loss_spike");
  r.set_change(absl::StrCat("rollback ", rollbacks + 1, "/", s.max_rollbacks(), " to ",
                            failure.last_checkpoint_step > 0
                                ? absl::StrCat("checkpoint-", failure.last_checkpoint_step)
                                : std::string("the start"),
                            ", max_grad_norm ", clip, ", warmup_ratio ", warmup));
  (*r.mutable_settings())[kMaxGradNorm] = absl::StrCat(clip);
  (*r.mutable_settings())[kWarmupRatio] = absl::StrCat(warmup);
  return r;
}

// Sets `key` of `doc` (an object) to `value` when it holds an explicit value ("auto" is resolved
// from the training arguments anyway).
void OverrideExplicit(nlohmann::json& doc, const char* key, const nlohmann::json& value) {
  auto it = doc.find(key);
  if (it != doc.end() && !(it->is_string() && *it == "auto")) *it = value;
}

absl::Status ApplySetting(const std::string& key, const std::string& value, v1::JobSpec* spec,
                          nlohmann::json* ds) {
  v1::TrainingArguments* t = spec->mutable_training();
  auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("remedy setting ", key, ": cannot use '", value, "'"));
  };
  if (key == kCheckpointing) {
    if (value != "true" && value != "false") return bad();
    t->set_gradient_checkpointing(value == "true");
    return absl::OkStatus();
  }
  if (key == kMicroBatch || key == kAccumulation) {
    int n = 0;
    if (!absl::SimpleAtoi(value, &n) || n < 1) return bad();
    if (key == kMicroBatch) {
      t->set_per_device_train_batch_size(n);
      if (ds->is_object()) OverrideExplicit(*ds, "train_micro_batch_size_per_gpu", n);
    } else {
      t->set_gradient_accumulation_steps(n);
      if (ds->is_object()) OverrideExplicit(*ds, "gradient_accumulation_steps", n);
    }
    return absl::OkStatus();
  }
  if (key == kOffload) {
    if (value != "cpu" || !ds->is_object()) return bad();
    (*ds)["zero_optimization"]["offload_optimizer"]["device"] = value;
    return absl::OkStatus();
  }
  if (key == kMaxGradNorm || key == kWarmupRatio) {
    double x = 0;
    if (!absl::SimpleAtod(value, &x) || !(x >= 0)) return bad();
    if (key == kMaxGradNorm) {
      t->set_max_grad_norm(x);
      if (ds->is_object()) OverrideExplicit(*ds, "gradient_clipping", x);
    } else {
      t->set_warmup_ratio(x);
      t->set_warmup_steps(0);  // warmup_steps > 0 would override the ratio
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown remedy setting '", key, "'"));
}

}  // namespace

std::string FailureCause(int exit_code) {
  if (exit_code == kTrainerExitOutOfMemory) return "oom";
  if (exit_code == kTrainerExitLossSpike) return "loss_spike";
  return "";
}

std::optional<v1::Remedy> NextRemedy(const v1::JobSpec& spec, const Remedies& prior,
                                     const AttemptFailure& failure) {
  if (!spec.has_remedies()) return std::nullopt;
  const std::string cause = FailureCause(failure.exit_code);
  if (cause == "oom" && spec.remedies().oom()) return NextOomRemedy(spec, prior, failure);
  if (cause == "loss_spike" && spec.remedies().has_loss_spike()) {
    return NextSpikeRemedy(spec, prior, failure);
  }
  return std::nullopt;
}

absl::StatusOr<v1::JobSpec> ApplyRemedies(const v1::JobSpec& spec, const Remedies& remedies) {
  v1::JobSpec out = spec;
  if (remedies.empty()) return out;
  nlohmann::json ds = nlohmann::json();
  if (!spec.deepspeed_config_json().empty()) {
    absl::StatusOr<nlohmann::json> doc =
        ParseDeepSpeedJson(spec.deepspeed_config_json(), "spec.deepspeed_config_json");
    if (!doc.ok()) return doc.status();
    ds = std::move(*doc);
  }
  for (const v1::Remedy& r : remedies) {
    for (const auto& [key, value] : r.settings()) {
      if (absl::Status s = ApplySetting(key, value, &out, &ds); !s.ok()) return s;
    }
  }
  if (ds.is_object()) out.set_deepspeed_config_json(ds.dump(2));
  return out;
}

}  // namespace trainctl
