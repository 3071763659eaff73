#include "worker/trainer/stages/trace_distill.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/data/prepare.h"
#include "common/status_macros.h"
#include "worker/trainer/stages/internal/endpoint_teacher.h"
#include "worker/trainer/stages/internal/model_teacher.h"
#include "worker/trainer/stages/internal/trace_records.h"

namespace trainctl::trainer {
namespace {

namespace fs = std::filesystem;
using internal::PromptOutcome;

bool HasTokenizer(const std::string& dir) {
  return !dir.empty() && fs::exists(fs::path(dir) / "tokenizer.json");
}

// Sums over prompts, as the manifest and the events report them.
struct Totals {
  int64_t prompts = 0, skipped = 0, completions = 0, passed = 0, kept = 0;
  int64_t prompt_tokens = 0, completion_tokens = 0;

  void Add(const PromptOutcome& o) {
    ++prompts;
    skipped += o.completions.empty() ? 1 : 0;
    completions += static_cast<int64_t>(o.completions.size());
    for (const internal::CompletionVerdict& v : o.completions) {
      passed += v.passed ? 1 : 0;
      completion_tokens += v.tokens;
    }
    kept += static_cast<int64_t>(o.kept.size());
    prompt_tokens += o.prompt_tokens;
  }
  std::vector<double> Values() const {
    return {static_cast<double>(prompts),
            static_cast<double>(skipped),
            static_cast<double>(completions),
            static_cast<double>(passed),
            static_cast<double>(kept),
            static_cast<double>(prompt_tokens),
            static_cast<double>(completion_tokens)};
  }
  void AddValues(const torch::Tensor& v) {
    prompts += static_cast<int64_t>(v[0].item<double>());
    skipped += static_cast<int64_t>(v[1].item<double>());
    completions += static_cast<int64_t>(v[2].item<double>());
    passed += static_cast<int64_t>(v[3].item<double>());
    kept += static_cast<int64_t>(v[4].item<double>());
    prompt_tokens += static_cast<int64_t>(v[5].item<double>());
    completion_tokens += static_cast<int64_t>(v[6].item<double>());
  }
  double pass_rate() const {
    return completions > 0 ? static_cast<double>(passed) / static_cast<double>(completions) : 0;
  }
};

class TraceDistillStage final : public MeasuringStage {
 public:
  // The in-process teacher is the loop's (frozen) engine; an endpoint needs no model.
  std::string EngineModel(const trainctl::v1::JobSpec& spec) const override {
    return spec.teacher_endpoint().empty() ? spec.teacher_model_name_or_path() : "";
  }

  absl::StatusOr<int64_t> Setup(StageContext& ctx) override {
    const auto& t = ctx.training;
    ASSIGN_OR_RETURN(prompts_,
                     internal::LoadTracePrompts(ctx.spec.data_path(), t.distill_system_prompt()));
    if (prompts_.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.data_path: ", ctx.spec.data_path(), " holds no records"));
    }
    sampling_.n = t.num_generations();
    sampling_.temperature = t.temperature();
    sampling_.top_p = t.top_p();
    sampling_.top_k = t.top_k();
    sampling_.max_tokens = t.max_completion_length();
    sampling_.seed = static_cast<uint64_t>(t.seed());
    if (!ctx.spec.teacher_endpoint().empty()) {
      internal::EndpointTeacherOptions o;
      o.base_url = ctx.spec.teacher_endpoint();
      while (!o.base_url.empty() && o.base_url.back() == '/') o.base_url.pop_back();
      o.model = ctx.spec.teacher_endpoint_model();
      o.api_key = ctx.env.openai_api_key;
      o.concurrency = t.teacher_concurrency();
      o.timeout_seconds = t.teacher_timeout();
      o.max_retries = t.teacher_max_retries();
      ASSIGN_OR_RETURN(teacher_, internal::MakeEndpointTeacher(o));
    } else {
      if (!HasTokenizer(ctx.tokenizer_dir)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "spec.teacher_model_name_or_path: the teacher (", ctx.spec.teacher_model_name_or_path(),
            ") has no tokenizer.json; trace distillation encodes prompts and decodes completions "
            "with the teacher's tokenizer"));
      }
      ASSIGN_OR_RETURN(auto tokenizer, tokenizer::BpeTokenizer::Load(ctx.tokenizer_dir));
      internal::ModelTeacherOptions o;
      o.model = ctx.spec.teacher_model_name_or_path();
      o.max_prompt_length = t.max_prompt_length();
      o.image.min_pixels = t.min_pixels();
      o.image.max_pixels = t.max_pixels();
      collective_ = internal::ModelTeacherIsCollective(ctx, *ctx.engine);
      teacher_ = internal::MakeModelTeacher(ctx, *ctx.engine, std::move(tokenizer), o);
    }
    ASSIGN_OR_RETURN(dataset_tokenizer_, DatasetTokenizer(ctx));
    return 1;
  }

