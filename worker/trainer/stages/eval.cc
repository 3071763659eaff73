#include "worker/trainer/stages/eval.h"

#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/data/shard_reader.h"
#include "common/status_macros.h"
#include "worker/trainer/rewards/reward_model.h"
#include "worker/trainer/rewards/rule_rewards.h"
#include "worker/trainer/stages/eval_metrics.h"
#include "worker/trainer/stages/internal/grpo_rows.h"
#include "worker/trainer/stages/internal/labelled_batches.h"
#include "worker/trainer/stages/internal/rollout.h"

namespace trainctl::trainer {
namespace {

namespace fs = std::filesystem;
using internal::GrpoRow;

// Per prompt, all-reduced: completions, correct, format sum, length sum, reward model sum.
constexpr int64_t kColumns = 5;

std::string Stem(const std::string& path) {
  std::string name = fs::path(path).filename().string();
  if (name.empty()) name = fs::path(path).parent_path().filename().string();
  const auto dot = name.find('.');
  return dot == 0 || dot == std::string::npos ? name : name.substr(0, dot);
}

// Non-blank lines of `path`; -1 when it cannot be read.
int64_t Records(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return -1;
  int64_t n = 0;
  std::string line;
  while (std::getline(in, line)) {
    if (!absl::StripAsciiWhitespace(line).empty()) ++n;
  }
  return n;
}

struct Datasets {
  std::vector<std::string> names;
  std::vector<int> of_sample;  // empty: every sample in names[0]
};

// The manifest's inputs as datasets when the samples can be attributed to them (see eval.h).
Datasets FindDatasets(const data::ShardReader& reader, const std::string& data_path,
                      std::string* warning) {
  const std::vector<std::string>& inputs = reader.manifest().inputs;
  Datasets out;
  if (inputs.size() == 1) {
    out.names = {Stem(inputs[0])};
    return out;
  }
  out.names = {Stem(data_path)};
  if (inputs.empty()) return out;
  std::vector<int64_t> counts;
  int64_t total = 0;
  for (const std::string& input : inputs) {
    counts.push_back(Records(input));
    if (counts.back() < 0) {
      *warning = absl::StrCat("eval: cannot read ", input, " to attribute samples to datasets; ",
                              "reporting one dataset");
      return out;
    }
    total += counts.back();
  }
  if (total != reader.size()) {
    *warning =
        absl::StrCat("eval: the inputs hold ", total, " records but the shards ", reader.size(),
                     " samples (records skipped or dropped at prepare); ", "reporting one dataset");
    return out;
  }
  out.names.clear();
  std::set<std::string> seen;
  for (size_t d = 0; d < inputs.size(); ++d) {
    std::string name = Stem(inputs[d]);
    if (!seen.insert(name).second) name = absl::StrCat(name, "-", d);
    seen.insert(name);
    out.names.push_back(name);
    out.of_sample.insert(out.of_sample.end(), static_cast<size_t>(counts[d]), static_cast<int>(d));
  }
  return out;
}

class EvalStage final : public MeasuringStage {
 public:
  absl::StatusOr<int64_t> Setup(StageContext& ctx) override {
    ASSIGN_OR_RETURN(reader_, data::ShardReader::Open(ctx.spec.data_path()));
    RETURN_IF_ERROR(internal::CheckPreparedPixels(ctx, *reader_));
    if (reader_->size() == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.data_path: ", ctx.spec.data_path(), " holds no samples"));
    }
    ASSIGN_OR_RETURN(tokenizer_, internal::LoadCompletionTokenizer(ctx, *reader_, "eval"));
    pad_id_ = internal::PadId(*reader_);
    eos_ids_ = internal::EosIds(*tokenizer_);
    std::string warning;
    datasets_ = FindDatasets(*reader_, ctx.spec.data_path(), &warning);
    if (!warning.empty()) ctx.Warn(warning);
    if (!ctx.spec.reward_model_name_or_path().empty()) {
      ASSIGN_OR_RETURN(
          reward_model_,
          rewards::RewardModel::Load(ctx.spec.reward_model_name_or_path(), ctx.options, &ctx.comm));
    }
    if (!ctx.spec.baseline_model_name_or_path().empty()) {
      ASSIGN_OR_RETURN(auto resolved, ResolveModel(ctx.spec.baseline_model_name_or_path(),
                                                   ctx.env.model_registry));
      ASSIGN_OR_RETURN(baseline_, zero::Engine::CreateFrozen(resolved.first, ctx.options, &ctx.comm,
                                                             ctx.training.seed(), resolved.second));
      baseline_->model().SetAttentionImpl(ctx.engine->model().attention_impl());
    }
    return 1;
  }

