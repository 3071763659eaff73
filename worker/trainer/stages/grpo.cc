#include "worker/trainer/stages/grpo.h"

#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/data/loader.h"
#include "common/data/shard_reader.h"
#include "common/status_macros.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "worker/trainer/model/generation.h"
#include "worker/trainer/model/status_guard.h"
#include "worker/trainer/rewards/reward_model.h"
#include "worker/trainer/rewards/rule_rewards.h"
#include "worker/trainer/stages/grpo_loss.h"
#include "worker/trainer/stages/internal/autocast.h"
#include "worker/trainer/stages/internal/grpo_rows.h"
#include "worker/trainer/stages/internal/labelled_batches.h"
#include "worker/trainer/stages/internal/rollout.h"

namespace trainctl::trainer {
namespace {

namespace fs = std::filesystem;
using internal::GrpoRow;

double Seconds(absl::Time since) { return absl::ToDoubleSeconds(absl::Now() - since); }

using internal::SamplingSeed;

class GrpoStage final : public Stage {
 public:
  absl::StatusOr<int64_t> Setup(StageContext& ctx) override {
    const auto& t = ctx.training;
    ASSIGN_OR_RETURN(options_.loss_type, ParseGrpoLossType(t.loss_type()));
    ASSIGN_OR_RETURN(options_.importance_sampling_level,
                     ParseImportanceSamplingLevel(t.importance_sampling_level()));
    ASSIGN_OR_RETURN(scale_, ParseScaleRewards(t.scale_rewards()));
    options_.epsilon_low = t.epsilon();
    options_.epsilon_high = t.has_epsilon_high() ? t.epsilon_high() : t.epsilon();
    options_.beta = t.beta();
    options_.max_completion_length = t.max_completion_length();

    ASSIGN_OR_RETURN(reader_, data::ShardReader::Open(ctx.spec.data_path()));
    RETURN_IF_ERROR(internal::CheckPreparedPixels(ctx, *reader_));
    ASSIGN_OR_RETURN(tokenizer_, internal::LoadCompletionTokenizer(ctx, *reader_, "grpo"));
    pad_id_ = internal::PadId(*reader_);
    eos_ids_ = internal::EosIds(*tokenizer_);

    // Rewards: the rule functions by name, then the reward model; one weight each.
    bool needs_solution = false;
    for (const std::string& name : ctx.spec.reward_funcs()) {
      ASSIGN_OR_RETURN(rewards::RuleReward fn, rewards::FindRuleReward(name));
      reward_names_.push_back(name);
      rule_rewards_.push_back(std::move(fn));
      if (name != "format") needs_solution = true;
    }
    if (needs_solution) {
      // Shards written before format version 2 carry no solutions: every answer would score 0.
      int64_t missing = 0;
      for (int64_t i = 0; i < reader_->size(); ++i) missing += reader_->View(i).solution.empty();
      if (missing > 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            ctx.spec.data_path(), ": ", missing, " of ", reader_->size(),
            " samples have no solution for the rewards to compare with (shards prepared before "
            "shard format 2 carry none: run `trainctl prepare` again)"));
      }
    }
    if (!ctx.spec.reward_model_name_or_path().empty()) {
      ASSIGN_OR_RETURN(
          reward_model_,
          rewards::RewardModel::Load(ctx.spec.reward_model_name_or_path(), ctx.options, &ctx.comm));
      reward_names_.push_back("reward_model");
    }
    weights_.assign(reward_names_.size(), 1.0);
    if (t.reward_weights_size() > 0) {
      if (t.reward_weights_size() != static_cast<int>(reward_names_.size())) {
        return absl::InvalidArgumentError(absl::StrCat("training.reward_weights: one per reward (",
                                                       reward_names_.size(), "), got ",
                                                       t.reward_weights_size()));
      }
      weights_.assign(t.reward_weights().begin(), t.reward_weights().end());
    }
    if (reward_names_.empty()) {
      return absl::InvalidArgumentError(
          "grpo needs at least one reward (reward_funcs or "
          "reward_model_name_or_path)");
    }