  absl::Status Evaluate(StageContext& ctx) override {
    const absl::Time start = absl::Now();
    const std::string progress_dir = (fs::path(ctx.spec.output_dir()) / "progress").string();
    ASSIGN_OR_RETURN(auto done, internal::ReadProgress(progress_dir));
    const int64_t n = static_cast<int64_t>(prompts_.size());
    if (!done.empty() && done.rbegin()->first >= n) {
      return absl::FailedPreconditionError(absl::StrCat(
          progress_dir, " records prompt ", done.rbegin()->first, " but ", ctx.spec.data_path(),
          " holds ", n, " records: the output_dir belongs to another data_path"));
    }
    RETURN_IF_ERROR(CheckSettings(ctx, progress_dir));
    RETURN_IF_ERROR(AgreeOnProgress(ctx, static_cast<int64_t>(done.size()), progress_dir));
    ASSIGN_OR_RETURN(internal::ProgressLog log,
                     internal::ProgressLog::Open(progress_dir, ctx.comm.rank()));

    // The prompts left, dealt round-robin; every rank computes every rank's share alike.
    const int64_t world = ctx.comm.world_size(), rank = ctx.comm.rank();
    std::vector<int64_t> mine;
    int64_t remaining = 0;
    Totals totals;
    for (int64_t i = 0; i < n; ++i) {
      if (auto it = done.find(i); it != done.end()) {
        totals.Add(it->second);
        continue;
      }
      if (remaining++ % world == rank) mine.push_back(i);
    }
    const int64_t batch = std::max(1, ctx.training.per_device_train_batch_size());
    const int64_t rounds = ((remaining + world - 1) / world + batch - 1) / batch;
    int64_t run_tokens = 0;
    for (int64_t r = 0; r < rounds; ++r) {
      const size_t begin = static_cast<size_t>(std::min<int64_t>(r * batch, mine.size()));
      const size_t end = static_cast<size_t>(std::min<int64_t>((r + 1) * batch, mine.size()));
      std::vector<internal::TeacherPrompt> batch_prompts;
      for (size_t k = begin; k < end; ++k) {
        batch_prompts.push_back(prompts_[static_cast<size_t>(mine[k])].prompt);
      }
      std::vector<internal::TeacherAnswer> answers;
      if (!batch_prompts.empty() || collective_) {
        ASSIGN_OR_RETURN(answers, teacher_->Complete(batch_prompts, sampling_));
      }
      Totals here;
      std::vector<PromptOutcome> outcomes;
      for (const internal::TeacherAnswer& a : answers) {
        if (a.index < 0 || a.index >= n) {
          return absl::InternalError(absl::StrCat("the teacher answered unknown prompt ", a.index));
        }
        outcomes.push_back(internal::Verify(a, prompts_[static_cast<size_t>(a.index)].solution,
                                            ctx.training.keep_per_prompt()));
        here.Add(outcomes.back());
      }
      if (!outcomes.empty()) RETURN_IF_ERROR(log.Append(outcomes));
      torch::Tensor sums = torch::tensor(here.Values(), torch::kFloat64);
      RETURN_IF_ERROR(ctx.comm.AllReduceSum(sums, "trace distillation progress"));
      totals.AddValues(sums);
      run_tokens += static_cast<int64_t>(sums[6].item<double>());
      if (ctx.lead()) Emit(ctx, r + 1, totals, n, run_tokens, start);
    }
    if (!ctx.lead()) return absl::OkStatus();
    return Finish(ctx, progress_dir, std::max<int64_t>(1, rounds), run_tokens, start);
  }

