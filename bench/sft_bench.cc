// sft_bench: SFT step throughput of a ~30M-parameter Qwen2-VL config (built in code) on CPU, fp32,
// and its model-FLOPs utilisation against the GEMM peak measured in the same run: LibTorch matmul
// of the model's own shapes, same dtype, same thread count, before and after the steps.
//
// One step = ForwardHidden + Head + mean cross-entropy over every next-token position + backward
// + AdamW, on text-only batches of --batch x --seq random ids.
//
// Model FLOPs per step (PaLM, appendix B, without the causal halving):
//   6 * N * tokens + 12 * L * H * T^2 * B
// N = matmul parameters: the decoder layers (non-embedding) plus the output head (vocab x H,
// tied to the embedding, which is otherwise a lookup and not counted); L layers, H hidden width,
// T sequence length, B batch, tokens = B * T.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "worker/trainer/model/host_runtime.h"
#include "worker/trainer/model/qwen2vl.h"
#include "worker/trainer/model/qwen2vl_config.h"

ABSL_FLAG(int, batch, 4, "sequences per step");
ABSL_FLAG(int, seq, 256, "tokens per sequence");
ABSL_FLAG(int, warmup, 1, "unmeasured steps");
ABSL_FLAG(int, steps, 3, "measured steps");
ABSL_FLAG(int, threads, 0, "LibTorch intra-op threads (0: LibTorch's default)");

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

struct GemmShape {
  std::string name;
  int64_t m, k, n;
};

// FLOP/s of [m, k] x [k, n] fp32 matmuls, best of several timed batches of calls.
double GemmFlops(const GemmShape& s) {
  torch::NoGradGuard no_grad;
  auto a = torch::randn({s.m, s.k});
  auto b = torch::randn({s.k, s.n});
  auto c = torch::matmul(a, b);  // warm-up
  const double flop = 2.0 * s.m * s.k * s.n;
  int calls = 1;
  {  // calls per batch: ~0.1 s
    const auto start = Clock::now();
    c = torch::matmul(a, b);
    calls = std::max(1, static_cast<int>(0.1 / std::max(Seconds(start), 1e-6)));
  }
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto start = Clock::now();
    for (int i = 0; i < calls; ++i) c = torch::matmul(a, b);
    best = std::max(best, flop * calls / Seconds(start));
  }
  return best;
}

int64_t Count(const std::vector<torch::Tensor>& params) {
  int64_t n = 0;
  for (const auto& p : params) n += p.numel();
  return n;
}

// configs/models/bench-30m: ~30M parameters, hidden 512, 6 layers, 8 heads (4 kv), MLP 1024,
// vocab 32000, tied; a minimal vision tower, unused by text-only batches.
absl::StatusOr<trainctl::model::Qwen2VLConfig> LoadBenchConfig() {
  auto path = trainctl::model::FindModelConfig("bench-30m");
  return path.ok() ? trainctl::model::LoadQwen2VLConfig(*path)
                   : absl::StatusOr<trainctl::model::Qwen2VLConfig>(path.status());
}

// The model's parameter counts and FLOPs per step of --batch x --seq tokens (the header's N).
struct ModelFlops {
  int64_t total = 0, vision = 0, embedding = 0, non_embedding = 0, matmul_params = 0;
  int64_t tokens = 0;
  double flop_per_step = 0;
};

ModelFlops CountFlops(trainctl::model::Qwen2VLForConditionalGeneration& model,
                      const trainctl::model::Qwen2VLConfig& config, int64_t B, int64_t T) {
  const int64_t H = config.hidden_size;
  const int64_t L = config.num_hidden_layers;
  const int64_t V = config.vocab_size;
  ModelFlops f;
  f.total = Count(model.parameters());
  f.vision = Count(model.visual->parameters());
  f.embedding = V * H;
  f.non_embedding = f.total - f.vision - f.embedding;  // decoder layers + final norm
  f.matmul_params = f.non_embedding + V * H;           // + the tied output head
  f.tokens = B * T;
  f.flop_per_step =
      6.0 * f.matmul_params * f.tokens + 12.0 * L * H * static_cast<double>(T) * T * B;
  return f;
}

// The model, parameter, FLOPs and threads lines.
void PrintModel(const trainctl::model::Qwen2VLConfig& config, const ModelFlops& f, int64_t B,
                int64_t T) {
  std::cout << absl::StrFormat(
      "model: hidden %d, %d layers, %d heads (%d kv), MLP %d, vocab %d, tied embeddings\n",
      config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
      config.num_key_value_heads, config.intermediate_size, config.vocab_size);
  std::cout << absl::StrFormat(
      "params: %.2fM total = %.2fM embedding + %.2fM non-embedding + %.3fM vision tower (unused)\n",
      f.total / 1e6, f.embedding / 1e6, f.non_embedding / 1e6, f.vision / 1e6);
  std::cout << absl::StrFormat(
      "FLOPs/step = 6 * N * tokens + 12 * L * H * T^2 * B, N = %.2fM (non-embedding + head), "
      "tokens = %d x %d = %d -> %.1f GFLOP\n",
      f.matmul_params / 1e6, B, T, f.tokens, f.flop_per_step / 1e9);
  std::cout << absl::StrFormat("threads: %d, dtype float32\n\n", torch::get_num_threads());
}