  absl::Status Evaluate(StageContext& ctx) override {
    const auto& t = ctx.training;
    nlohmann::json doc = {{"kind", "eval"},
                          {"model", ctx.spec.model_name_or_path()},
                          {"data_path", ctx.spec.data_path()},
                          {"world_size", ctx.comm.world_size()},
                          {"generation",
                           {{"temperature", t.temperature()},
                            {"top_p", t.top_p()},
                            {"top_k", t.top_k()},
                            {"num_generations", t.num_generations()},
                            {"max_completion_length", t.max_completion_length()},
                            {"max_prompt_length", t.max_prompt_length()},
                            {"seed", t.seed()}}},
                          {"datasets", datasets_.names}};
    ASSIGN_OR_RETURN(torch::Tensor results, Measure(ctx, *ctx.engine));
    AddTables(results, t.num_generations(), &doc);
    if (baseline_) {
      ASSIGN_OR_RETURN(torch::Tensor base, Measure(ctx, *baseline_));
      nlohmann::json& b = doc["baseline"];
      b["model"] = ctx.spec.baseline_model_name_or_path();
      AddTables(base, t.num_generations(), &b);
    }
    if (!ctx.lead()) return absl::OkStatus();
    ctx.events.Emit("metric", {{"step", 0}, {"values", FlattenEvalMetrics(doc)}});
    std::error_code ec;
    fs::create_directories(ctx.spec.output_dir(), ec);
    const fs::path path = fs::path(ctx.spec.output_dir()) / "eval.json";
    const fs::path tmp = path.string() + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out << doc.dump(2) << "\n";
      if (!out.flush()) {
        return absl::UnavailableError(absl::StrCat("cannot write ", tmp.string()));
      }
    }
    fs::rename(tmp, path, ec);
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat("cannot rename ", tmp.string(), " to ", path.string(), ": ", ec.message()));
    }
    ctx.events.Emit("status", {{"state", "evaluated"}, {"path", fs::absolute(path).string()}});
    std::cout << FormatEvalTable(doc) << std::flush;  // the log shows the table as eval.json has it
    return absl::OkStatus();
  }

 private:
  // Every prompt's results [N, kColumns] with `engine`, the same on every rank.
  absl::StatusOr<torch::Tensor> Measure(StageContext& ctx, zero::Engine& engine) {
    const auto& t = ctx.training;
    const int64_t n_prompts = reader_->size();
    const int64_t world = ctx.comm.world_size(), rank = ctx.comm.rank();
    const int64_t per_rank = (n_prompts + world - 1) / world;
    const int64_t k = t.num_generations();
    const int64_t rows_here = per_rank * k;
    const int64_t batch = std::max(1, t.per_device_eval_batch_size());
    torch::Tensor results = torch::zeros({n_prompts, kColumns}, torch::kFloat64);
    model::GenerationOptions g;
    g.max_new_tokens = t.max_completion_length();
    g.temperature = t.temperature();
    g.top_p = t.top_p();
    g.top_k = t.top_k();
    g.eos_token_ids = eos_ids_;
    g.pad_token_id = pad_id_;
    for (int64_t a = 0; a < rows_here; a += batch) {
      const int64_t b = std::min(rows_here, a + batch);
      std::vector<GrpoRow> rows;
      std::vector<int64_t> prompt_of;  // -1: padding
      g.row_seeds.clear();
      for (int64_t r = a; r < b; ++r) {
        const int64_t prompt = rank * per_rank + r / k;
        const bool real = prompt < n_prompts;
        ASSIGN_OR_RETURN(GrpoRow row,
                         internal::PromptRow(*reader_, real ? prompt : 0, t.max_prompt_length()));
        rows.push_back(std::move(row));
        prompt_of.push_back(real ? prompt : -1);
        g.row_seeds.push_back(internal::SamplingSeed(t.seed(), real ? prompt : 0, r % k));
      }
      ASSIGN_OR_RETURN(model::GenerationOutput out,
                       internal::GenerateCompletions(ctx, engine, rows, g));
      for (size_t i = 0; i < rows.size(); ++i) rows[i].completion = out.tokens[i];
      std::vector<double> scores(rows.size(), 0.0);
      if (reward_model_) {
        const internal::TrainInputs in = internal::MakeTrainInputs(
            rows, 0, static_cast<int64_t>(rows.size()), pad_id_, false, ctx.device);
        ASSIGN_OR_RETURN(scores, reward_model_->Score(in.inputs));
      }
      for (size_t i = 0; i < rows.size(); ++i) {
        if (prompt_of[i] < 0) continue;
        GrpoRow& row = rows[i];
        std::vector<int32_t> ids(row.completion.begin(), row.completion.end());
        ASSIGN_OR_RETURN(row.text, tokenizer_->Decode(ids, /*skip_special_tokens=*/true,
                                                      /*drop_unknown_ids=*/true));
        const float accuracy = rewards::AccuracyReward(row.text, row.solution);
        torch::Tensor line = results[prompt_of[i]];
        line[0] += 1;
        line[1] += accuracy >= 0.5f ? 1.0 : 0.0;
        line[2] += rewards::FormatReward(row.text, row.solution);
        line[3] += static_cast<double>(row.completion.size());
        line[4] += scores[i];
      }
    }
    RETURN_IF_ERROR(ctx.comm.AllReduceSum(results, "eval results"));
    return results;
  }

  // The overall and per-dataset tables of `results` into `doc`.
  void AddTables(const torch::Tensor& results, int64_t k, nlohmann::json* doc) const {
    std::vector<EvalTable> tables(datasets_.names.size());
    EvalTable overall;
    for (int64_t i = 0; i < results.size(0); ++i) {
      const torch::Tensor line = results[i];
      PromptResult p;
      p.n = static_cast<int64_t>(line[0].item<double>());
      p.correct = static_cast<int64_t>(line[1].item<double>());
      p.format = line[2].item<double>();
      p.length = line[3].item<double>();
      p.reward_model = line[4].item<double>();
      overall.Add(p);
      const size_t d =
          datasets_.of_sample.empty() ? 0 : static_cast<size_t>(datasets_.of_sample[i]);
      tables[d].Add(p);
    }
    const bool rm = reward_model_ != nullptr;
    (*doc)["overall"] = overall.ToJson(k, rm);
    nlohmann::json& by = (*doc)["by_dataset"] = nlohmann::json::object();
    for (size_t d = 0; d < tables.size(); ++d) by[datasets_.names[d]] = tables[d].ToJson(k, rm);
  }

  std::shared_ptr<const data::ShardReader> reader_;
  std::unique_ptr<tokenizer::BpeTokenizer> tokenizer_;
  std::vector<int64_t> eos_ids_;
  int64_t pad_id_ = model::kEndOfTextTokenId;
  Datasets datasets_;
  std::unique_ptr<rewards::RewardModel> reward_model_;
  std::unique_ptr<zero::Engine> baseline_;
};

void Flatten(const nlohmann::json& tables, const std::string& prefix, nlohmann::json* values) {
  for (const auto& [name, value] : tables["overall"].items()) (*values)[prefix + name] = value;
  for (const auto& [dataset, table] : tables["by_dataset"].items()) {
    for (const auto& [name, value] : table.items()) {
      (*values)[absl::StrCat(prefix, dataset, "/", name)] = value;
    }
  }
}

}  // namespace

nlohmann::json FlattenEvalMetrics(const nlohmann::json& doc) {
  nlohmann::json values = nlohmann::json::object();
  Flatten(doc, "", &values);
  if (doc.contains("baseline")) Flatten(doc["baseline"], "baseline/", &values);
  return values;
}

std::unique_ptr<Stage> MakeEvalStage() { return std::make_unique<EvalStage>(); }

}  // namespace trainctl::trainer
