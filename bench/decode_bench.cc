// decode_bench: greedy decoding throughput with the KV cache (model/generation.h) against full
// recompute (one full forward over prompt + tokens so far per new token, argmax of the last
// position), same model, same prompts, same run. Two configs: the tiny registry config and a
// ~30M-parameter one (configs/models/bench-30m).
//
// Per config it prints, for --batch rows of --prompt random tokens and --new_tokens new ones:
//   KV cache: prefill seconds, decode seconds, decode tokens/s (batch * decode steps / seconds)
//   recompute: seconds for the same tokens, tokens/s
//   ratio: recompute seconds / KV-cache seconds for the whole generation (prefill included)
// and checks that both produce the same tokens.
#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "worker/trainer/model/generation.h"
#include "worker/trainer/model/qwen2vl.h"
#include "worker/trainer/model/qwen2vl_config.h"

ABSL_FLAG(int, batch, 4, "prompts per generation");
ABSL_FLAG(int, prompt, 64, "tokens per prompt");
ABSL_FLAG(int, new_tokens, 32, "tokens generated per prompt");
ABSL_FLAG(int, threads, 0, "LibTorch intra-op threads (0: LibTorch's default)");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda");

namespace {

using Clock = std::chrono::steady_clock;
using trainctl::model::Qwen2VLConfig;
using trainctl::model::Qwen2VLForConditionalGeneration;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

void Sync(const torch::Device& device) {
  // A tiny device-to-host copy waits for the queued kernels (no CUDA header needed).
  if (device.is_cuda()) torch::zeros({1}, torch::TensorOptions().device(device)).item<float>();
}

// Greedy by full recompute: [B, new] tokens.
torch::Tensor Recompute(Qwen2VLForConditionalGeneration& model, torch::Tensor ids, int64_t steps) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> out;
  for (int64_t s = 0; s < steps; ++s) {
    trainctl::model::ModelInputs in;
    in.input_ids = ids;
    const torch::Tensor hidden = model.ForwardHidden(in);
    const torch::Tensor next =
        model.Head(hidden.narrow(1, ids.size(1) - 1, 1)).squeeze(1).argmax(-1).view({-1, 1});
    out.push_back(next);
    ids = torch::cat({ids, next}, 1);
  }
  return torch::cat(out, 1).to(torch::kCPU);
}

void Bench(const std::string& name, const Qwen2VLConfig& config, const torch::Device& device) {
  const int64_t batch = absl::GetFlag(FLAGS_batch);
  const int64_t prompt = absl::GetFlag(FLAGS_prompt);
  const int64_t steps = absl::GetFlag(FLAGS_new_tokens);
  torch::manual_seed(0);
  auto model = std::make_shared<Qwen2VLForConditionalGeneration>(config);
  model->to(device);
  model->eval();
  int64_t params = 0;
  for (const auto& p : model->parameters()) params += p.numel();
  // Token ids below 1000 are ordinary text in the Qwen vocabulary and in the 32k one.
  const torch::Tensor ids = torch::randint(0, 1000, {batch, prompt}, torch::kInt64).to(device);

  trainctl::model::GenerationOptions options;
  options.max_new_tokens = steps;
  options.temperature = 0;
  trainctl::model::ModelInputs prompts;
  prompts.input_ids = ids;
  // Warm-up of both paths (allocator, kernels), then the measured runs.
  (void)trainctl::model::Generate(*model, prompts, options);
  (void)Recompute(*model, ids, 2);

  Sync(device);
  auto start = Clock::now();
  auto cached = trainctl::model::Generate(*model, prompts, options);
  Sync(device);
  const double cached_seconds = Seconds(start);
  if (!cached.ok()) {
    std::cerr << "decode_bench: " << cached.status() << "\n";
    return;
  }
  start = Clock::now();
  const torch::Tensor full = Recompute(*model, ids, steps);
  Sync(device);
  const double full_seconds = Seconds(start);

  bool same = full.size(1) == steps;
  for (int64_t b = 0; same && b < batch; ++b) {
    const auto& row = cached->tokens[static_cast<size_t>(b)];
    same = static_cast<int64_t>(row.size()) == steps &&
           torch::equal(full[b], torch::tensor(row, torch::kInt64));
  }
  const double tokens = static_cast<double>(batch * steps);
  std::cout << absl::StrFormat("%s: %.2fM params, batch %d, prompt %d, %d new tokens, %s\n", name,
                               params / 1e6, batch, prompt, steps, device.str());
  std::cout << absl::StrFormat(
      "  KV cache : %.3f s total (prefill %.3f s, %d decode steps %.3f s) -> %.0f tokens/s, "
      "decode only %.0f tokens/s\n",
      cached_seconds, cached->prefill_seconds, cached->decode_steps, cached->decode_seconds,
      tokens / cached_seconds,
      cached->decode_steps > 0 ? batch * cached->decode_steps / cached->decode_seconds : 0.0);
  std::cout << absl::StrFormat("  recompute: %.3f s total -> %.0f tokens/s\n", full_seconds,
                               tokens / full_seconds);
  std::cout << absl::StrFormat("  ratio (recompute / KV cache time) = %.2fx; same tokens: %s\n\n",
                               full_seconds / cached_seconds, same ? "yes" : "NO");
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_threads) > 0) torch::set_num_threads(absl::GetFlag(FLAGS_threads));
  const torch::Device device(absl::GetFlag(FLAGS_device));
  std::cout << absl::StrFormat("threads: %d, dtype float32\n\n", torch::get_num_threads());

  auto tiny_path = trainctl::model::FindModelConfig("tiny");
  auto tiny = tiny_path.ok() ? trainctl::model::LoadQwen2VLConfig(*tiny_path)
                             : absl::StatusOr<Qwen2VLConfig>(tiny_path.status());
  auto medium_path = trainctl::model::FindModelConfig("bench-30m");  // configs/models
  absl::StatusOr<Qwen2VLConfig> medium =
      medium_path.ok() ? trainctl::model::LoadQwen2VLConfig(*medium_path) : absl::StatusOr<Qwen2VLConfig>(medium_path.status());
  if (!tiny.ok() || !medium.ok()) {
    std::cerr << "decode_bench: " << (tiny.ok() ? medium.status() : tiny.status()) << "\n";
    return 1;
  }
  Bench("tiny", *tiny, device);
  Bench("30M", *medium, device);
  return 0;
}