// The model's own matmul shapes at `tokens` rows.
std::vector<GemmShape> ModelShapes(const trainctl::model::Qwen2VLConfig& config, int64_t tokens) {
  const int64_t H = config.hidden_size;
  const int64_t V = config.vocab_size;
  const int64_t I = config.intermediate_size;
  const int64_t kv = config.num_key_value_heads * config.head_dim();
  return {
      {"[BT,H]x[H,I] (MLP up/gate)", tokens, H, I}, {"[BT,I]x[I,H] (MLP down)", tokens, I, H},
      {"[BT,H]x[H,H] (q/o proj)", tokens, H, H},    {"[BT,H]x[H,kv] (k/v proj)", tokens, H, kv},
      {"[BT,H]x[H,V] (head)", tokens, H, V},
  };
}

// The measured steps' seconds (sorted) and the last one's loss.
struct StepTimes {
  std::vector<double> seconds;
  double loss = 0;
};

// `warmup` unmeasured then `steps` timed SFT steps (fwd + bwd + AdamW) on fresh random batches.
StepTimes TimeSteps(const std::shared_ptr<trainctl::model::Qwen2VLForConditionalGeneration>& model,
                    int64_t V, int64_t H, int64_t B, int64_t T, int warmup, int steps) {
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-4));
  auto step = [&]() {
    auto ids = torch::randint(0, V, {B, T}, torch::kLong);
    trainctl::model::ModelInputs in;
    in.input_ids = ids;
    in.attention_mask = torch::ones({B, T}, torch::kLong);
    auto hidden = model->ForwardHidden(in);
    auto logits = model->Head(hidden.slice(1, 0, T - 1).reshape({-1, H}));
    auto loss = torch::nn::functional::cross_entropy(logits, ids.slice(1, 1, T).reshape({-1}));
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
    return loss.item<double>();
  };
  for (int i = 0; i < warmup; ++i) step();
  StepTimes times;
  for (int i = 0; i < steps; ++i) {
    const auto start = Clock::now();
    times.loss = step();
    times.seconds.push_back(Seconds(start));
  }
  std::sort(times.seconds.begin(), times.seconds.end());
  return times;
}

// The GEMM table (before and after the steps), the step row, the loss and the MFU.
void PrintResults(const std::vector<GemmShape>& shapes, const std::vector<double>& before,
                  const std::vector<double>& after, const StepTimes& times, const ModelFlops& f,
                  int64_t V) {
  const std::vector<double>& step_seconds = times.seconds;
  const double median = step_seconds[step_seconds.size() / 2];
  const double achieved = f.flop_per_step / median;
  double peak = 0;
  std::cout << absl::StrFormat("%-30s %10s %14s %14s\n", "GEMM (fp32, same threads)", "M x K x N",
                               "GFLOP/s before", "GFLOP/s after");
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto& s = shapes[i];
    peak = std::max({peak, before[i], after[i]});
    std::cout << absl::StrFormat("%-30s %10s %14.1f %14.1f\n", s.name,
                                 absl::StrFormat("%dx%dx%d", s.m, s.k, s.n), before[i] / 1e9,
                                 after[i] / 1e9);
  }
  std::cout << absl::StrFormat("\n%-30s %10s %14s %14s\n", "SFT step (fwd+bwd+AdamW)", "s/step",
                               "tokens/s", "GFLOP/s");
  std::cout << absl::StrFormat(
      "%-30s %10.3f %14.0f %14.1f\n",
      absl::StrFormat("median of %d (min %.3f, max %.3f)", step_seconds.size(),
                      step_seconds.front(), step_seconds.back()),
      median, f.tokens / median, achieved / 1e9);
  std::cout << absl::StrFormat("last loss %.3f (ln V = %.3f)\n", times.loss, std::log(double(V)));
  std::cout << absl::StrFormat("\nMFU = achieved / GEMM peak = %.1f / %.1f GFLOP/s = %.1f%%\n",
                               achieved / 1e9, peak / 1e9, 100.0 * achieved / peak);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_threads) > 0)
    trainctl::model::SetCpuThreads(absl::GetFlag(FLAGS_threads));
  const int64_t B = absl::GetFlag(FLAGS_batch);
  const int64_t T = absl::GetFlag(FLAGS_seq);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const int steps = std::max(1, absl::GetFlag(FLAGS_steps));
  torch::manual_seed(0);

  absl::StatusOr<trainctl::model::Qwen2VLConfig> config = LoadBenchConfig();
  if (!config.ok()) {
    std::cerr << "sft_bench: " << config.status() << "\n";
    return 1;
  }
  auto model = std::make_shared<trainctl::model::Qwen2VLForConditionalGeneration>(*config);
  model->InitWeights();
  model->train();
  const ModelFlops flops = CountFlops(*model, *config, B, T);
  PrintModel(*config, flops, B, T);

  // The GEMM peak is measured before and after the steps, with the same threads.
  const std::vector<GemmShape> shapes = ModelShapes(*config, flops.tokens);
  std::vector<double> before, after;
  for (const auto& s : shapes) before.push_back(GemmFlops(s));
  const StepTimes times =
      TimeSteps(model, config->vocab_size, config->hidden_size, B, T, warmup, steps);
  for (const auto& s : shapes) after.push_back(GemmFlops(s));
  PrintResults(shapes, before, after, times, flops, config->vocab_size);
  return 0;
}
