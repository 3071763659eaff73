#include "worker/trainer/stages/internal/model_teacher.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/data/chat_prompt.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/trainer/stages/internal/grpo_rows.h"
#include "worker/trainer/stages/internal/rollout.h"

namespace trainctl::trainer::internal {
namespace {

// The prompt's tokens other than its images' pads: what max_prompt_length bounds (as GRPO keeps
// images whole, an image's tokens do not count).
int64_t TextTokens(const data::ChatPrompt& prompt) {
  int64_t image_tokens = 0;
  for (size_t k = 0; k + 2 < prompt.grid_thw.size(); k += 3) {
    image_tokens += prompt.grid_thw[k] * prompt.grid_thw[k + 1] * prompt.grid_thw[k + 2] /
                    (data::kMergeSize * data::kMergeSize);
  }
  return static_cast<int64_t>(prompt.ids.size()) - image_tokens;
}

class ModelTeacher final : public Teacher {
 public:
  ModelTeacher(StageContext& ctx, zero::Engine& engine,
               std::unique_ptr<tokenizer::BpeTokenizer> tokenizer, ModelTeacherOptions options)
      : ctx_(ctx),
        engine_(engine),
        tokenizer_(std::move(tokenizer)),
        options_(std::move(options)),
        eos_ids_(EosIds(*tokenizer_)),
        pad_id_(tokenizer_->TokenToId("<|endoftext|>")
                    .value_or(static_cast<int32_t>(model::kEndOfTextTokenId))) {}

  std::string DescribeJson() const override {
    return nlohmann::json{{"kind", "model"}, {"model", options_.model}}.dump();
  }

  absl::StatusOr<std::vector<TeacherAnswer>> Complete(const std::vector<TeacherPrompt>& prompts,
                                                      const TeacherSampling& sampling) override {
    std::vector<TeacherAnswer> answers(prompts.size());
    std::vector<GrpoRow> rows;
    std::vector<size_t> answer_of;  // per row
    model::GenerationOptions g;
    g.max_new_tokens = sampling.max_tokens;
    g.temperature = sampling.temperature;
    g.top_p = sampling.top_p;
    g.top_k = sampling.top_k;
    g.eos_token_ids = eos_ids_;
    g.pad_token_id = pad_id_;
    for (size_t i = 0; i < prompts.size(); ++i) {
      answers[i].index = prompts[i].index;
      ASSIGN_OR_RETURN(data::ChatPrompt prompt, Build(prompts[i]));
      answers[i].prompt_tokens = static_cast<int64_t>(prompt.ids.size());
      if (TextTokens(prompt) > options_.max_prompt_length) continue;
      GrpoRow row;
      row.sample = prompts[i].index;
      row.prompt = std::move(prompt.ids);
      row.pixel_values = std::move(prompt.pixel_values);
      row.grid = std::move(prompt.grid_thw);
      for (int64_t j = 0; j < sampling.n; ++j) {
        rows.push_back(row);
        answer_of.push_back(i);
        g.row_seeds.push_back(SamplingSeed(static_cast<int64_t>(sampling.seed), row.sample, j));
      }
    }
    const bool placeholder = rows.empty();
    if (placeholder) {
      if (!ModelTeacherIsCollective(ctx_, engine_)) return answers;
      GrpoRow row;  // decoded only to keep the ranks' collectives in step
      row.prompt = {pad_id_};
      rows.push_back(std::move(row));
      g.row_seeds.push_back(0);
    }
    ASSIGN_OR_RETURN(model::GenerationOutput out, GenerateCompletions(ctx_, engine_, rows, g));
    if (placeholder) return answers;
    for (size_t r = 0; r < rows.size(); ++r) {
      TeacherCompletion c;
      const std::vector<int32_t> ids(out.tokens[r].begin(), out.tokens[r].end());
      ASSIGN_OR_RETURN(c.text, tokenizer_->Decode(ids, /*skip_special_tokens=*/true,
                                                  /*drop_unknown_ids=*/true));
      c.finish_reason = out.stopped[r] ? "stop" : "length";
      c.completion_tokens = static_cast<int64_t>(ids.size());
      answers[answer_of[r]].completions.push_back(std::move(c));
    }
    return answers;
  }

 private:
  absl::StatusOr<data::ChatPrompt> Build(const TeacherPrompt& prompt) const {
    std::vector<data::ProcessedImage> images;
    for (const std::string& path : prompt.images) {
      absl::StatusOr<data::RgbImage> image = data::ReadImageFile(path);
      absl::StatusOr<data::ProcessedImage> processed =
          image.ok() ? data::PreprocessImage(*image, options_.image)
                     : absl::StatusOr<data::ProcessedImage>(image.status());
      if (!processed.ok()) {
        return absl::Status(processed.status().code(),
                            absl::StrCat("prompt ", prompt.index, ": image ", path, ": ",
                                         processed.status().message()));
      }
      images.push_back(*std::move(processed));
    }
    absl::StatusOr<data::ChatPrompt> built =
        data::BuildChatPrompt(prompt.messages, images, *tokenizer_);
    if (!built.ok()) {
      return absl::Status(built.status().code(),
                          absl::StrCat("prompt ", prompt.index, ": ", built.status().message()));
    }
    return built;
  }

  StageContext& ctx_;
  zero::Engine& engine_;
  const std::unique_ptr<tokenizer::BpeTokenizer> tokenizer_;
  const ModelTeacherOptions options_;
  const std::vector<int64_t> eos_ids_;
  const int64_t pad_id_;
};

}  // namespace

bool ModelTeacherIsCollective(const StageContext& ctx, const zero::Engine& engine) {
  return engine.options().stage == 3 && ctx.comm.world_size() > 1;
}

std::unique_ptr<Teacher> MakeModelTeacher(StageContext& ctx, zero::Engine& engine,
                                          std::unique_ptr<tokenizer::BpeTokenizer> tokenizer,
                                          ModelTeacherOptions options) {
  return std::make_unique<ModelTeacher>(ctx, engine, std::move(tokenizer), std::move(options));
}

}  // namespace trainctl::trainer::internal
