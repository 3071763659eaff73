// grpo_bench: where one GRPO step's time goes, in one process with the trainer's own pieces: the
// KV-cached generator samples num_generations completions of each prompt (generation), the rule
// rewards score them and advantages are normalised per group (scoring), then the policy's
// log-probabilities with grad, the clipped loss and a ZeRO engine step (training); with
// --beta > 0 a frozen reference engine adds its log-probabilities (scoring).
//
// It prints each phase's seconds and share, generation tokens/s, and the same tokens' forward
// throughput (one no-grad forward over prompt + completion, as the reference pays) with the ratio
// between them: how much slower token-by-token sampling is than scoring the same tokens at once.
// It also runs plain greedy decoding of the same prompts and batch (generation / plain decode is
// the ratio), and times one step's sampling alone at the batch's [rows, vocab] on both
// sampling paths (internal/sampling.h), and the scoring pass (the policy's no-grad completion
// log-probabilities) over the same rows padded and packed padding-free (training.packing, rows of
// --pack_length). Configs (--configs): the tiny registry model and
// configs/models/bench-30m; random prompts, random weights (the tokens are random too, so rewards
// are computed on the decoded ids' text form). --eos_ids makes rows finish at different lengths.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "worker/trainer/model/generation.h"
#include "worker/trainer/model/host_runtime.h"
#include "worker/trainer/model/internal/sampling.h"
#include "worker/trainer/model/qwen2vl_config.h"
#include "worker/trainer/rewards/rule_rewards.h"
#include "worker/trainer/stages/grpo_loss.h"
#include "worker/trainer/stages/internal/grpo_rows.h"
#include "worker/trainer/zero/comm.h"
#include "worker/trainer/zero/engine.h"

ABSL_FLAG(int, prompts, 2, "prompts per step");
ABSL_FLAG(int, num_generations, 8, "completions per prompt");
ABSL_FLAG(int, prompt, 64, "tokens per prompt");
ABSL_FLAG(int, completion, 32, "max_completion_length");
ABSL_FLAG(int, steps, 4,
          "steps measured (after one warm-up step); even, so that plain decoding runs as often "
          "before generation as after it");
ABSL_FLAG(double, beta, 0.04, "KL coefficient; > 0 adds a frozen reference model");
ABSL_FLAG(int, threads, 0, "LibTorch intra-op threads (0: LibTorch's default)");
ABSL_FLAG(std::string, configs, "tiny,bench-30m", "registry configs to run, comma-separated");
ABSL_FLAG(int, eos_ids, 0,
          "treat this many random vocabulary ids as eos in generation and plain decoding, so "
          "rows finish at different lengths as real rollouts do (0: every row runs to the end)");
ABSL_FLAG(bool, compact, true, "rows that finished leave the decoding batch (CPU)");
ABSL_FLAG(int, sampling_reps, 20,
          "time the sampling of one step alone ([rows, vocab] random logits) this many times per "
          "path; 0 skips it");
ABSL_FLAG(bool, sampling_only, false, "time the sampling alone, not the GRPO step");
ABSL_FLAG(int, pack_length, 1024,
          "training.max_seq_length for the packed scoring pass (rows of at most this many tokens)");

