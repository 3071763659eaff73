#include "worker/trainer/stages/internal/rollout.h"

#include <filesystem>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "worker/trainer/model/status_guard.h"
#include "worker/trainer/stages/internal/autocast.h"

namespace trainctl::trainer::internal {
namespace {

namespace fs = std::filesystem;

double Seconds(absl::Time since) { return absl::ToDoubleSeconds(absl::Now() - since); }

}  // namespace

uint64_t SamplingSeed(int64_t seed, int64_t generation, int64_t completion) {
  uint64_t z = static_cast<uint64_t>(seed) * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL;
  z ^= static_cast<uint64_t>(generation) * 0xbf58476d1ce4e5b9ULL;
  z ^= static_cast<uint64_t>(completion) * 0x94d049bb133111ebULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

absl::StatusOr<std::unique_ptr<tokenizer::BpeTokenizer>> LoadCompletionTokenizer(
    const StageContext& ctx, const data::ShardReader& reader, const std::string& kind) {
  std::string path;
  if (!ctx.tokenizer_dir.empty() && fs::exists(fs::path(ctx.tokenizer_dir) / "tokenizer.json")) {
    path = ctx.tokenizer_dir;
  } else if (!reader.manifest().tokenizer.empty()) {
    path = reader.manifest().tokenizer;
  } else {
    return absl::FailedPreconditionError(
        absl::StrCat(kind, " decodes completions for the rewards: neither the model (",
                     ctx.spec.model_name_or_path(), ") nor the data's manifest (",
                     ctx.spec.data_path(), ") names a tokenizer"));
  }
  auto loaded = tokenizer::BpeTokenizer::Load(path);
  if (!loaded.ok()) {
    return absl::Status(
        loaded.status().code(),
        absl::StrCat("the tokenizer to decode completions: ", loaded.status().message()));
  }
  return std::move(*loaded);
}

std::vector<int64_t> EosIds(const tokenizer::BpeTokenizer& tokenizer) {
  std::vector<int64_t> ids;
  for (const char* eos : {"<|im_end|>", "<|endoftext|>"}) {
    if (auto id = tokenizer.TokenToId(eos)) ids.push_back(*id);
  }
  return ids;
}

int64_t PadId(const data::ShardReader& reader) {
  return reader.manifest().pad_token_id >= 0 ? reader.manifest().pad_token_id
                                             : model::kEndOfTextTokenId;
}

absl::StatusOr<model::GenerationOutput> GenerateCompletions(StageContext& ctx, zero::Engine& engine,
                                                            const std::vector<GrpoRow>& rows,
                                                            model::GenerationOptions options,
                                                            RolloutCost* cost) {
  // Stage 3 holds the gathered weights for the whole generation (one rank too: each unit's
  // working weights would otherwise be cast from its fp32 slice on every token), so the units run
  // no collective while decoding and the steps can be replayed as a CUDA graph.
  const bool stage3 = engine.options().stage == 3;
  const bool hold = stage3 && ctx.training.gather_for_generation();
  options.units_resident = hold;
  // Tensor-parallel MLPs and attention sum their parts over the group on every decoding step: NCCL
  // collectives are not captured into the graph.
  if (ctx.mesh.tensor > 1) options.cuda_graph = false;
  // Every rank decodes until all are done: at stage 3 without held weights each step gathers
  // units over the ranks; with tensor parallelism each step sums MLPs and attention over the group,
  // whose ranks must take the same number of steps even if their samples ever differed.
  if ((stage3 && ctx.comm.world_size() > 1 && !hold) || ctx.mesh.tensor > 1) {
    options.all_done = [&ctx](bool done) {
      torch::Tensor open = torch::tensor({done ? 0.0 : 1.0}, torch::kFloat64);
      ctx.comm.AllReduce(open, "generation lock-step").Wait();
      return open.item<double>() == 0;
    };
  }
  RolloutCost here;
  model::GenerationOutput generated;
  const absl::Time start = absl::Now();
  // Prefixed here, not by Guarded: model::Generate returns its own collective failures as a
  // Status, which must read "generation: ..." as the exceptions thrown here do.
  const absl::Status generation = model::Guarded("", [&]() -> absl::Status {
    const model::ModelInputs prompts = PromptInputs(rows, options.pad_token_id, ctx.device);
    zero::Engine::HeldWeights held;
    if (hold) {
      const absl::Time gather_start = absl::Now();
      ASSIGN_OR_RETURN(held, engine.HoldWeights());
      here.gather_seconds = Seconds(gather_start);
      here.held_bytes = held.bytes();
    }
    AutocastGuard autocast(engine.options().compute_dtype == torch::kBFloat16, ctx.device.type(),
                           torch::kBFloat16);
    ASSIGN_OR_RETURN(generated, model::Generate(engine.model(), prompts, options));
    return absl::OkStatus();
  });
  if (!generation.ok() && !absl::StartsWith(generation.message(), "generation")) {
    return absl::Status(generation.code(), absl::StrCat("generation: ", generation.message()));
  }
  RETURN_IF_ERROR(generation);
  here.seconds = Seconds(start);
  if (cost != nullptr) *cost = here;
  return generated;
}

RowShare SequenceShare(const StageContext& ctx, int64_t rows) {
  const int64_t sp = ctx.mesh.sequence;
  if (ctx.sequence_comm == nullptr || rows % sp != 0) return {0, rows};
  const int64_t s = ctx.mesh.SequenceRank(ctx.comm.rank());
  return {s * rows / sp, (s + 1) * rows / sp};
}

absl::Status ShareCompletions(const StageContext& ctx, RowShare share, int64_t max_new_tokens,
                              std::vector<GrpoRow>* rows) {
  const int64_t n = static_cast<int64_t>(rows->size());
  if (share.whole(n)) return absl::OkStatus();
  // Per row: its length, 1 when truncated, its tokens; rows decoded elsewhere stay zero here, so
  // the group's sum is every row once. A completion that does not fit is sent as length -1, so
  // that every rank of the group fails on it instead of leaving its peers waiting.
  torch::Tensor table = torch::zeros({n, 2 + max_new_tokens}, torch::kInt64);
  auto at = table.accessor<int64_t, 2>();
  for (int64_t i = share.begin; i < share.end; ++i) {
    const GrpoRow& row = (*rows)[static_cast<size_t>(i)];
    const int64_t length = static_cast<int64_t>(row.completion.size());
    at[i][0] = length > max_new_tokens ? -1 : length;
    at[i][1] = row.truncated ? 1 : 0;
    for (int64_t j = 0; j < at[i][0]; ++j) at[i][2 + j] = row.completion[static_cast<size_t>(j)];
  }
  RETURN_IF_ERROR(ctx.sequence_comm->AllReduceSum(table, "rollout completions"));
  for (int64_t i = 0; i < n; ++i) {
    if (at[i][0] < 0) {
      return absl::InternalError(absl::StrCat("rollout row ", i, ": a completion longer than ",
                                              "max_completion_length ", max_new_tokens));
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    if (i >= share.begin && i < share.end) continue;
    GrpoRow& row = (*rows)[static_cast<size_t>(i)];
    const int64_t length = at[i][0];
    row.truncated = at[i][1] != 0;
    row.completion.assign(table[i].data_ptr<int64_t>() + 2,
                          table[i].data_ptr<int64_t>() + 2 + length);
  }
  return absl::OkStatus();
}

}  // namespace trainctl::trainer::internal