 private:
  // What the progress lines depend on: a restart must not mix another teacher's, sampling's,
  // prompt's or cap's lines with its own. (The endpoint's URL may change; its model may not.)
  nlohmann::json Settings(const StageContext& ctx) const {
    const nlohmann::json teacher = nlohmann::json::parse(teacher_->DescribeJson(), nullptr, false);
    return {
        {"data_path", ctx.spec.data_path()},
        {"prompts", prompts_.size()},
        {"teacher", {{"kind", teacher.value("kind", "")}, {"model", teacher.value("model", "")}}},
        {"num_generations", sampling_.n},
        {"temperature", sampling_.temperature},
        {"top_p", sampling_.top_p},
        {"top_k", sampling_.top_k},
        {"max_completion_length", sampling_.max_tokens},
        {"seed", sampling_.seed},
        {"system_prompt", ctx.training.distill_system_prompt()},
        {"keep_per_prompt", ctx.training.keep_per_prompt()}};
  }

  // FAILED_PRECONDITION when progress_dir holds another run's settings.json; rank 0 writes this
  // run's when there is none.
  absl::Status CheckSettings(const StageContext& ctx, const std::string& dir) const {
    const nlohmann::json settings = Settings(ctx);
    const fs::path path = fs::path(dir) / "settings.json";
    std::ifstream in(path, std::ios::binary);
    if (in) {
      const nlohmann::json found = nlohmann::json::parse(in, nullptr, false);
      if (found == settings) return absl::OkStatus();
      std::string differ;
      for (const auto& [key, value] : settings.items()) {
        if (found.is_object() && found.contains(key) && found[key] == value) continue;
        absl::StrAppend(&differ, differ.empty() ? "" : ", ", key);
      }
      return absl::FailedPreconditionError(absl::StrCat(
          path.string(), " records another run (", differ,
          " differ): its progress cannot be continued with these settings; use another "
          "output_dir, or remove ",
          dir, " to start over"));
    }
    if (!ctx.lead()) return absl::OkStatus();
    std::error_code ec;
    fs::create_directories(dir, ec);
    return internal::WriteJsonFile(path.string(), settings);
  }

  // Every rank must deal the same prompts: a rank that sees other progress files (no shared
  // output_dir) fails the job instead of duplicating work.
  static absl::Status AgreeOnProgress(StageContext& ctx, int64_t done, const std::string& dir) {
    if (ctx.comm.world_size() == 1) return absl::OkStatus();
    const double d = static_cast<double>(done);
    torch::Tensor sums = torch::tensor({d, d * d}, torch::kFloat64);
    RETURN_IF_ERROR(ctx.comm.AllReduceSum(sums, "trace distillation progress check"));
    const double w = ctx.comm.world_size();
    const double mean = sums[0].item<double>() / w;
    if (sums[1].item<double>() / w - mean * mean > 0.25) {
      return absl::FailedPreconditionError(absl::StrCat("the ranks found different progress under ",
                                                        dir, " (rank ", ctx.comm.rank(), ": ", done,
                                                        " prompts done); every rank must see the "
                                                        "same output_dir"));
    }
    return absl::OkStatus();
  }

  // The student's tokenizer (model_name_or_path's) prepares the shards SFT trains on; else the
  // teacher's.
  static absl::StatusOr<std::string> DatasetTokenizer(const StageContext& ctx) {
    const std::string& student = ctx.spec.model_name_or_path();
    if (auto resolved = ResolveModel(student, ctx.env.model_registry);
        resolved.ok() && HasTokenizer(resolved->second)) {
      return resolved->second;
    }
    if (HasTokenizer(student)) return student;
    if (HasTokenizer(ctx.tokenizer_dir)) return ctx.tokenizer_dir;
    return absl::FailedPreconditionError(
        absl::StrCat("trace distillation prepares its traces with the student's tokenizer: neither "
                     "model_name_or_path (",
                     student, ") nor the teacher holds a tokenizer.json"));
  }

  static void Emit(StageContext& ctx, int64_t step, const Totals& totals, int64_t prompts_total,
                   int64_t run_tokens, absl::Time start) {
    const double seconds = std::max(1e-9, absl::ToDoubleSeconds(absl::Now() - start));
    ctx.events.Emit("metric", {{"step", step},
                               {"values",
                                {{"prompts_done", totals.prompts},
                                 {"prompts_total", prompts_total},
                                 {"completions", totals.completions},
                                 {"passed", totals.passed},
                                 {"kept", totals.kept},
                                 {"pass_rate", totals.pass_rate()},
                                 {"tokens_per_second", run_tokens / seconds}}}});
  }