namespace {

using Clock = std::chrono::steady_clock;
using trainctl::model::Qwen2VLConfig;
namespace model = trainctl::model;
namespace trainer = trainctl::trainer;
namespace zero = trainctl::zero;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

struct Split {
  double generation = 0, scoring = 0, training = 0, forward = 0, plain_decode = 0;
  int64_t new_tokens = 0, scored_tokens = 0, plain_tokens = 0;
  // The scoring pass padded and packed: seconds, positions computed ([rows, T] each) and the
  // largest difference of their log-probabilities on completion tokens.
  double score_padded = 0, score_packed = 0, score_max_diff = 0;
  int64_t padded_positions = 0, packed_positions = 0;
};

// The policy's no-grad completion log-probabilities of the step's rows, padded (MakeTrainInputs)
// and packed (MakePackedTrainInputs), building the inputs included; padded first on odd steps,
// packed first on even ones.
void ScoringPaddedVsPacked(zero::Engine& policy, const torch::Tensor& prompts,
                           const model::GenerationOutput& out, int step, Split* split) {
  namespace internal = trainer::internal;
  std::vector<internal::GrpoRow> rows(out.tokens.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    const torch::Tensor p = prompts[static_cast<int64_t>(r)].contiguous();
    rows[r].prompt.assign(p.data_ptr<int64_t>(), p.data_ptr<int64_t>() + p.numel());
    rows[r].completion = out.tokens[r];
  }
  const int64_t n = static_cast<int64_t>(rows.size());
  torch::NoGradGuard no_grad;
  torch::Tensor padded, packed, mask;
  const auto run = [&](bool pack) {
    const Clock::time_point start = Clock::now();
    const internal::TrainInputs in =
        pack ? internal::MakePackedTrainInputs(rows, 0, n, 0, false,
                                               absl::GetFlag(FLAGS_pack_length), torch::kCPU)
             : internal::MakeTrainInputs(rows, 0, n, 0, false, torch::kCPU);
    (pack ? packed : padded) = internal::TrainLogProbs(policy.model(), in);
    (pack ? split->score_packed : split->score_padded) = Seconds(start);
    (pack ? split->packed_positions : split->padded_positions) = in.inputs.input_ids.numel();
    mask = in.completion_mask;
  };
  run(step % 2 == 0);
  run(step % 2 != 0);
  split->score_max_diff = (padded - packed).abs().mul(mask).max().item<double>();
}

// Prompt block (left-padded; all prompts have one length here) + right-padded completions.
model::ModelInputs Joined(const torch::Tensor& prompts, const model::GenerationOutput& out,
                          int64_t pad, torch::Tensor* mask) {
  const int64_t rows = prompts.size(0), p = prompts.size(1);
  int64_t c = 1;
  for (const auto& t : out.tokens) c = std::max<int64_t>(c, static_cast<int64_t>(t.size()));
  torch::Tensor ids = torch::full({rows, p + c}, pad, torch::kInt64);
  torch::Tensor attention = torch::zeros({rows, p + c}, torch::kInt64);
  *mask = torch::zeros({rows, c}, torch::kFloat32);
  ids.slice(1, 0, p).copy_(prompts);
  attention.slice(1, 0, p).fill_(1);
  for (int64_t r = 0; r < rows; ++r) {
    const auto& t = out.tokens[static_cast<size_t>(r)];
    const int64_t n = static_cast<int64_t>(t.size());
    if (n == 0) continue;
    ids[r].slice(0, p, p + n).copy_(torch::tensor(t, torch::kInt64));
    attention[r].slice(0, p, p + n).fill_(1);
    (*mask)[r].slice(0, 0, n).fill_(1);
  }
  model::ModelInputs in;
  in.input_ids = ids;
  in.attention_mask = attention;
  return in;
}

// --eos_ids ids spread over the vocabulary (the same every step).
std::vector<int64_t> EosIds(const Qwen2VLConfig& config) {
  std::vector<int64_t> ids;
  const int64_t n = absl::GetFlag(FLAGS_eos_ids);
  for (int64_t i = 0; i < n; ++i) ids.push_back((i * 7919 + 13) % config.vocab_size);
  return ids;
}

// One step's sampling alone, at the generation batch's shape: argmax (greedy), the tensor-op
// path (what CUDA runs, and what the CPU ran before) and the CPU path, without filters and with
// temperature 0.9, top-k 50, top-p 0.95. Milliseconds per call.
void SamplingAlone(int64_t rows, int64_t vocab) {
  const int reps = absl::GetFlag(FLAGS_sampling_reps);
  if (reps <= 0) return;
  torch::manual_seed(0);
  const torch::Tensor logits = torch::randn({rows, vocab}) * 2;
  const torch::Tensor u = torch::rand({rows}, torch::kFloat64);
  const auto time = [&](const std::function<void()>& fn) {
    fn();
    const Clock::time_point start = Clock::now();
    for (int i = 0; i < reps; ++i) fn();
    return 1e3 * Seconds(start) / reps;
  };
  const double argmax = time([&] { (void)logits.argmax(-1).to(torch::kInt64); });
  std::cout << absl::StrFormat("  sampling alone at [%d, %d]: argmax %.2f ms\n", rows, vocab,
                               argmax);
  for (const model::internal::SamplingFilters f :
       {model::internal::SamplingFilters{1.0, 0, 1.0},
        model::internal::SamplingFilters{0.9, 50, 0.95}}) {
    const double device = time([&] { (void)model::internal::SampleTokensOnDevice(logits, f, u); });
    model::internal::CpuSamplingBuffers buffers;  // as Generate keeps them across steps
    const double cpu =
        time([&] { (void)model::internal::SampleTokensOnCpu(logits, f, u, &buffers); });
    std::cout << absl::StrFormat(
        "    temperature %g, top_k %d, top_p %g: tensor-op path %.2f ms, CPU path %.2f ms\n",
        f.temperature, f.top_k, f.top_p, device, cpu);
  }
}

// Generation: num_generations sampled completions of each prompt, timed; its peer, plain greedy
// decoding of the same prompts, the same number of new tokens per row (what decode_bench
// measures), same model, same batch, runs just before generation on odd steps and just after it on
// even ones, so that neither always inherits the allocator's state from the phase before (scoring's
// or training's large tensors).
model::GenerationOutput GenerationPhase(zero::Engine& policy, const Qwen2VLConfig& config,
                                        const torch::Tensor& prompts, int step, Split* split) {
  const int64_t rows = prompts.size(0);
  model::GenerationOptions g;
  g.max_new_tokens = absl::GetFlag(FLAGS_completion);
  g.temperature = 1.0;
  g.eos_token_ids = EosIds(config);
  g.compact_finished_rows = absl::GetFlag(FLAGS_compact);
  for (int64_t r = 0; r < rows; ++r) g.row_seeds.push_back(static_cast<uint64_t>(step * 1000 + r));
  model::ModelInputs in;
  in.input_ids = prompts;
  const auto plain_decode = [&] {
    model::GenerationOptions greedy;
    greedy.max_new_tokens = g.max_new_tokens;
    greedy.temperature = 0;
    greedy.eos_token_ids = g.eos_token_ids;
    greedy.compact_finished_rows = g.compact_finished_rows;
    const Clock::time_point start = Clock::now();
    auto plain = model::Generate(policy.model(), in, greedy);
    split->plain_decode = Seconds(start);
    split->plain_tokens = plain.ok() ? plain->new_tokens : 0;
  };
  if (step % 2 == 1) plain_decode();
  const Clock::time_point start = Clock::now();
  auto out = model::Generate(policy.model(), in, g);
  if (!out.ok()) {
    std::cerr << "grpo_bench: " << out.status() << "\n";
    std::exit(1);
  }
  split->generation = Seconds(start);
  split->new_tokens = out->new_tokens;
  if (step % 2 == 0) plain_decode();
  return *std::move(out);
}

// What scoring hands to training: advantages, the joined rows and their completion mask, and the
// reference's log-probabilities (undefined without one).
struct Scored {
  absl::StatusOr<trainer::Advantages> adv;
  torch::Tensor mask;
  model::ModelInputs joined;
  torch::Tensor ref;
};

// Scoring, timed: rule rewards of the decoded ids' text, advantages normalised per group, the
// prompt + completion rows joined, and the frozen reference's log-probabilities.
Scored ScoringPhase(zero::Engine* reference, const torch::Tensor& prompts,
                    const model::GenerationOutput& out, int64_t group, Split* split) {
  Scored s;
  const Clock::time_point start = Clock::now();
  std::vector<double> rewards;
  for (const auto& t : out.tokens) {
    const std::string text = absl::StrCat("<answer>", absl::StrJoin(t, " "), "</answer>");
    rewards.push_back(trainctl::rewards::AccuracyReward(text, "<answer>7</answer>") +
                      trainctl::rewards::FormatReward(text, ""));
  }
  s.adv = trainer::ComputeAdvantages(torch::tensor(rewards, torch::kFloat64), group,
                                     trainer::ScaleRewards::kGroup);
  s.joined = Joined(prompts, out, 0, &s.mask);
  const int64_t p = prompts.size(1);
  if (reference != nullptr) {
    torch::NoGradGuard no_grad;
    s.ref = model::CompletionLogProbs(reference->model(), s.joined, p);
  }
  split->scoring = Seconds(start);
  return s;
}

// The same tokens through one no-grad forward, timed: what scoring them at once costs.
void ForwardPhase(zero::Engine& policy, const model::ModelInputs& joined, Split* split) {
  const Clock::time_point start = Clock::now();
  {
    torch::NoGradGuard no_grad;
    (void)policy.model().ForwardHidden(joined);
  }
  split->forward = Seconds(start);
  split->scored_tokens = joined.attention_mask.sum().item<int64_t>();
}

// Training, timed: the policy's log-probabilities with grad, the clipped loss and a ZeRO step.
void TrainingPhase(zero::Engine& policy, const Scored& scored, int64_t p, Split* split) {
  const Clock::time_point start = Clock::now();
  trainer::GrpoLossInputs li;
  li.per_token_logps = model::CompletionLogProbs(policy.model(), scored.joined, p);
  li.ref_per_token_logps = scored.ref;
  li.advantages = scored.adv->advantages;
  li.completion_mask = scored.mask;
  trainer::GrpoLossOptions lo;
  lo.beta = absl::GetFlag(FLAGS_beta);
  lo.max_completion_length = absl::GetFlag(FLAGS_completion);
  trainer::GrpoStepShape shape;
  shape.global_active_tokens = scored.mask.sum().item<double>();
  auto loss = trainer::GrpoLoss(li, lo, shape);
  if (!loss.ok() || !policy.Backward(loss->contribution).ok() || !policy.Step(1e-5).ok()) {
    std::cerr << "grpo_bench: the training step failed\n";
    std::exit(1);
  }
  split->training = Seconds(start);
}

// One GRPO step on --prompts random prompts (seeded by `step`), each repeated for its group.
Split Step(zero::Engine& policy, zero::Engine* reference, const Qwen2VLConfig& config, int step) {
  const int64_t group = absl::GetFlag(FLAGS_num_generations);
  Split split;
  torch::manual_seed(step);
  const torch::Tensor unique =
      torch::randint(1000, config.vocab_size - 1000,
                     {absl::GetFlag(FLAGS_prompts), absl::GetFlag(FLAGS_prompt)}, torch::kInt64);
  const torch::Tensor prompts = unique.repeat_interleave(group, 0);
  const model::GenerationOutput out = GenerationPhase(policy, config, prompts, step, &split);
  const Scored scored = ScoringPhase(reference, prompts, out, group, &split);
  ForwardPhase(policy, scored.joined, &split);
  ScoringPaddedVsPacked(policy, prompts, out, step, &split);
  TrainingPhase(policy, scored, prompts.size(1), &split);
  return split;
}

void Bench(const std::string& name, const Qwen2VLConfig& config) {
  if (absl::GetFlag(FLAGS_sampling_only)) {
    std::cout << name << ":\n";
    SamplingAlone(absl::GetFlag(FLAGS_prompts) * absl::GetFlag(FLAGS_num_generations),
                  config.vocab_size);
    return;
  }
  auto comm = zero::Comm::Create(zero::CommOptions{});
  zero::EngineOptions options;
  auto policy = zero::Engine::Create(config, options, comm->get(), /*seed=*/1);
  std::unique_ptr<zero::Engine> reference;
  if (absl::GetFlag(FLAGS_beta) > 0) {
    reference = std::move(*zero::Engine::CreateFrozen(config, options, comm->get(), 1));
  }
  (void)Step(**policy, reference.get(), config, 0);  // warm-up
  Split total;
  const int steps = absl::GetFlag(FLAGS_steps);
  for (int s = 1; s <= steps; ++s) {
    const Split one = Step(**policy, reference.get(), config, s);
    total.generation += one.generation;
    total.scoring += one.scoring;
    total.training += one.training;
    total.forward += one.forward;
    total.new_tokens += one.new_tokens;
    total.plain_decode += one.plain_decode;
    total.plain_tokens += one.plain_tokens;
    total.scored_tokens += one.scored_tokens;
    total.score_padded += one.score_padded;
    total.score_packed += one.score_packed;
    total.padded_positions += one.padded_positions;
    total.packed_positions += one.packed_positions;
    total.score_max_diff = std::max(total.score_max_diff, one.score_max_diff);
  }
  const double step = total.generation + total.scoring + total.training;
  std::cout << absl::StrFormat(
      "%s: %d prompts x %d generations, prompt %d, up to %d new tokens, beta %g, %d steps\n", name,
      absl::GetFlag(FLAGS_prompts), absl::GetFlag(FLAGS_num_generations),
      absl::GetFlag(FLAGS_prompt), absl::GetFlag(FLAGS_completion), absl::GetFlag(FLAGS_beta),
      steps);
  std::cout << absl::StrFormat(
      "  step %.3f s: generation %.3f s (%.0f%%), scoring %.3f s (%.0f%%), training %.3f s "
      "(%.0f%%)\n",
      step / steps, total.generation / steps, 100 * total.generation / step, total.scoring / steps,
      100 * total.scoring / step, total.training / steps, 100 * total.training / step);
  const double gen_rate = total.new_tokens / total.generation;
  const double fwd_rate = total.scored_tokens / total.forward;
  std::cout << absl::StrFormat(
      "  generation %.0f new tokens/s; one forward over the same prompt + completion tokens "
      "%.0f tokens/s; forward / generation = %.1fx\n",
      gen_rate, fwd_rate, fwd_rate / gen_rate);
  const double plain_rate = total.plain_tokens / total.plain_decode;
  std::cout << absl::StrFormat(
      "  plain greedy decode of the same prompts and batch %.0f tokens/s; generation / plain "
      "decode = %.2f (aim >= 0.8)\n",
      plain_rate, gen_rate / plain_rate);
  const double padded_rate = total.scored_tokens / total.score_padded;
  const double packed_rate = total.scored_tokens / total.score_packed;
  std::cout << absl::StrFormat(
      "  scoring pass (no-grad completion log-probs) padded %.0f tokens/s over %d positions, "
      "packed (rows of %d) %.0f tokens/s over %d positions; packed / padded = %.2fx; largest "
      "log-prob difference %.2g\n",
      padded_rate, total.padded_positions / steps, absl::GetFlag(FLAGS_pack_length), packed_rate,
      total.packed_positions / steps, packed_rate / padded_rate, total.score_max_diff);
  SamplingAlone(absl::GetFlag(FLAGS_prompts) * absl::GetFlag(FLAGS_num_generations),
                config.vocab_size);
  std::cout << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_threads) > 0)
    trainctl::model::SetCpuThreads(absl::GetFlag(FLAGS_threads));
  const std::vector<std::string> names =
      absl::StrSplit(absl::GetFlag(FLAGS_configs), ',', absl::SkipEmpty());
  for (const std::string& name : names) {
    auto path = model::FindModelConfig(name);
    absl::StatusOr<Qwen2VLConfig> config =
        path.ok() ? model::LoadQwen2VLConfig(*path) : absl::StatusOr<Qwen2VLConfig>(path.status());
    if (!config.ok()) {
      std::cerr << "grpo_bench: " << config.status() << "\n";
      return 1;
    }
    Bench(name, *config);
  }
  return 0;
}
