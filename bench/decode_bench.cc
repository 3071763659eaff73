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
//
// With --model_dir (an HF checkpoint directory) it measures that model alone, as the GPU check's
// peer comparison does (scripts/gpu/hf_peers.py decode): greedy decoding of --new_tokens tokens
// (no eos) for each batch size in --batches, the prompts read from --prompts (a JSON list of id
// lists, the same ones the peer decodes) or random; figures and tokens to --json.
#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "worker/trainer/model/generation.h"
#include "worker/trainer/model/host_runtime.h"
#include "worker/trainer/model/qwen2vl.h"
#include "worker/trainer/model/qwen2vl_config.h"
#include "worker/trainer/model/state_dict_adapter.h"

ABSL_FLAG(int, batch, 4, "prompts per generation");
ABSL_FLAG(int, prompt, 64, "tokens per prompt");
ABSL_FLAG(int, new_tokens, 32, "tokens generated per prompt");
ABSL_FLAG(int, threads, 0, "LibTorch intra-op threads (0: LibTorch's default)");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda");
ABSL_FLAG(std::string, model_dir, "", "an HF checkpoint directory to measure alone");
ABSL_FLAG(std::string, dtype, "float32", "with --model_dir: float32 or bfloat16");
ABSL_FLAG(std::string, batches, "1,16,64", "with --model_dir: batch sizes to measure");
ABSL_FLAG(std::string, prompts, "", "with --model_dir: JSON file of prompts (lists of ids)");
ABSL_FLAG(std::string, json, "", "with --model_dir: write the figures and tokens here");
ABSL_FLAG(bool, cuda_graph, true, "CUDA: replay decoding steps as a CUDA graph");

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

// --model_dir: one checkpoint, several batch sizes, greedy with no eos. Returns the exit code.
int BenchCheckpoint(const torch::Device& device) {
  const std::string dtype_name = absl::GetFlag(FLAGS_dtype);
  const torch::ScalarType dtype =
      dtype_name == "bfloat16" || dtype_name == "bf16" ? torch::kBFloat16 : torch::kFloat32;
  auto loaded = trainctl::model::LoadHfModel(absl::GetFlag(FLAGS_model_dir), dtype);
  if (!loaded.ok()) {
    std::cerr << "decode_bench: " << loaded.status() << "\n";
    return 1;
  }
  Qwen2VLForConditionalGeneration& model = **loaded;
  model.to(device);
  model.eval();
  const int64_t steps = absl::GetFlag(FLAGS_new_tokens);
  std::vector<std::vector<int64_t>> prompts;
  if (const std::string path = absl::GetFlag(FLAGS_prompts); !path.empty()) {
    std::ifstream in(path);
    prompts = nlohmann::json::parse(in).get<std::vector<std::vector<int64_t>>>();
  } else {
    torch::manual_seed(0);
    for (int i = 0; i < 64; ++i) {
      const torch::Tensor row =
          torch::randint(0, 1000, {absl::GetFlag(FLAGS_prompt)}, torch::kInt64);
      prompts.emplace_back(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel());
    }
  }
  nlohmann::json rows = nlohmann::json::array();
  for (const absl::string_view b : absl::StrSplit(absl::GetFlag(FLAGS_batches), ',')) {
    int64_t batch = 0;
    if (!absl::SimpleAtoi(b, &batch) || batch <= 0) {
      std::cerr << "decode_bench: --batches: not a batch size: " << b << "\n";
      return 1;
    }
    std::vector<std::vector<int64_t>> rows_in;
    for (int64_t r = 0; r < batch; ++r) rows_in.push_back(prompts[r % prompts.size()]);
    auto padded = trainctl::model::LeftPadPrompts(rows_in);
    if (!padded.ok()) {
      std::cerr << "decode_bench: " << padded.status() << "\n";
      return 1;
    }
    padded->input_ids = padded->input_ids.to(device);
    padded->attention_mask = padded->attention_mask.to(device);
    trainctl::model::GenerationOptions options;
    options.temperature = 0;
    options.cuda_graph = absl::GetFlag(FLAGS_cuda_graph);
    options.max_new_tokens = 4;
    (void)trainctl::model::Generate(model, *padded, options);  // warm-up
    options.max_new_tokens = steps;
    Sync(device);
    const auto start = Clock::now();
    auto out = trainctl::model::Generate(model, *padded, options);
    Sync(device);
    const double seconds = Seconds(start);
    if (!out.ok()) {
      std::cerr << "decode_bench: " << out.status() << "\n";
      return 1;
    }
    const double tokens_per_s = static_cast<double>(out->new_tokens) / seconds;
    std::cout << absl::StrFormat(
        "batch %3d: %d new tokens per row in %.3f s (prefill %.3f s) -> %.0f tokens/s\n", batch,
        steps, seconds, out->prefill_seconds, tokens_per_s);
    rows.push_back({{"batch", batch},
                    {"new_tokens", steps},
                    {"seconds", seconds},
                    {"prefill_seconds", out->prefill_seconds},
                    {"tokens_per_s", tokens_per_s},
                    {"tokens", out->tokens}});
  }
  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    std::ofstream(path) << nlohmann::json{{"dtype", dtype_name},
                                          {"cuda_graph", absl::GetFlag(FLAGS_cuda_graph)},
                                          {"rows", rows}}
                               .dump()
                        << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_threads) > 0)
    trainctl::model::SetCpuThreads(absl::GetFlag(FLAGS_threads));
  const torch::Device device(absl::GetFlag(FLAGS_device));
  if (!absl::GetFlag(FLAGS_model_dir).empty()) return BenchCheckpoint(device);
  std::cout << absl::StrFormat("threads: %d, dtype float32\n\n", torch::get_num_threads());

  auto tiny_path = trainctl::model::FindModelConfig("tiny");
  auto tiny = tiny_path.ok() ? trainctl::model::LoadQwen2VLConfig(*tiny_path)
                             : absl::StatusOr<Qwen2VLConfig>(tiny_path.status());
  auto medium_path = trainctl::model::FindModelConfig("bench-30m");  // configs/models
  absl::StatusOr<Qwen2VLConfig> medium = medium_path.ok()
                                             ? trainctl::model::LoadQwen2VLConfig(*medium_path)
                                             : absl::StatusOr<Qwen2VLConfig>(medium_path.status());
  if (!tiny.ok() || !medium.ok()) {
    std::cerr << "decode_bench: " << (tiny.ok() ? medium.status() : tiny.status()) << "\n";
    return 1;
  }
  Bench("tiny", *tiny, device);
  Bench("30M", *medium, device);
  return 0;
}