  // Rank 0, after every rank's last append: the traces, the dataset and the manifest.
  absl::Status Finish(StageContext& ctx, const std::string& progress_dir, int64_t step,
                      int64_t run_tokens, absl::Time start) {
    const auto& t = ctx.training;
    const fs::path out = ctx.spec.output_dir();
    ASSIGN_OR_RETURN(auto all, internal::ReadProgress(progress_dir));
    const int64_t n = static_cast<int64_t>(prompts_.size());
    if (static_cast<int64_t>(all.size()) != n) {
      return absl::DataLossError(absl::StrCat(progress_dir, " records ", all.size(), " of ", n,
                                              " prompts after every rank finished"));
    }
    Totals totals;
    for (const auto& [index, outcome] : all) totals.Add(outcome);
    const std::string traces = (out / "traces.jsonl").string();
    ASSIGN_OR_RETURN(const int64_t written, internal::WriteTraces(traces, prompts_, all));
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    nlohmann::json doc = {
        {"kind", "trace_distill"},
        {"teacher", nlohmann::json::parse(teacher_->DescribeJson(), nullptr, false)},
        {"data_path", ctx.spec.data_path()},
        {"system_prompt", t.distill_system_prompt()},
        {"sampling",
         {{"num_generations", sampling_.n},
          {"temperature", sampling_.temperature},
          {"top_p", sampling_.top_p},
          {"top_k", sampling_.top_k},
          {"max_completion_length", sampling_.max_tokens},
          {"max_prompt_length", t.max_prompt_length()},
          {"seed", sampling_.seed}}},
        {"keep_per_prompt", t.keep_per_prompt()},
        {"verification", "rule rewards accuracy == 1 and format == 1"},
        {"prompts", totals.prompts},
        {"prompts_without_completions", totals.skipped},
        {"completions", totals.completions},
        {"passed", totals.passed},
        {"kept", written},
        {"pass_rate", totals.pass_rate()},
        {"prompt_tokens", totals.prompt_tokens},
        {"completion_tokens", totals.completion_tokens},
        {"seconds", seconds},
        {"tokens_per_second", run_tokens / std::max(1e-9, seconds)},
        {"world_size", ctx.comm.world_size()},
        {"traces", fs::absolute(traces).string()}};
    if (written == 0) {
      RETURN_IF_ERROR(internal::WriteJsonFile((out / "distill_manifest.json").string(), doc));
      return absl::FailedPreconditionError(
          absl::StrCat("trace distillation kept no trace: none of ", totals.completions,
                       " completions passed verification (accuracy and format); see ",
                       (out / "distill_manifest.json").string()));
    }
    data::PrepareOptions prepare;
    prepare.inputs = {traces};
    prepare.out_dir = (out / "dataset").string();
    prepare.tokenizer_path = dataset_tokenizer_;
    prepare.overwrite = true;
    prepare.image.min_pixels = t.min_pixels();
    prepare.image.max_pixels = t.max_pixels();
    ASSIGN_OR_RETURN(const data::DatasetManifest prepared, data::PrepareDataset(prepare));
    doc["dataset"] = fs::absolute(prepare.out_dir).string();
    doc["dataset_samples"] = prepared.num_samples;
    doc["dataset_tokenizer"] = dataset_tokenizer_;
    RETURN_IF_ERROR(internal::WriteJsonFile((out / "distill_manifest.json").string(), doc));
    ctx.events.Emit("metric", {{"step", step},
                               {"values",
                                {{"prompts_done", totals.prompts},
                                 {"prompts_total", n},
                                 {"completions", totals.completions},
                                 {"passed", totals.passed},
                                 {"kept", written},
                                 {"pass_rate", totals.pass_rate()},
                                 {"tokens_per_second", doc["tokens_per_second"]}}}});
    ctx.events.Emit("status", {{"state", "distilled"},
                               {"traces", doc["traces"]},
                               {"dataset", doc["dataset"]},
                               {"kept", written}});
    return absl::OkStatus();
  }

  std::vector<internal::TracePrompt> prompts_;
  internal::TeacherSampling sampling_;
  std::unique_ptr<internal::Teacher> teacher_;
  bool collective_ = false;
  std::string dataset_tokenizer_;
};

}  // namespace

std::unique_ptr<Stage> MakeTraceDistillStage() { return std::make_unique<TraceDistillStage>(); }

}  // namespace trainctl::trainer
