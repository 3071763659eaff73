// What GRPO's rollout and eval share: the tokenizer that decodes completions, the eos ids, each
// completion's sampling seed, and generation over a (possibly ZeRO-3 sharded) engine with its
// weights held or in lock-step.
#ifndef TRAINCTL_WORKER_TRAINER_STAGES_INTERNAL_ROLLOUT_H_
#define TRAINCTL_WORKER_TRAINER_STAGES_INTERNAL_ROLLOUT_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/data/shard_reader.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "worker/trainer/model/generation.h"
#include "worker/trainer/stages/internal/grpo_rows.h"
#include "worker/trainer/stages/loop.h"

namespace trainctl::trainer::internal {

// Maps (seed, generation, completion) to a sampling seed: reproducible, the same on any number of
// ranks and after a resume.
uint64_t SamplingSeed(int64_t seed, int64_t generation, int64_t completion);

// The tokenizer of the model directory (ctx.tokenizer_dir), else the one the data's manifest
// names. FAILED_PRECONDITION when neither has one (`kind` names the job kind in the message);
// the loader's error otherwise.
absl::StatusOr<std::unique_ptr<tokenizer::BpeTokenizer>> LoadCompletionTokenizer(
    const StageContext& ctx, const data::ShardReader& reader, const std::string& kind);

// <|im_end|> and <|endoftext|> as `tokenizer` spells them.
std::vector<int64_t> EosIds(const tokenizer::BpeTokenizer& tokenizer);

// The data's pad id, else <|endoftext|>.
int64_t PadId(const data::ShardReader& reader);

struct RolloutCost {
  double seconds = 0;         // generation, gathers included
  double gather_seconds = 0;  // holding the weights (stage 3, gather_for_generation)
  int64_t held_bytes = 0;
};

// Generates completions of `rows`' prompts with `engine`'s model. Collective when `engine` is
// sharded (stage 3, world > 1): with ctx.training.gather_for_generation the weights are held for
// the call, else the ranks decode in lock-step; every rank must call it equally often.
absl::StatusOr<model::GenerationOutput> GenerateCompletions(StageContext& ctx, zero::Engine& engine,
                                                            const std::vector<GrpoRow>& rows,
                                                            model::GenerationOptions options,
                                                            RolloutCost* cost = nullptr);

// The rows [begin, end) of `rows` rows this rank decodes and scores: a sequence-parallel group's
// ranks (which share their rows) each take an equal share, rank s of sp rows [s n / sp,
// (s + 1) n / sp); all of them without a group, or when sp does not divide the rows (equal shares
// keep the ranks' forwards, which may gather ZeRO-3 units over the group, equally many).
struct RowShare {
  int64_t begin = 0, end = 0;
  bool whole(int64_t rows) const { return begin == 0 && end == rows; }
};
RowShare SequenceShare(const StageContext& ctx, int64_t rows);

// After each rank of ctx.sequence_comm decoded its SequenceShare of `rows`: every rank gets every
// row's completion and truncation flag (one all-reduce of [rows, 2 + max_new_tokens] token ids
// over the group). A no-op when this rank decoded them all.
absl::Status ShareCompletions(const StageContext& ctx, RowShare share, int64_t max_new_tokens,
                              std::vector<GrpoRow>* rows);

}  // namespace trainctl::trainer::internal

#endif  // TRAINCTL_WORKER_TRAINER_STAGES_INTERNAL_ROLLOUT_H_