    // The reference: the starting policy, frozen, sharded like the policy.
    if (options_.beta != 0) {
      ASSIGN_OR_RETURN(auto resolved,
                       ResolveModel(ctx.spec.model_name_or_path(), ctx.env.model_registry));
      ASSIGN_OR_RETURN(reference_,
                       zero::Engine::CreateFrozen(resolved.first, ctx.options, &ctx.comm, t.seed(),
                                                  resolved.second));
      reference_->model().SetAttentionImpl(ctx.engine->model().attention_impl());
      RETURN_IF_ERROR(ctx.SplitSequences(*reference_, "the reference model"));
    }

    // The step's shape, over the data-parallel ranks: a tensor- or sequence-parallel group's
    // ranks hold the same rows (the same sampling seeds, and logits equal on each of them after
    // every sum over the tensor group) and train them, each with its slice of the layers or of the
    // sequences in the training forwards. A tensor group decodes and scores its rows together; a
    // sequence group's ranks each decode and score a share of them (whole sequences) and exchange
    // the results.
    world_ = ctx.mesh.data;
    rank_ = ctx.mesh.DataRank(ctx.comm.rank());
    micro_rows_ = t.per_device_train_batch_size();
    accumulation_ = t.gradient_accumulation_steps();
    group_ = t.num_generations();
    const int64_t global = micro_rows_ * accumulation_ * world_;
    if (global % group_ != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "training.num_generations: must divide the completions of one step (world ", world_,
          " x per_device_train_batch_size ", micro_rows_, " x gradient_accumulation_steps ",
          accumulation_, " = ", global, "), got ", group_));
    }
    prompts_per_generation_ = global / group_;
    data::LoaderOptions order;
    order.seed = static_cast<uint64_t>(t.seed());
    order.prefetch_batches = 0;
    ASSIGN_OR_RETURN(order_, data::Loader::Create(reader_, order));
    generations_per_epoch_ =
        std::max<int64_t>(1, order_->UnitsInEpoch(0) / prompts_per_generation_);
    if (order_->UnitsInEpoch(0) < prompts_per_generation_) {
      ctx.Warn(absl::StrCat("the data has ", order_->UnitsInEpoch(0),
                            " prompts, fewer than one step's ", prompts_per_generation_,
                            "; prompts repeat within a step"));
    }
    return generations_per_epoch_ * std::max(1, t.num_iterations());
  }

  absl::StatusOr<StageStep> Step(StageContext& ctx, int64_t step) override {
    const int64_t mu = std::max(1, ctx.training.num_iterations());
    const int64_t generation = (step - 1) / mu;
    StageStep out;
    nlohmann::json& m = out.metrics;
    double generation_seconds = 0, scoring_seconds = 0;
    if (generation != rollout_generation_) {
      absl::Time start = absl::Now();
      RETURN_IF_ERROR(Rollout(ctx, generation));
      generation_seconds = Seconds(start);
      start = absl::Now();
      RETURN_IF_ERROR(Score(ctx));
      if (mu > 1) RETURN_IF_ERROR(OldLogProbs(ctx));
      scoring_seconds = Seconds(start);
      rollout_generation_ = generation;
    }
    const absl::Time start = absl::Now();
    RETURN_IF_ERROR(Train(ctx, &out));
    m.update(rollout_metrics_);
    m["time/generation_seconds"] = generation_seconds;
    m["time/scoring_seconds"] = scoring_seconds;
    m["time/training_seconds"] = Seconds(start);
    return out;
  }

  data::LoaderState DataState() const override {
    const int64_t next = rollout_generation_ + 1;
    return {next / generations_per_epoch_, next % generations_per_epoch_};
  }

  absl::Status RestoreDataState(const data::LoaderState& /*state*/, int64_t /*step*/) override {
    // The prompts and sampling seeds of a step follow from its number alone.
    rollout_generation_ = -1;
    return absl::OkStatus();
  }

 private:
  // `t` summed over the ranks, each group of ranks holding the same rows (sequence- and
  // tensor-parallel groups) counted once.
  static absl::Status SumOverRows(const StageContext& ctx, torch::Tensor& t,
                                  const std::string& what) {
    RETURN_IF_ERROR(ctx.SumOverRanks(t, what));
    if (ctx.mesh.sequence > 1) t.div_(ctx.mesh.sequence);
    return absl::OkStatus();
  }

  // This rank's rows of generation `generation`: prompts in the shared order, each repeated
  // num_generations times, rank r taking rows [r B, (r + 1) B).
  absl::Status PromptRows(StageContext& ctx, int64_t generation) {
    const int64_t rows_here = micro_rows_ * accumulation_;
    const int64_t max_prompt = ctx.training.max_prompt_length();
    rows_.clear();
    for (int64_t j = rank_ * rows_here; j < (rank_ + 1) * rows_here; ++j) {
      const int64_t q = j / group_;
      const int64_t epoch = generation / generations_per_epoch_;
      const int64_t at = (generation % generations_per_epoch_) * prompts_per_generation_ + q;
      if (plan_.epoch != epoch) plan_ = order_->Plan(epoch);
      const int64_t sample =
          plan_.samples[static_cast<size_t>(at % static_cast<int64_t>(plan_.samples.size()))];
      ASSIGN_OR_RETURN(GrpoRow row, internal::PromptRow(*reader_, sample, max_prompt));
      if (row.prompt_cut_images && !warned_long_prompt_) {
        ctx.Warn(absl::StrCat("sample ", sample, ": its prompt (", row.prompt.size(),
                              " tokens) is longer than max_prompt_length ", max_prompt,
                              " but holds images; kept whole"));
        warned_long_prompt_ = true;
      }
      rows_.push_back(std::move(row));
    }
    return absl::OkStatus();
  }

  // What this rank's decoding cost, for the `generation` event.
  struct Decoded {
    internal::RowShare share;
    internal::RolloutCost cost;
    int64_t new_tokens = 0, decode_steps = 0;  // of the share decoded here
  };

  // The policy samples rows_' completions: this rank its share of them (a sequence-parallel group
  // splits them), exchanged with the group's other ranks after.
  absl::StatusOr<Decoded> Decode(StageContext& ctx, int64_t generation) {
    const auto& t = ctx.training;
    const int64_t rows_here = static_cast<int64_t>(rows_.size());
    Decoded out;
    out.share = internal::SequenceShare(ctx, rows_here);
    std::vector<GrpoRow> mine(std::make_move_iterator(rows_.begin() + out.share.begin),
                              std::make_move_iterator(rows_.begin() + out.share.end));
    model::GenerationOptions g;
    g.max_new_tokens = t.max_completion_length();
    g.temperature = t.temperature();
    g.top_p = t.top_p();
    g.top_k = t.top_k();
    // One seed per completion, from its place in the generation batch: the same rollouts on any
    // number of ranks.
    for (int64_t j = out.share.begin; j < out.share.end; ++j) {
      g.row_seeds.push_back(SamplingSeed(t.seed(), generation, rank_ * rows_here + j));
    }
    g.eos_token_ids = eos_ids_;
    g.pad_token_id = pad_id_;
    ASSIGN_OR_RETURN(model::GenerationOutput generated,
                     internal::GenerateCompletions(ctx, *ctx.engine, mine, g, &out.cost));
    for (size_t i = 0; i < mine.size(); ++i) {
      mine[i].completion = generated.tokens[i];
      mine[i].truncated = !generated.stopped[i];
      out.new_tokens += static_cast<int64_t>(mine[i].completion.size());
    }
    out.decode_steps = generated.decode_steps;
    std::move(mine.begin(), mine.end(), rows_.begin() + out.share.begin);
    RETURN_IF_ERROR(internal::ShareCompletions(ctx, out.share, g.max_new_tokens, &rows_));
    return out;
  }

  // Generation `generation`'s rows and their completions, and the rollout's metrics.
  absl::Status Rollout(StageContext& ctx, int64_t generation) {
    const auto& t = ctx.training;
    RETURN_IF_ERROR(PromptRows(ctx, generation));
    const int64_t rows_here = static_cast<int64_t>(rows_.size());
    const uint64_t sent_before = ctx.comm.bytes_sent();
    ASSIGN_OR_RETURN(const Decoded decoded, Decode(ctx, generation));
    int64_t new_tokens = 0, truncated = 0;
    for (const GrpoRow& row : rows_) {
      new_tokens += static_cast<int64_t>(row.completion.size());
      truncated += row.truncated ? 1 : 0;
    }
    torch::Tensor sums = torch::tensor(
        {static_cast<double>(new_tokens), static_cast<double>(truncated), decoded.cost.seconds},
        torch::kFloat64);
    RETURN_IF_ERROR(SumOverRows(ctx, sums, "completion lengths"));
    const double total_rows = static_cast<double>(rows_here * world_);
    rollout_metrics_ = nlohmann::json::object();
    rollout_metrics_["completions/mean_length"] = sums[0].item<double>() / total_rows;
    rollout_metrics_["completions/clipped_ratio"] = sums[1].item<double>() / total_rows;
    rollout_metrics_["generation/tokens_per_second"] =
        sums[0].item<double>() / std::max(1e-9, sums[2].item<double>() / world_);
    if (ctx.lead() && !announced_generation_) {
      // ZeRO shards over the ranks with this rank's tensor position (data x sequence parallel).
      const bool sharded = ctx.options.stage == 3 && ctx.comm.world_size() / ctx.mesh.tensor > 1;
      const bool hold = sharded && t.gather_for_generation();
      // This rank's decoding: its share of the rows, their tokens, its time and steps.
      ctx.events.Emit("generation",
                      {{"weights", hold      ? "gathered once per rollout"
                                   : sharded ? "gathered per unit on every decoding step"
                                             : "whole on every rank"},
                       {"gather_for_generation", t.gather_for_generation()},
                       {"tensor_parallel_size", ctx.mesh.tensor},
                       {"rows", rows_here},
                       {"rows_decoded", decoded.share.end - decoded.share.begin},
                       {"zero_stage", ctx.options.stage},
                       {"held_bytes", decoded.cost.held_bytes},
                       {"gather_seconds", decoded.cost.gather_seconds},
                       {"seconds", decoded.cost.seconds},
                       {"comm_bytes", ctx.comm.bytes_sent() - sent_before},
                       {"new_tokens", decoded.new_tokens},
                       {"decode_steps", decoded.decode_steps}});
      announced_generation_ = true;
    }
    return absl::OkStatus();
  }

  // Rewards of this rank's rows, shared with every rank, and this rank's advantages.
  absl::Status Score(StageContext& ctx) {
    const int64_t k = static_cast<int64_t>(reward_names_.size());
    const int64_t rows_here = static_cast<int64_t>(rows_.size());
    // [world * rows, k]: this rank's block filled, the rest zero, then summed over ranks.
    torch::Tensor all = torch::zeros({world_ * rows_here, k}, torch::kFloat64);
    for (int64_t i = 0; i < rows_here; ++i) {
      GrpoRow& row = rows_[static_cast<size_t>(i)];
      std::vector<int32_t> ids(row.completion.begin(), row.completion.end());
      ASSIGN_OR_RETURN(row.text, tokenizer_->Decode(ids, /*skip_special_tokens=*/true,
                                                    /*drop_unknown_ids=*/true));
      for (size_t f = 0; f < rule_rewards_.size(); ++f) {
        all[rank_ * rows_here + i][static_cast<int64_t>(f)] =
            rule_rewards_[f](row.text, row.solution);
      }
    }
    if (reward_model_) {
      // A sequence-parallel group's ranks each score their share and sum the scores.
      const internal::RowShare share = internal::SequenceShare(ctx, rows_here);
      torch::Tensor scored = torch::zeros({rows_here}, torch::kFloat64);
      for (int64_t a = share.begin; a < share.end; a += micro_rows_) {
        const int64_t b = std::min(share.end, a + micro_rows_);
        const internal::TrainInputs in =
            internal::MakeTrainInputs(rows_, a, b, pad_id_, false, ctx.device);
        ASSIGN_OR_RETURN(std::vector<double> scores, reward_model_->Score(in.inputs));
        for (int64_t i = a; i < b; ++i) scored[i] = scores[static_cast<size_t>(i - a)];
      }
      if (!share.whole(rows_here)) {
        RETURN_IF_ERROR(ctx.sequence_comm->AllReduceSum(scored, "reward model scores"));
      }
      all.narrow(0, rank_ * rows_here, rows_here).select(1, k - 1).copy_(scored);
    }
    RETURN_IF_ERROR(SumOverRows(ctx, all, "rewards"));
    torch::Tensor weights = torch::tensor(weights_, torch::kFloat64);
    torch::Tensor total = (all * weights).sum(1);
    ASSIGN_OR_RETURN(Advantages adv, ComputeAdvantages(total, group_, scale_));
    for (int64_t i = 0; i < rows_here; ++i) {
      rows_[static_cast<size_t>(i)].advantage =
          adv.advantages[rank_ * rows_here + i].item<double>();
    }
    rollout_metrics_["reward"] = adv.reward_mean;
    rollout_metrics_["reward_std"] = adv.reward_std;
    rollout_metrics_["frac_reward_zero_std"] = adv.frac_reward_zero_std;
    const torch::Tensor means = all.mean(0);
    for (int64_t f = 0; f < k; ++f) {
      rollout_metrics_[absl::StrCat("rewards/", reward_names_[static_cast<size_t>(f)], "/mean")] =
          means[f].item<double>();
    }
    return absl::OkStatus();
  }

  // With num_iterations > 1: the log-probabilities of the policy that generated the rollout.
  absl::Status OldLogProbs(StageContext& ctx) {
    torch::NoGradGuard no_grad;
    old_logps_.clear();
    for (int64_t a = 0; a < static_cast<int64_t>(rows_.size()); a += micro_rows_) {
      const int64_t b = std::min<int64_t>(static_cast<int64_t>(rows_.size()), a + micro_rows_);
      ASSIGN_OR_RETURN(torch::Tensor logps,
                       LogProbs(ctx, *ctx.engine, TrainBatch(ctx, a, b, false)));
      old_logps_.push_back(logps);
    }
    return absl::OkStatus();
  }

  // Rows [a, b) as prompt + completion; with training.packing, packed padding-free into rows of
  // at most max(max_seq_length, longest row) tokens.
  internal::TrainInputs TrainBatch(const StageContext& ctx, int64_t a, int64_t b,
                                   bool mask_truncated) const {
    if (ctx.training.packing()) {
      return internal::MakePackedTrainInputs(rows_, a, b, pad_id_, mask_truncated,
                                             ctx.training.max_seq_length(), ctx.device);
    }
    return internal::MakeTrainInputs(rows_, a, b, pad_id_, mask_truncated, ctx.device);
  }

  absl::StatusOr<torch::Tensor> LogProbs(StageContext& ctx, zero::Engine& engine,
                                         const internal::TrainInputs& in) {
    torch::Tensor logps;
    RETURN_IF_ERROR(model::Guarded("log-probabilities", [&]() -> absl::Status {
      internal::AutocastGuard autocast(ctx.options.compute_dtype == torch::kBFloat16,
                                       ctx.device.type(), torch::kBFloat16);
      logps = internal::TrainLogProbs(engine.model(), in);
      return absl::OkStatus();
    }));
    return logps;
  }

  // The micro-batches of this rank: policy log-probabilities with grad, the reference's without,
  // the loss, backward.
  absl::Status Train(StageContext& ctx, StageStep* out) {
    const auto& t = ctx.training;
    const int64_t rows_here = static_cast<int64_t>(rows_.size());
    const bool mask_truncated = t.mask_truncated_completions();
    double active = 0;
    int64_t tokens = 0;
    for (const GrpoRow& row : rows_) {
      if (!(mask_truncated && row.truncated)) active += static_cast<double>(row.completion.size());
      tokens += static_cast<int64_t>(row.prompt.size() + row.completion.size());
    }
    torch::Tensor counts = torch::tensor({active, static_cast<double>(tokens)}, torch::kFloat64);
    RETURN_IF_ERROR(SumOverRows(ctx, counts, "completion tokens"));
    GrpoStepShape shape;
    shape.world_size = world_;
    shape.grad_accum_steps = accumulation_;
    shape.global_active_tokens = counts[0].item<double>();
    out->tokens = static_cast<int64_t>(counts[1].item<double>());
    out->samples = rows_here * world_;

    GrpoLossStats stats;
    double loss = 0;
    for (int64_t a = 0, micro = 0; a < rows_here; a += micro_rows_, ++micro) {
      const int64_t b = std::min(rows_here, a + micro_rows_);
      const internal::TrainInputs in = TrainBatch(ctx, a, b, mask_truncated);
      GrpoLossInputs li;
      li.advantages = in.advantages;
      li.completion_mask = in.completion_mask;
      if (reference_) {
        torch::NoGradGuard no_grad;
        ASSIGN_OR_RETURN(li.ref_per_token_logps, LogProbs(ctx, *reference_, in));
      }
      if (!old_logps_.empty()) li.old_per_token_logps = old_logps_[static_cast<size_t>(micro)];
      ASSIGN_OR_RETURN(li.per_token_logps, LogProbs(ctx, *ctx.engine, in));
      ASSIGN_OR_RETURN(GrpoLossOutput lo, GrpoLoss(li, options_, shape));
      // A sequence-parallel group's ranks each compute the whole rows' loss (the model gathers
      // the sequence back before the head), and their gradients add up over the ZeRO group:
      // each takes 1/size of it.
      const torch::Tensor contribution = lo.contribution / ctx.mesh.sequence;
      RETURN_IF_ERROR(ctx.engine->Backward(contribution));
      loss += contribution.item<double>();
      stats.Add(lo.stats);
    }
    torch::Tensor sums =
        torch::tensor({loss, stats.kl_sum, stats.kl_count, stats.clip_low_sum, stats.clip_high_sum,
                       stats.clip_region_sum, stats.clip_count},
                      torch::kFloat64);
    RETURN_IF_ERROR(ctx.SumOverRanks(sums, "grpo statistics"));
    GrpoLossStats global;
    global.kl_sum = sums[1].item<double>();
    global.kl_count = sums[2].item<double>();
    global.clip_low_sum = sums[3].item<double>();
    global.clip_high_sum = sums[4].item<double>();
    global.clip_region_sum = sums[5].item<double>();
    global.clip_count = sums[6].item<double>();
    out->loss = sums[0].item<double>();
    if (options_.beta != 0) out->metrics["kl"] = global.KlMean();
    out->metrics["clip_ratio/low_mean"] = global.ClipLowMean();
    out->metrics["clip_ratio/high_mean"] = global.ClipHighMean();
    out->metrics["clip_ratio/region_mean"] = global.ClipRegionMean();
    return absl::OkStatus();
  }

  GrpoLossOptions options_;
  ScaleRewards scale_ = ScaleRewards::kGroup;
  std::shared_ptr<const data::ShardReader> reader_;
  std::unique_ptr<data::Loader> order_;  // the prompts' order (one rank's view: every rank's)
  data::Loader::EpochPlan plan_;
  std::unique_ptr<tokenizer::BpeTokenizer> tokenizer_;
  std::vector<int64_t> eos_ids_;
  int64_t pad_id_ = model::kEndOfTextTokenId;
  std::vector<std::string> reward_names_;
  std::vector<rewards::RuleReward> rule_rewards_;
  std::unique_ptr<rewards::RewardModel> reward_model_;
  std::vector<double> weights_;
  std::unique_ptr<zero::Engine> reference_;

  int world_ = 1, rank_ = 0;
  int64_t micro_rows_ = 1, accumulation_ = 1, group_ = 2;
  int64_t prompts_per_generation_ = 1, generations_per_epoch_ = 1;

  int64_t rollout_generation_ = -1;
  std::vector<GrpoRow> rows_;
  std::vector<torch::Tensor> old_logps_;
  nlohmann::json rollout_metrics_ = nlohmann::json::object();
  bool announced_generation_ = false;
  bool warned_long_prompt_ = false;
};

}  // namespace

std::unique_ptr<Stage> MakeGrpoStage() { return std::make_unique<GrpoStage>(); }

}  // namespace trainctl::trainer
